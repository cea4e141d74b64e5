// ExpertDispatcher: how a MoE layer moves its token copies to the experts that own them and back,
// without knowing what the experts compute. Three implementations:
//   local:    every expert lives in this process; dispatch is a permutation of the copies sorted
//             by expert (kernels/cpu/permute.h), combine its weighted inverse.
//   flat:     experts split contiguously over the EP group (rank r owns [r*El, (r+1)*El)); a
//             token travels once to each rank that owns one of its experts, in one all_to_all_v
//             (dispatch_flat.h).
//   two_tier: the same placement over an EP group of several scale-up domains; a token crosses
//             the scale-out tier once per destination domain, then fans out inside the domain
//             (dispatch_two_tier.h). Same results as flat.
// Either way the expert side sees rows sorted by local expert, bounded by expert_offsets(), so the
// caller runs one grouped GEMM over El experts whatever the placement.
//
// A "slot" is one routing context (one MoE layer): route() computes where every copy goes (the
// weights travel with the routing: flat and two_tier apply them on the experts' rank) and the
// slot keeps it from the forward to the backward. All state is sized at construction from the
// config (no allocation per call). The four data movements mirror each other:
//   dispatch_forward:  expert_inp (R, D)  <- inp (N, D)
//   combine_forward:   out (N, D)         <- sum_j weights[t, j] * expert_out[row of copy t*K+j]
//   combine_backward:  dexpert_out (R, D), dweights (N, K) <- dout (N, D)
//   dispatch_backward: dinp (N, D)        <- sum_j dexpert_inp[row of copy t*K+j]
// Every output is written, none accumulated (kernels/README.md's gradient rule), except where a
// movement is asked to add (the overlapped MoE layer computes the shared experts first).
//
// Each movement also comes in two parts, so that the caller computes while the all-to-all flies
// (model/moe.h's overlap): *_begin does the local gather and posts the first all_to_all_v
// asynchronously; finish(slot) waits for it, does the local scatter, and runs the rest of the
// movement (two_tier's second hop; combine_backward's return of the weight gradients). The
// blocking forms are begin + finish. Slot s exchanges through buffer s % num_buffers: slots in
// flight at once must differ there (a second begin on a busy buffer throws), and every rank must
// begin and finish its slots in the same order (collectives match in posting order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "moetron/parallel/communicator.h"
#include "moetron/parallel/dispatch_stage.h"
#include "moetron/parallel/dispatch_traffic.h"
#include "moetron/parallel/expert_placement.h"

namespace moetron::parallel {

DispatchKind parse_dispatch_kind(std::string_view name);  // "flat" | "two_tier"; throws otherwise
std::string_view dispatch_kind_name(DispatchKind kind);

// The default MoE capacity factor (--moe-capacity-factor): the expert-side buffers hold 4 times
// the balanced load. Why 4: a balanced router would need little more than 1, but routers are not
// balanced early in training: measured (README, "MoE capacity"), tiny at ep4 overflows 2x in 51 of
// its first 100 steps and 3x in 8 (the first 11), 4x never; small collapses onto 4 of its 32
// experts in its first steps (expert load max/mean ~8). Overflow stays dropless but costs extra
// rounds (and recomputation in the backward), so the default keeps them rare, and at the presets'
// test sizes (ep <= 4) it is the worst case anyway. At DeepSeek-V3 scale (ep 64, 4096 tokens) it
// still plans 131,072 expert rows per layer and rank instead of 1,048,576.
inline constexpr double kDefaultMoeCapacityFactor = 4.0;

struct ExpertDispatchConfig {
    // The routing's shape, shared with every stage of the dispatch: E over the whole EP group, K,
    // D, N per call at most, and the consecutive EP ranks per scale-up domain (0: one domain;
    // two_tier routes by it, flat splits its byte counts by it). Its pair_capacity_rows is not
    // read: the dispatcher plans it from capacity_factor (pair_rows_for_capacity_factor).
    DispatchConfig routing;
    int64_t num_slots = 0;  // routing contexts kept at once (MoE layers)
    // Exchange buffers (send and staging rows): how many routings may be in flight at once (1;
    // 2 for the dual micro-batch overlap). Each is as large as the one.
    int64_t num_buffers = 1;
    // The expert-side buffers (and every receive buffer) are planned for this many times the
    // balanced load, max_tokens * K / ep rows from each rank to each rank (at least one token's
    // copies, at most the worst case; 0: the worst case, max_tokens * min(K, El) from each). A
    // routing that exceeds it is split into rounds (plan_rounds): dropless either way.
    double capacity_factor = kDefaultMoeCapacityFactor;
    DispatchKind kind = DispatchKind::flat;
    // Redundant experts: routing.num_experts counts the physical slots (E + R), and route() and
    // plan_rounds() take logical expert ids, which the dispatcher maps to one replica's slot each
    // (choose_replica) by the placement of the slot's MoE layer: placements[slot /
    // routing_slots_per_placement] (2 with the dual overlap). Not owned; they must outlive the
    // dispatcher, and may change between steps (a rebalance). Null: the ids are the slots.
    const ExpertPlacement* placements = nullptr;
    int64_t routing_slots_per_placement = 1;
};

// The routing config every stage of an EP group of ep_size ranks works with: config.routing with
// the pair capacity planned from config.capacity_factor.
DispatchConfig planned_routing(const ExpertDispatchConfig& config, int ep_size);

// DispatchConfig::pair_capacity_rows for a capacity factor over an EP group of ep_size ranks.
int64_t pair_rows_for_capacity_factor(const ExpertDispatchConfig& config, int ep_size);

// What make_expert_dispatcher(config, groups with an EP group of ep_size ranks) plans, without
// building it: its capacity_rows() and its buffer_bytes() (with one rank: the routing's index
// arrays of every slot).
int64_t planned_expert_rows(const ExpertDispatchConfig& config, int ep_size);
size_t planned_buffer_bytes(const ExpertDispatchConfig& config, int ep_size);

// What the dispatcher sent and how far the tokens spread, since construction or reset_stats().
struct DispatchStats {
    DispatchBytes bytes;   // to other ranks, by tier
    int64_t routes = 0;    // route() calls
    RoutingSpread spread;  // summed over routes (max: the largest)
    // plan_rounds calls whose routing exceeded the planned capacity on some rank of the EP
    // group, and the rounds they took beyond the first (summed).
    int64_t overflowed_plans = 0;
    int64_t extra_rounds = 0;
};

// The groups a dispatcher works over: ep for flat; for two_tier also the EP group's rail and
// domain groups (ParallelGroups::ep_rail, ep_domain).
struct ExpertGroups {
    Communicator* ep = nullptr;
    Communicator* rail = nullptr;
    Communicator* domain = nullptr;
};

class ExpertDispatcher {
  public:
    virtual ~ExpertDispatcher() = default;

    // "local", "flat" or "two_tier", for logs.
    virtual const char* kind() const = 0;
    // One line for the start-up log: the kind and why (e.g. two_tier asked over one domain).
    const std::string& description() const { return description_; }
    // The format the buffers are planned for dispatch_forward's token rows to travel in
    // (DispatchConfig::token_format); each dispatch names its own, this one or float32. In a
    // format other than float32 the expert rows hold what it decodes to, the recipe's row-wise
    // quantized copy of the tokens, also when nothing travels (local), so that the numbers do not
    // depend on the layout.
    Precision planned_token_format() const { return token_format_; }
    int64_t num_local_experts() const { return num_local_experts_; }  // El
    int64_t first_local_expert() const { return first_local_expert_; }
    // Rows the expert-side buffers (expert_inp, expert_out and their gradients) must hold.
    virtual int64_t capacity_rows() const = 0;
    // Bytes of the routing state and communication buffers this dispatcher holds.
    virtual size_t buffer_bytes() const = 0;

    // Computes where every copy of slot's num_tokens tokens goes, from topk_ids (N, K) of global
    // expert ids; topk_weights (N, K) travel with them (flat and two_tier weight the experts'
    // outputs on the experts' rank, with these weights: pass the same ones to combine). A
    // collective over the EP group (and its rail and domain groups) for flat and two_tier.
    // first_token: the index of topk_ids' first token in the rank's share of the micro-batch (a
    // half or a round starts later), which the replica choice of redundant experts reads, so that
    // a token goes to the same replica whichever round or half routes it.
    virtual void route(int64_t slot, const int32_t* topk_ids, const float* topk_weights,
                       int64_t num_tokens, int64_t first_token = 0) = 0;
    // Splits num_tokens tokens (topk_ids (N, K), global expert ids) into rounds that each fit
    // the expert-side buffers: round i routes tokens [ends[i-1], ends[i]) (ends[-1] = 0), each
    // round as long as the capacity lets it. Every rank of the EP group gets the same number of
    // rounds: when a routing can exceed the capacity, a collective over the EP group agrees on
    // it (a rank that needs fewer ends with empty rounds). The plan stays in the slot until the
    // slot's next plan_rounds (round_ends reads it). One round whenever the capacity is the
    // worst case.
    virtual std::span<const int64_t> plan_rounds(int64_t slot, const int32_t* topk_ids,
                                                 int64_t num_tokens) = 0;
    virtual std::span<const int64_t> round_ends(int64_t slot) const = 0;

    // After route(): rows the local experts receive (R), and the El + 1 segment boundaries.
    virtual int64_t num_expert_rows(int64_t slot) const = 0;
    virtual std::span<const int64_t> expert_offsets(int64_t slot) const = 0;

    // The blocking movements. expert_out must stay untouched until combine_backward of the same
    // slot (every dispatcher reads it there for dweights).
    void dispatch_forward(int64_t slot, float* expert_inp, const float* inp,
                          Precision token_format) {
        dispatch_forward_begin(slot, expert_inp, inp, token_format);
        finish(slot);
    }
    void combine_forward(int64_t slot, float* out, const float* expert_out, const float* weights) {
        combine_forward_begin(slot, out, expert_out, weights, /*accumulate=*/false);
        finish(slot);
    }
    void combine_backward(int64_t slot, float* dexpert_out, float* dweights, const float* dout,
                          const float* weights, const float* expert_out) {
        combine_backward_begin(slot, dexpert_out, dweights, dout, weights, expert_out);
        finish(slot);
    }
    void dispatch_backward(int64_t slot, float* dinp, const float* dexpert_inp) {
        dispatch_backward_begin(slot, dinp, dexpert_inp, /*accumulate=*/false);
        finish(slot);
    }

    // The same, begun: every pointer given must stay alive, and the inputs untouched, until
    // finish(slot); the outputs are ready after it. With accumulate the token rows are added to
    // (out += the combined rows, exactly as adding afterwards), else written.
    // dispatch_forward_begin's token rows travel in token_format (planned_token_format() or
    // float32).
    virtual void dispatch_forward_begin(int64_t slot, float* expert_inp, const float* inp,
                                        Precision token_format) = 0;
    virtual void combine_forward_begin(int64_t slot, float* out, const float* expert_out,
                                       const float* weights, bool accumulate) = 0;
    virtual void combine_backward_begin(int64_t slot, float* dexpert_out, float* dweights,
                                        const float* dout, const float* weights,
                                        const float* expert_out) = 0;
    virtual void dispatch_backward_begin(int64_t slot, float* dinp, const float* dexpert_inp,
                                         bool accumulate) = 0;
    // Completes slot's movement in flight (nothing when none is).
    virtual void finish(int64_t slot) = 0;
    // When slot's movement has a collective after the one in flight (two_tier's second hop),
    // waits for this one and posts the next, which then flies until finish; else nothing.
    virtual void post_next_hop(int64_t slot) = 0;

    virtual DispatchStats stats() const { return {}; }
    virtual void reset_stats() {}

  protected:
    int64_t num_local_experts_ = 0;
    int64_t first_local_expert_ = 0;
    Precision token_format_ = Precision::fp32;
    std::string description_;
};

// With groups.ep of more than one rank: config.kind's dispatcher over it (two_tier over an EP
// group inside one domain is the flat one, and says so in description()); else the local one.
// Throws moetron::Error when the config cannot work (experts not splitting over ep, two_tier
// without its groups, ...). The dispatcher's row movements and routing metadata run as ops of
// backend (kernels/backend.h's dispatch ops), its buffers live in backend.memory(), and its
// collectives carry backend.stream(); backend must outlive it.
std::unique_ptr<ExpertDispatcher> make_expert_dispatcher(const ExpertDispatchConfig& config,
                                                         const ExpertGroups& groups,
                                                         Backend& backend);

}  // namespace moetron::parallel
