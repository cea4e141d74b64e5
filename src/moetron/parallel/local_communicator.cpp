#include "moetron/parallel/local_communicator.h"

#include <cstring>

#include "moetron/core/error.h"

namespace moetron::parallel {

namespace {
// memmove, not memcpy: a caller may pass the same buffer as input and output.
void copy_elements(void* out, const void* inp, size_t count, DType dtype) {
    if (count == 0 || out == inp) return;
    std::memmove(out, inp, count * dtype_size_bytes(dtype));
}
}  // namespace

CollectiveHandle LocalCommunicator::all_reduce_sum_async(void*, size_t count, DType dtype,
                                                         Stream stream) {
    check_host_stream(*this, CollectiveKind::all_reduce, stream);
    check_reduction_dtype(*this, CollectiveKind::all_reduce, dtype);
    auto& c = counter(CollectiveKind::all_reduce);
    c.calls += 1;
    c.payload_bytes += count * dtype_size_bytes(dtype);
    return {};
}

CollectiveHandle LocalCommunicator::reduce_scatter_sum_async(void* out, const void* inp,
                                                             size_t count, DType dtype,
                                                             Stream stream) {
    check_host_stream(*this, CollectiveKind::reduce_scatter, stream);
    check_reduction_dtype(*this, CollectiveKind::reduce_scatter, dtype);
    copy_elements(out, inp, count, dtype);
    auto& c = counter(CollectiveKind::reduce_scatter);
    c.calls += 1;
    c.payload_bytes += count * dtype_size_bytes(dtype);
    return {};
}

CollectiveHandle LocalCommunicator::all_gather_async(void* out, const void* inp, size_t count,
                                                     DType dtype, Stream stream) {
    check_host_stream(*this, CollectiveKind::all_gather, stream);
    copy_elements(out, inp, count, dtype);
    auto& c = counter(CollectiveKind::all_gather);
    c.calls += 1;
    c.payload_bytes += count * dtype_size_bytes(dtype);
    return {};
}

CollectiveHandle LocalCommunicator::all_to_all_v_async(void* recv, std::span<const int> recv_counts,
                                                       std::span<const int> recv_displs,
                                                       const void* send,
                                                       std::span<const int> send_counts,
                                                       std::span<const int> send_displs,
                                                       DType dtype, Stream stream) {
    check_host_stream(*this, CollectiveKind::all_to_all, stream);
    check_all_to_all_args(*this, recv_counts, recv_displs, send_counts, send_displs);
    MT_CHECK(recv_counts[0] == send_counts[0],
             "[all_to_all_v] group '{}': rank 0 sends itself {} elements but expects {}", name_,
             send_counts[0], recv_counts[0]);
    const size_t elem = dtype_size_bytes(dtype);
    copy_elements(static_cast<char*>(recv) + static_cast<size_t>(recv_displs[0]) * elem,
                  static_cast<const char*>(send) + static_cast<size_t>(send_displs[0]) * elem,
                  static_cast<size_t>(send_counts[0]), dtype);
    count_all_to_all(counter(CollectiveKind::all_to_all), 0, send_counts, dtype);
    return {};
}

CollectiveHandle LocalCommunicator::broadcast_async(void*, size_t count, DType dtype, int root,
                                                    Stream stream) {
    check_host_stream(*this, CollectiveKind::broadcast, stream);
    check_root(*this, root);
    auto& c = counter(CollectiveKind::broadcast);
    c.calls += 1;
    c.payload_bytes += count * dtype_size_bytes(dtype);
    return {};
}

CollectiveHandle LocalCommunicator::barrier_async() {
    counter(CollectiveKind::barrier).calls += 1;
    return {};
}

CollectiveHandle LocalCommunicator::send_async(const void*, size_t, DType, int peer, int tag,
                                               Stream stream) {
    check_host_stream(*this, CollectiveKind::send_recv, stream);
    check_peer(*this, peer, tag);  // throws: no rank but this one
    return {};
}

CollectiveHandle LocalCommunicator::recv_async(void*, size_t, DType, int peer, int tag,
                                               Stream stream) {
    check_host_stream(*this, CollectiveKind::send_recv, stream);
    check_peer(*this, peer, tag);
    return {};
}

std::unique_ptr<Communicator> LocalCommunicator::split(int color, int, std::string name) {
    MT_CHECK(color >= 0, "[split] group '{}': color must be >= 0 to make group '{}', got {}", name_,
             name, color);
    return std::make_unique<LocalCommunicator>(std::move(name));
}

}  // namespace moetron::parallel
