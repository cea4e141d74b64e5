// The row movements of the expert dispatch (parallel/dispatch_stage.h), on raw index arrays: what
// a GPU runs as gather and scatter-add kernels around each all_to_all_v.
//
// A hop sends each of its input rows once to each of its peers. The (input row, peer) pairs are
// send slots: input row i's are [slot_begin[i], slot_begin[i + 1]), and row_slots[s] is the slot
// number of pair s, placed by SlotPlacement (op_types.h): a row of the send buffer, or, for the
// rows a rank sends to itself, a row of the receive buffer. fan_out is the forward (one input row
// copied to each of its slots), fan_in its adjoint (the slots' rows summed into the input row).
//
// At the last hop's receiver each staging row s expands to its copies on this rank's experts:
// copies [copy_begin[s], copy_begin[s + 1]), copy c at expert row copy_row[c], for choice
// copy_choice[c] of the token, with weight copy_weight[c] (a null copy_weight: weight 1).
// expand is the forward, reduce its adjoint, copy_weight_grads the gradient of reduce's weights.
//
// Every output is written (kernels/README.md's gradient rule) except where accumulate says add.
#pragma once

#include <cstdint>

#include "moetron/kernels/op_types.h"

namespace moetron::cpu {

// The slot row of every (input row, peer) pair <- input row (row_bytes wide: hidden rows, weight
// gradients and route records move alike).
void dispatch_fan_out(void* send, void* recv, const void* input, const int32_t* slot_begin,
                      const int32_t* row_slots, int64_t num_inputs, int64_t row_bytes,
                      const SlotPlacement& own);
// input (num_inputs, width)[i] = the sum of the rows at input row i's slots, written, or added to
// input[i] when accumulate (the sum formed first, so adding gives exactly input[i] + the written
// value).
void dispatch_fan_in(float* input, const float* send, const float* recv, const int32_t* slot_begin,
                     const int32_t* row_slots, int64_t num_inputs, int64_t width,
                     const SlotPlacement& own, bool accumulate);

// expert_rows[copy_row[c]] = (copy_weight[c] or 1) * staging[s] for each copy c of staging row s.
void dispatch_expand(float* expert_rows, const float* staging, const int32_t* copy_begin,
                     const int32_t* copy_row, const float* copy_weight, int64_t num_staging,
                     int64_t dim);
// staging[s] = sum over s's copies c of (copy_weight[c] or 1) * expert_rows[copy_row[c]].
void dispatch_reduce(float* staging, const float* expert_rows, const int32_t* copy_begin,
                     const int32_t* copy_row, const float* copy_weight, int64_t num_staging,
                     int64_t dim);
// dweights (num_staging, top_k)[s, copy_choice[c]] = dot(dout[s], expert_out[copy_row[c]]) in
// double; 0 for the choices without a copy here (another rank's experts).
void dispatch_weight_grads(float* dweights, const float* dout, const float* expert_out,
                           const int32_t* copy_begin, const int32_t* copy_row,
                           const int32_t* copy_choice, int64_t num_staging, int64_t top_k,
                           int64_t dim);

// out (N, D)[t] += sum_j (weights[t, j] or 1) * inp[copy_to_row[t*K + j]]: unpermute (or, with
// null weights, permute's backward) added to out, the sum formed in the order unpermute_forward
// uses, so that the result equals writing it and adding afterwards (cpu/permute.h).
void unpermute_add(float* out, const float* inp, const float* weights, const int32_t* copy_to_row,
                   int64_t num_tokens, int64_t top_k, int64_t dim);

}  // namespace moetron::cpu
