#include "moetron/parallel/communicator.h"

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "moetron/core/error.h"
#include "moetron/core/timer.h"

namespace moetron::parallel {

std::string_view collective_name(CollectiveKind kind) {
    switch (kind) {
        case CollectiveKind::all_reduce:
            return "all_reduce";
        case CollectiveKind::reduce_scatter:
            return "reduce_scatter";
        case CollectiveKind::all_gather:
            return "all_gather";
        case CollectiveKind::all_to_all:
            return "all_to_all_v";
        case CollectiveKind::broadcast:
            return "broadcast";
        case CollectiveKind::barrier:
            return "barrier";
        case CollectiveKind::send_recv:
            return "send_recv";
    }
    return "unknown";
}

CollectiveHandle::~CollectiveHandle() {
    finish_or_terminate();
}

double PendingCollective::completed_at_s() const {
    return Timer::now_s();
}

CollectiveHandle& CollectiveHandle::operator=(CollectiveHandle&& other) noexcept {
    if (this != &other) {
        finish_or_terminate();
        op_ = std::move(other.op_);
        completed_at_s_ = other.completed_at_s_;
    }
    return *this;
}

bool CollectiveHandle::test() {
    if (!op_) return true;
    if (!op_->test()) return false;
    completed_at_s_ = op_->completed_at_s();
    op_.reset();
    return true;
}

void CollectiveHandle::wait() {
    if (!op_) return;
    // Dropped before rethrowing: a timed-out collective is abandoned, the job is about to end,
    // and the destructor must not wait for it a second time.
    std::unique_ptr<PendingCollective> op = std::move(op_);
    op->wait();
    completed_at_s_ = op->completed_at_s();
}

void CollectiveHandle::finish_or_terminate() noexcept {
    if (!op_) return;
    if (std::uncaught_exceptions() > 0) {
        op_->abandon();
        op_.reset();
        return;
    }
    try {
        wait();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "moetron: a collective handle was dropped unfinished: %s\n", e.what());
        std::terminate();
    }
}

void Communicator::check_all_gather_sizes(size_t out_count, size_t inp_count) const {
    MT_CHECK(out_count == inp_count * static_cast<size_t>(size()),
             "[all_gather] group '{}': output holds {} elements, needs {} ({} ranks x {})", name(),
             out_count, inp_count * static_cast<size_t>(size()), size(), inp_count);
}

void check_reduction_dtype(const Communicator& comm, CollectiveKind kind, DType dtype) {
    MT_CHECK(dtype == DType::f32 || dtype == DType::f64,
             "[{}] group '{}': sums are supported for F32 and F64, not {}", collective_name(kind),
             comm.name(), dtype_name(dtype));
}

void check_all_to_all_args(const Communicator& comm, std::span<const int> recv_counts,
                           std::span<const int> recv_displs, std::span<const int> send_counts,
                           std::span<const int> send_displs) {
    const size_t n = static_cast<size_t>(comm.size());
    MT_CHECK(recv_counts.size() == n && recv_displs.size() == n && send_counts.size() == n &&
                 send_displs.size() == n,
             "[all_to_all_v] group '{}' has {} ranks but got {} recv counts, {} recv displs, {} "
             "send counts, {} send displs",
             comm.name(), n, recv_counts.size(), recv_displs.size(), send_counts.size(),
             send_displs.size());
    for (size_t p = 0; p < n; ++p) {
        MT_CHECK(recv_counts[p] >= 0 && send_counts[p] >= 0 && recv_displs[p] >= 0 &&
                     send_displs[p] >= 0,
                 "[all_to_all_v] group '{}': negative count or displacement for peer {}",
                 comm.name(), p);
    }
}

void check_root(const Communicator& comm, int root) {
    MT_CHECK(root >= 0 && root < comm.size(), "[broadcast] group '{}': root {} is not in [0, {})",
             comm.name(), root, comm.size());
}

void check_peer(const Communicator& comm, int peer, int tag) {
    MT_CHECK(peer >= 0 && peer < comm.size() && peer != comm.rank(),
             "[send_recv] group '{}' (rank {} of {}): peer {} is not another rank of the group",
             comm.name(), comm.rank(), comm.size(), peer);
    MT_CHECK(tag >= 0, "[send_recv] group '{}': tag must be >= 0, got {}", comm.name(), tag);
}

void check_host_stream(const Communicator& comm, CollectiveKind kind, Stream stream) {
    MT_CHECK(stream.device == Device::cpu && stream.native_handle == nullptr,
             "[{}] group '{}': a device stream was given, but this communicator moves host memory "
             "only (a NCCL communicator takes device streams)",
             collective_name(kind), comm.name());
}

void count_all_to_all(CollectiveCounters& counters, int self_rank, std::span<const int> send_counts,
                      DType dtype) {
    uint64_t total = 0, peers = 0;
    for (size_t p = 0; p < send_counts.size(); ++p) {
        const uint64_t bytes = static_cast<uint64_t>(send_counts[p]) * dtype_size_bytes(dtype);
        total += bytes;
        if (static_cast<int>(p) != self_rank) peers += bytes;
    }
    counters.calls += 1;
    counters.payload_bytes += total;
    counters.peer_bytes += peers;
}

int launched_process_count() {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
        const char* value = std::getenv(name);
        if (value != nullptr && std::atoi(value) > 1) return std::atoi(value);
    }
    return 1;
}

}  // namespace moetron::parallel
