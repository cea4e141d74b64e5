// ExpertDispatcher: how a MoE layer moves its token copies to the experts that own them and back,
// without knowing what the experts compute. Two implementations:
//   local: every expert lives in this process; dispatch is a permutation of the copies sorted by
//          expert (kernels/cpu/permute.h), combine its weighted inverse.
//   flat:  experts split contiguously over the EP group (rank r owns [r*El, (r+1)*El)); dispatch
//          and combine are one all_to_all_v each (dispatch_flat.h).
// Either way the expert side sees rows sorted by local expert, bounded by expert_offsets(), so the
// caller runs one grouped GEMM over El experts whatever the placement.
//
// A "slot" is one routing context (one MoE layer): route() computes where every copy goes and the
// slot keeps it from the forward to the backward. All state is sized at construction from the
// config (no allocation per call). The four data movements mirror each other:
//   dispatch_forward:  expert_inp (R, D)  <- inp (N, D)
//   combine_forward:   out (N, D)         <- sum_j weights[t, j] * expert_out[row of copy t*K+j]
//   combine_backward:  dexpert_out (R, D), dweights (N, K) <- dout (N, D)
//   dispatch_backward: dinp (N, D)        <- sum_j dexpert_inp[row of copy t*K+j]
// Every output is written, none accumulated (kernels/README.md's gradient rule).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "moetron/parallel/communicator.h"

namespace moetron::parallel {

struct ExpertDispatchConfig {
    int64_t num_experts = 0;  // E over the whole EP group
    int64_t top_k = 0;        // K
    int64_t hidden = 0;       // D
    int64_t max_tokens = 0;   // N per call, at most
    int64_t num_slots = 0;    // routing contexts kept at once (MoE layers)
    // Expert-side rows a rank holds at most (flat only; 0: the dropless worst case, see
    // DispatchConfig::recv_capacity_rows).
    int64_t recv_capacity_rows = 0;
};

class ExpertDispatcher {
  public:
    virtual ~ExpertDispatcher() = default;

    // "local" or "flat", for logs.
    virtual const char* kind() const = 0;
    int64_t num_local_experts() const { return num_local_experts_; }  // El
    int64_t first_local_expert() const { return first_local_expert_; }
    // Rows the expert-side buffers (expert_inp, expert_out and their gradients) must hold.
    virtual int64_t capacity_rows() const = 0;
    // Bytes of the routing state and communication buffers this dispatcher holds.
    virtual size_t buffer_bytes() const = 0;

    // Computes where every copy of slot's num_tokens tokens goes, from topk_ids (N, K) of global
    // expert ids. Collective over the EP group for the flat dispatcher.
    virtual void route(int64_t slot, const int32_t* topk_ids, int64_t num_tokens) = 0;
    // After route(): rows the local experts receive (R), and the El + 1 segment boundaries.
    virtual int64_t num_expert_rows(int64_t slot) const = 0;
    virtual std::span<const int64_t> expert_offsets(int64_t slot) const = 0;

    virtual void dispatch_forward(int64_t slot, float* expert_inp, const float* inp) = 0;
    // expert_out must stay untouched until combine_backward of the same slot (the local
    // dispatcher reads it there for dweights; the flat one keeps its own copy of the returned
    // rows).
    virtual void combine_forward(int64_t slot, float* out, const float* expert_out,
                                 const float* weights) = 0;
    virtual void combine_backward(int64_t slot, float* dexpert_out, float* dweights,
                                  const float* dout, const float* weights,
                                  const float* expert_out) = 0;
    virtual void dispatch_backward(int64_t slot, float* dinp, const float* dexpert_inp) = 0;

  protected:
    int64_t num_local_experts_ = 0;
    int64_t first_local_expert_ = 0;
};

// The flat dispatcher over ep when ep is given and has more than one rank, else the local one.
// Throws moetron::Error when the config cannot work (experts not splitting over ep, ...).
std::unique_ptr<ExpertDispatcher> make_expert_dispatcher(const ExpertDispatchConfig& config,
                                                         Communicator* ep);

}  // namespace moetron::parallel
