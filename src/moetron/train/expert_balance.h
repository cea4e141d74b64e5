// Expert load balancing during training (--redundant-experts R --rebalance-every N): per MoE
// layer, a moving average of the tokens each logical expert receives (summed over every rank, so
// all ranks hold the same numbers), and every N steps a new placement of each layer's expert
// slots (parallel/expert_placement.h) with the slots' weights and AdamW moments migrated to their
// new ranks: per layer, one all-to-all over the EP group whose only non-empty pairs are the
// point-to-point transfers of the slots that change rank (a slot whose expert the rank already
// holds is copied locally). Also the per-step balance figure for the log: the tokens each EP rank's
// experts receive, max over mean, under the placement that served the step.
//
// Under ZeRO-1 the experts' moments are sharded over the expert-data-parallel group: the
// migration first assembles each layer's whole moments (one all-reduce over the EDP group of the
// shards, zeros elsewhere), moves them with the weights, and each rank keeps its shard of the
// result again. Every EP group computes the same placement (the loads are summed over every rank),
// so the EDP peers move the same slots. The buffers are sized here once; a rebalance allocates
// nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "moetron/model/model.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/expert_placement.h"
#include "moetron/train/optimizer.h"

namespace moetron {

// What one step's balancing did, for the step record.
struct BalanceRecord {
    // This step's token copies per EP rank (the rows its experts computed, as the dispatch sent
    // them), max over mean, worst MoE layer.
    double rank_load_max_over_mean = 0;
    // This step's expert computation time over the EP group: the slowest rank's and the mean.
    double expert_compute_max_s = 0, expert_compute_mean_s = 0;
    bool rebalanced = false;    // a new placement was installed after this step
    double migration_s = 0;     // the weights' and moments' transfer
    double migrated_slots = 0;  // slots that changed expert, over the EP group
    // The moving-average load per rank, max over mean, worst MoE layer, under the old and the new
    // placements.
    double average_max_over_mean_before = 0, average_max_over_mean_after = 0;
    std::vector<double> average_expert_load;  // (E) the moving averages summed over the layers
};

class ExpertBalancer {
  public:
    // model's placement (null without redundant experts: then only the figures are computed);
    // optimizer holds the moments; ep is the model's EP group, edp its experts' data-parallel
    // group. rebalance_every 0: never move. Throws moetron::UserError when rebalancing is asked
    // without redundant experts.
    ExpertBalancer(Model& model, AdamW& optimizer, parallel::Communicator& ep,
                   parallel::Communicator& edp, int64_t rebalance_every);

    // After step `step` (1-based) with its loads summed over the ranks (Model::expert_load after
    // sum_expert_load_over_ranks): updates the average, and on every rebalance_every-th step
    // installs the placement for it and migrates. A collective over the EP group (one all-gather
    // of the step's expert rows and time, Model::take_expert_rows).
    // expert_compute_s: this rank's (Model::take_expert_compute_s); gathered over the EP group.
    BalanceRecord after_step(int64_t step, const ExpertLoadStats& load, double expert_compute_s);

    // What a checkpoint keeps so that a resumed run continues bit for bit: each MoE layer's slot
    // table (ExpertPlacement::slot_expert), replica shares (slot_share) and moving average. Empty
    // without redundant experts.
    std::vector<std::vector<int32_t>> slot_tables() const;
    std::vector<std::vector<int32_t>> slot_shares() const;
    const std::vector<std::vector<double>>& averages() const { return average_; }
    // Installs them (before the checkpoint's tensors are read into the slots): the placements
    // when they fit this run's slots (else the run keeps its own, which is correct but not bit
    // exact; slot_shares empty: even shares), the averages when this run rebalances. Returns
    // whether the placements were taken.
    bool restore(const std::vector<std::vector<int32_t>>& slot_tables,
                 const std::vector<std::vector<int32_t>>& slot_shares,
                 const std::vector<std::vector<double>>& averages);

  private:
    // One routed-expert tensor of the model: its slots' params and moments (per_slot floats
    // each, slot i at i * per_slot).
    struct SlotTensor {
        int64_t moe_layer = 0;
        float* param = nullptr;
        std::vector<AdamW::MomentRange> moments;  // the ranges covering it, in offset order
        int64_t offset = 0;                       // in the flat parameter buffer
        int64_t numel = 0;
        int64_t per_slot = 0;
        int64_t in_layer = 0;  // its first float in the layer's moment buffer
    };
    void migrate(int64_t moe_layer, const parallel::ExpertPlacement& from,
                 const parallel::ExpertPlacement& to);
    // The layer's whole moments into layer_moments_ (under ZeRO-1 each rank holds a shard: one
    // all-reduce over the EDP group assembles them), and back into the rank's own ranges.
    void gather_moments(int64_t moe_layer);
    void scatter_moments(int64_t moe_layer);
    // A local slot's floats (param, and m, v from layer_moments_, of the layer's tensors)
    // to/from `out`/`in`.
    void pack_slot(int64_t moe_layer, int64_t local_slot, float* out) const;
    void unpack_slot(int64_t moe_layer, int64_t local_slot, const float* in);

    Model& model_;
    AdamW& optimizer_;
    parallel::Communicator& ep_;
    parallel::Communicator& edp_;  // the experts' data-parallel group: ZeRO-1 shards over it
    int64_t rebalance_every_ = 0;
    bool moments_sharded_ = false;              // the experts' moments are ZeRO-1 shards over edp_
    int64_t num_moe_layers_ = 0;                // with redundant experts
    std::vector<std::vector<double>> average_;  // (layers, E) moving average of tokens per expert
    std::vector<std::vector<double>> last_load_;  // (layers, E) the last step's tokens per expert
    parallel::SharesWorkspace shares_;            // the shares between rebalances, every step
    bool has_average_ = false;
    std::vector<SlotTensor> tensors_;
    int64_t slot_floats_ = 0;   // floats one slot of one MoE layer moves
    int64_t layer_floats_ = 0;  // floats of one MoE layer's routed-expert tensors on this rank
    std::vector<float> layer_moments_;  // (2, layer_floats_): one layer's whole m, then v
    // (slots per rank * slot_floats_): the rank's slots, what it receives; send_ (ep - 1) times
    std::vector<float> staging_, send_, recv_;
    std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
    std::vector<int64_t> next_from_;  // (ep) slots unpacked so far from each source rank
    // (MoE layers + 1) this rank's expert rows in the step per MoE layer, then the bits of its
    // expert compute time (a double): gathered over the EP group in one collective per step.
    std::vector<int64_t> step_record_;
    std::vector<int64_t> record_of_rank_;  // (ep, MoE layers + 1) every EP rank's step_record_
};

}  // namespace moetron
