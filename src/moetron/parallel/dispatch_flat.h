// Flat expert dispatch and combine over the EP group, DeepEP-style: a config that checks itself
// and reports buffer sizes, a buffer planned up front, a layout computed once per routing and
// shared by the four operations, nothing hidden. The pieces are dispatch_stage.h's: one hop over
// the EP group, then the expert side.
//
// Experts are split contiguously: rank r of the EP group owns global experts
// [r * El, (r + 1) * El), El = E / ep. Each token t has K copies c = t*K + j, one per chosen expert
// topk_ids[t, j]. A token travels once to each rank that owns at least one of its experts (not
// once per copy): that rank expands it to its experts, and on combine sums its experts' weighted
// outputs into one row before sending it back. Dropless.
//
//   dispatch_layout:   where every token goes; its ids and weights travel with it (route records).
//   dispatch_forward:  expert_inp (R, D) on the expert's rank = the copies of the tokens routed to
//                      this rank's experts, sorted by local expert; inside an expert by source
//                      rank, then by copy index c. expert_offsets (El + 1) bounds the segments.
//   combine_forward:   out[t] = sum_j weights[t, j] * expert_out[row of copy t*K+j], on t's rank
//                      (the weights are the layout's, applied on the experts' rank).
//   dispatch_backward: dinp[t] = sum_j dexpert_inp[row of copy t*K+j]   (a combine, unweighted)
//   combine_backward:  dexpert_out[row of c] = weights[c] * dout[t]      (a weighted dispatch)
//                      dweights[t, j] = dot(dout[t], expert_out[row of c]), computed on the
//                      experts' rank and sent back (K floats per token and rank).
// Each operation is a local gather, one all_to_all_v, a local scatter (combine_backward adds a
// second, small one: the K weight gradients per row, back to the token's rank).
// Gradient rule (kernels/README.md): every output here is written, none accumulated.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moetron/core/arena.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/dispatch_stage.h"

namespace moetron::parallel {

// The one hop of the flat dispatch, for rank ep_rank of an EP group of ep_size.
std::vector<HopSpec> flat_hops(const DispatchConfig& config, int ep_size, int ep_rank);

// The communication buffers shared by every MoE layer of a rank.
class DispatchBuffer : public RouteBuffer {
  public:
    // In backend.memory() (RouteBuffer).
    DispatchBuffer(const DispatchConfig& config, int ep_size, Backend& backend);
    // The sizes, before allocating anything (dispatch_stage.h's RouteBuffer::plan, hop "ep").
    static ArenaPlan plan(const DispatchConfig& config, int ep_size);
};

// Where every token goes and comes from, for one routing; one per MoE layer, kept from forward to
// backward. Its arrays are sized once from the config (no allocation per call).
class DispatchLayout : public Route {
  public:
    // Its ops run on backend (Route).
    DispatchLayout(const DispatchConfig& config, int ep_size, int ep_rank, Backend& backend);

    int64_t num_recv_rows() const { return experts().num_rows(); }  // R
    int64_t local_experts() const { return experts().local_experts(); }
    // (El + 1) segment boundaries of expert_inp / expert_out, for grouped_linear.
    std::span<const int64_t> expert_offsets() const { return experts().expert_offsets(); }
    // Token rows this rank sends to each rank (own included), and receives from each.
    std::span<const int> send_rows_per_rank() const { return hop(0).send_rows_per_peer(); }
    std::span<const int> recv_rows_per_rank() const { return hop(0).recv_rows_per_peer(); }
};

// Computes the layout from topk_ids and topk_weights (num_tokens, K) of this rank: the ranks of
// each token, one all_to_all_v of counts, one of route records. Collective over ep. Throws for an
// expert id outside [0, E), too many tokens, or more expert rows than the buffer holds (only on
// the rank that receives them, after the last collective).
void dispatch_layout(DispatchLayout& layout, const int32_t* topk_ids, const float* topk_weights,
                     int64_t num_tokens, DispatchBuffer& buffer, Communicator& ep);

// expert_inp (R, D) written from inp (N, D).
void dispatch_forward(float* expert_inp, const float* inp, const DispatchLayout& layout,
                      DispatchBuffer& buffer, Communicator& ep);
// dinp (N, D) written from dexpert_inp (R, D).
void dispatch_backward(float* dinp, const float* dexpert_inp, const DispatchLayout& layout,
                       DispatchBuffer& buffer, Communicator& ep);
// out (N, D) written from expert_out (R, D), weighted by the layout's weights.
void combine_forward(float* out, const float* expert_out, const DispatchLayout& layout,
                     DispatchBuffer& buffer, Communicator& ep);
// dexpert_out (R, D) and dweights (N, K) written from dout (N, D) and expert_out (R, D), the
// rows combine_forward read. dweights may be null only on a rank without tokens (the return of
// the weight gradients is a collective every rank joins).
void combine_backward(float* dexpert_out, float* dweights, const float* dout,
                      const float* expert_out, const DispatchLayout& layout, DispatchBuffer& buffer,
                      Communicator& ep);

}  // namespace moetron::parallel
