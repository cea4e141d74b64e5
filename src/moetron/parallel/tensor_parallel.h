// Megatron-LM tensor parallelism's communication (Shoeybi et al. 2019, sec. 3): a column-parallel
// GEMM (output features split over the TP group) followed by a row-parallel one (input features
// split) needs communication only around the pair. Plain TP uses the conjugate operators
//   f: identity forward; backward, the all-reduce of the input gradient (each rank's
//      column-parallel GEMM gives a partial gradient of the replicated input)
//   g: forward, the all-reduce of the row-parallel GEMM's partial outputs; identity backward.
// moetron always adds sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2) when tp > 1:
// outside the split GEMMs (norms, residual stream) a rank holds only its N/tp rows of the tokens,
// so g becomes a reduce-scatter of the partial outputs into the rows (backward: all-gather of the
// rows' gradient), and the entry of a column-parallel block an all-gather of the rows (backward:
// reduce-scatter of the partial input gradient). A replicated parameter used on the rows only (a
// norm's gain) gets a partial gradient that is summed over the group. f itself remains inside
// MLA, whose low-rank latents are replicated between its split GEMMs (attention_mla.h).
// With no group or a group of one rank every operator is the identity, so the one-process model
// runs the same code.
//
// Also the even split of N rows over the group (the MoE layer: each TP rank sends its share of the
// tokens to the experts) and the all-gather that undoes it.
#pragma once

#include <cstdint>
#include <string_view>

#include "moetron/kernels/backend.h"
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
    // group and backend must outlive this object; null or one rank means no tensor parallelism.
    // Its collectives move activations and gradients, ordered by the backend's stream(); with
    // one rank the backend copies what a collective would have moved.
    TensorParallel(Communicator* group, Backend& backend);

    int size() const { return size_; }
    int rank() const { return rank_; }
    bool enabled() const { return size_ > 1; }

    // f backward: sums the partial input gradients dx (count floats) of a column-parallel GEMM
    // in place.
    void sum_partial_input_grads(float* dx, int64_t count) const;

    // Sums x (count doubles) over the group in place (statistics such as the cross-entropy's).
    void sum(double* x, int64_t count) const;

    // ---- sequence parallelism: row counts are this rank's rows x the row width ----

    // Rows of a micro-batch of num_rows tokens this rank holds outside the split GEMMs: N/tp.
    int64_t local_rows(int64_t num_rows) const;
    // full (size() * count floats) = every rank's rows in rank order (all-gather); returns full.
    // One rank: returns rows itself and leaves full untouched.
    const float* gather_rows(float* full, const float* rows, int64_t count) const;
    // rows (count floats) = this rank's rows of the sum over ranks of full (size() * count floats;
    // reduce-scatter). One rank: a copy when rows != full.
    void reduce_scatter_rows(float* rows, const float* full, int64_t count) const;
    // The gradient (count floats) of a replicated parameter that saw only this rank's rows, summed
    // over the group in place.
    void sum_partial_param_grads(float* grad, int64_t count) const;

    // This rank's share of num_rows split evenly over the group; throws naming `what` when the
    // group does not divide num_rows.
    RowRange row_share(int64_t num_rows, std::string_view what) const;
    // out (size() * count) = every rank's shard (count), in rank order; out must not overlap
    // shard. One rank: a copy (nothing when out == shard).
    void all_gather(float* out, const float* shard, int64_t count) const;

  private:
    Communicator* group_ = nullptr;
    Backend* backend_ = &cpu_backend();
    Stream stream_ = kHostStream;
    int size_ = 1;
    int rank_ = 0;
};

}  // namespace moetron::parallel
