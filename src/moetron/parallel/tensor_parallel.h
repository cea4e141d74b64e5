// Megatron-LM tensor parallelism's communication (Shoeybi et al. 2019, sec. 3): a column-parallel
// GEMM (output features split over the TP group) followed by a row-parallel one (input features
// split) needs only the two conjugate operators around the pair:
//   f: identity forward; backward, the all-reduce of the input gradient (each rank's
//      column-parallel GEMM gives a partial gradient of the replicated input)
//   g: forward, the all-reduce of the row-parallel GEMM's partial outputs; identity backward
// With no group or a group of one rank every operator is the identity, so the one-process model
// runs the same code.
//
// Also the even split of N rows over the group (the MoE layer: each TP rank sends its share of the
// tokens to the experts) and the all-gather that undoes it.
#pragma once

#include <cstdint>
#include <string_view>

#include "moetron/parallel/communicator.h"

namespace moetron::parallel {

// Rows [first, first + count) of a (N, ...) buffer.
struct RowRange {
    int64_t first = 0;
    int64_t count = 0;
};

class TensorParallel {
  public:
    TensorParallel() = default;  // one rank: identity
    // group must outlive this object; null or one rank means no tensor parallelism.
    explicit TensorParallel(Communicator* group);

    int size() const { return size_; }
    int rank() const { return rank_; }
    bool enabled() const { return size_ > 1; }

    // g forward: sums the partial outputs x (count floats) of a row-parallel GEMM in place.
    void sum_partial_outputs(float* x, int64_t count) const;
    // f backward: sums the partial input gradients dx (count floats) of a column-parallel GEMM
    // in place.
    void sum_partial_input_grads(float* dx, int64_t count) const;

    // Sums x (count doubles) over the group in place (statistics such as the cross-entropy's).
    void sum(double* x, int64_t count) const;

    // This rank's share of num_rows split evenly over the group; throws naming `what` when the
    // group does not divide num_rows.
    RowRange row_share(int64_t num_rows, std::string_view what) const;
    // out (size() * count) = every rank's shard (count), in rank order; out must not overlap
    // shard. One rank: a copy (nothing when out == shard).
    void all_gather(float* out, const float* shard, int64_t count) const;

  private:
    Communicator* group_ = nullptr;
    int size_ = 1;
    int rank_ = 0;
};

}  // namespace moetron::parallel
