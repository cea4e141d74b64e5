// Flat expert dispatch and combine over the EP group, DeepEP-style: a config that checks itself
// and reports buffer sizes, a buffer planned up front, a layout computed once per routing and
// shared by the four operations, nothing hidden.
//
// Experts are split contiguously: rank r of the EP group owns global experts
// [r * El, (r + 1) * El), El = E / ep. Each token t has K copies c = t*K + j, one per chosen expert
// topk_ids[t, j]. Dropless: every copy travels (one row of D floats per copy).
//
//   dispatch_forward:  expert_inp (R, D) on the expert's rank = the copies of the tokens routed to
//                      this rank's experts, sorted by local expert; inside an expert by source
//                      rank, then by copy index c. expert_offsets (El + 1) bounds the segments.
//   combine_forward:   out[t] = sum_j weights[t, j] * expert_out[row of copy t*K+j], on t's rank.
//   dispatch_backward: dinp[t] = sum_j dexpert_inp[row of copy t*K+j]   (a combine, unweighted)
//   combine_backward:  dexpert_out[row of c] = weights[c] * dout[t]      (a weighted dispatch)
//                      dweights[t, j] = dot(dout[t], expert_out[row of c]), from the rows that
//                      combine_forward brought back (returned_rows, saved by the caller).
//
// Each operation is: a local gather into the send order, one all_to_all_v, a local scatter. The
// send order on a source rank sorts copies by global expert (hence by destination rank); the
// receive side lands rows grouped by source rank ("staging") and reorders them by local expert.
// Gradient rule (kernels/README.md): every output here is written, none accumulated.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moetron/core/arena.h"
#include "moetron/parallel/communicator.h"

namespace moetron::parallel {

struct DispatchConfig {
    int64_t num_experts = 0;  // E, over the whole EP group
    int64_t top_k = 0;        // K
    int64_t hidden = 0;       // D
    int64_t max_tokens = 0;   // N per rank and call, at most
    // Rows the receive side holds (R at most). 0: the worst case, every rank sending every token
    // to this rank's experts, ep * max_tokens * min(K, El): dropless whatever the routing. A
    // smaller capacity saves memory; a routing that overflows it is an error, never a drop.
    int64_t recv_capacity_rows = 0;

    // Throws moetron::Error saying which value cannot work with an EP group of ep_size ranks.
    void validate(int ep_size) const;
    int64_t local_experts(int ep_size) const { return num_experts / ep_size; }
    int64_t worst_case_recv_rows(int ep_size) const;
    int64_t capacity_rows(int ep_size) const;  // recv_capacity_rows, or the worst case
};

// The communication buffers shared by every MoE layer of a rank (their contents live only
// during one call): the send-order rows and the receive-side staging rows.
class DispatchBuffer {
  public:
    DispatchBuffer(const DispatchConfig& config, int ep_size);

    // The sizes, before allocating anything: "send_rows" (max_tokens*K, D) and
    // "staging_rows" (capacity, D).
    static ArenaPlan plan(const DispatchConfig& config, int ep_size);

    const DispatchConfig& config() const { return config_; }
    int ep_size() const { return ep_size_; }
    float* send_rows() const { return send_rows_; }
    float* staging_rows() const { return staging_rows_; }
    size_t size_bytes() const { return arena_.size_bytes(); }

  private:
    DispatchConfig config_;
    int ep_size_;
    Arena arena_;
    float* send_rows_;
    float* staging_rows_;
};

// Where every copy goes and comes from, for one routing; one per MoE layer, kept from forward to
// backward. Its arrays are sized once from the config (no allocation per call).
class DispatchLayout {
  public:
    DispatchLayout(const DispatchConfig& config, int ep_size);

    int64_t num_tokens() const { return num_tokens_; }
    int64_t num_recv_rows() const { return num_recv_rows_; }  // R
    int64_t local_experts() const { return local_experts_; }  // El
    // (El + 1) segment boundaries of expert_inp / expert_out, for grouped_linear.
    std::span<const int64_t> expert_offsets() const { return expert_offsets_; }
    // Rows this rank sends to each global expert (E): its share of the expert load.
    std::span<const int32_t> send_expert_counts() const { return send_expert_counts_; }
    // Rows this rank's local experts receive from each source rank, (ep, El) row-major.
    std::span<const int32_t> recv_expert_counts() const { return recv_expert_counts_; }
    // Row of copy c = t*K + j in the send order (and in combine's returned_rows).
    std::span<const int32_t> copy_to_send_row() const {
        return std::span<const int32_t>(copy_to_send_row_).first(num_tokens_ * config_.top_k);
    }
    std::span<const int> send_rows_per_rank() const { return send_rows_per_rank_; }
    std::span<const int> recv_rows_per_rank() const { return recv_rows_per_rank_; }

  private:
    friend void dispatch_layout(DispatchLayout& layout, const int32_t* topk_ids, int64_t num_tokens,
                                Communicator& ep);
    friend class DispatchOps;

    DispatchConfig config_;
    int ep_size_;
    int64_t local_experts_;
    int64_t num_tokens_ = 0;
    int64_t num_recv_rows_ = 0;
    std::vector<int32_t> copy_to_send_row_;       // (max_tokens * K)
    std::vector<int32_t> send_expert_counts_;     // (E) = (ep, El)
    std::vector<int32_t> recv_expert_counts_;     // (ep, El)
    std::vector<int32_t> staging_to_expert_row_;  // (capacity)
    std::vector<int64_t> expert_offsets_;         // (El + 1)
    std::vector<int64_t> expert_fill_;            // (El) scratch of dispatch_layout
    // Rows per peer and their offsets, and the same in floats for all_to_all_v.
    std::vector<int> send_rows_per_rank_, recv_rows_per_rank_;
    std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
    // Uniform counts for exchanging El counts with every peer.
    std::vector<int> count_exchange_counts_, count_exchange_displs_;
};

// Computes the layout from topk_ids (num_tokens, K) of this rank: counts per expert, the send
// order, then one all_to_all_v of El ints per peer so that each rank learns what it receives.
// Collective over ep. Throws for an expert id outside [0, E), too many tokens, or more received
// rows than the buffer holds.
void dispatch_layout(DispatchLayout& layout, const int32_t* topk_ids, int64_t num_tokens,
                     Communicator& ep);

// expert_inp (R, D) written from inp (N, D).
void dispatch_forward(float* expert_inp, const float* inp, const DispatchLayout& layout,
                      DispatchBuffer& buffer, Communicator& ep);
// dinp (N, D) written from dexpert_inp (R, D).
void dispatch_backward(float* dinp, const float* dexpert_inp, const DispatchLayout& layout,
                       DispatchBuffer& buffer, Communicator& ep);
// out (N, D) written from expert_out (R, D) and weights (N, K). returned_rows (N*K, D) is written
// with every copy's expert output in send order; combine_backward needs it for dweights.
void combine_forward(float* out, float* returned_rows, const float* expert_out,
                     const float* weights, const DispatchLayout& layout, DispatchBuffer& buffer,
                     Communicator& ep);
// dexpert_out (R, D) and dweights (N, K) written from dout (N, D), weights (N, K) and the saved
// returned_rows (N*K, D). dweights may be null (then returned_rows is not read).
void combine_backward(float* dexpert_out, float* dweights, const float* dout, const float* weights,
                      const float* returned_rows, const DispatchLayout& layout,
                      DispatchBuffer& buffer, Communicator& ep);

}  // namespace moetron::parallel
