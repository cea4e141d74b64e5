#include "moetron/parallel/tensor_parallel.h"

#include <algorithm>

#include "moetron/core/error.h"

namespace moetron::parallel {

TensorParallel::TensorParallel(Communicator* group, Backend& backend)
    : group_(group), backend_(&backend), stream_(backend.stream()) {
    if (group_ == nullptr) return;
    size_ = group_->size();
    rank_ = group_->rank();
}

void TensorParallel::sum_partial_input_grads(float* dx, int64_t count) const {
    if (enabled()) group_->all_reduce_sum(dx, static_cast<size_t>(count), DType::f32, stream_);
}

void TensorParallel::sum(double* x, int64_t count) const {
    if (enabled()) group_->all_reduce_sum(x, static_cast<size_t>(count), DType::f64, stream_);
}

int64_t TensorParallel::local_rows(int64_t num_rows) const {
    return row_share(num_rows, "tokens of the micro-batch (sequence parallelism)").count;
}

const float* TensorParallel::gather_rows(float* full, const float* rows, int64_t count) const {
    if (!enabled()) return rows;
    group_->all_gather(full, rows, static_cast<size_t>(count), DType::f32, stream_);
    return full;
}

void TensorParallel::reduce_scatter_rows(float* rows, const float* full, int64_t count) const {
    if (enabled()) {
        group_->reduce_scatter_sum(rows, full, static_cast<size_t>(count), DType::f32, stream_);
    } else if (rows != full) {
        backend_->copy(rows, full, static_cast<size_t>(count) * sizeof(float));
    }
}

void TensorParallel::sum_partial_param_grads(float* grad, int64_t count) const {
    if (enabled()) group_->all_reduce_sum(grad, static_cast<size_t>(count), DType::f32, stream_);
}

RowRange TensorParallel::row_share(int64_t num_rows, std::string_view what) const {
    MT_CHECK(num_rows % size_ == 0,
             "[tp] the {} {} do not split evenly over the {} ranks of tensor-parallel group '{}'",
             num_rows, what, size_, group_ != nullptr ? group_->name() : std::string("tp"));
    const int64_t count = num_rows / size_;
    return {rank_ * count, count};
}

void TensorParallel::all_gather(float* out, const float* shard, int64_t count) const {
    if (enabled()) {
        group_->all_gather(out, shard, static_cast<size_t>(count), DType::f32, stream_);
    } else if (out != shard) {
        backend_->copy(out, shard, static_cast<size_t>(count) * sizeof(float));
    }
}

}  // namespace moetron::parallel
