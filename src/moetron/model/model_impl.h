// What the source files of model.h's Model share, for model/ only: the trees of parameters and
// activations, Model::Impl, and the functions one file defines for another. The files, by purpose:
//   model.cpp                  construction: the checks, the arenas; the accessors
//   model_layout.cpp           what the arenas hold: the parameter and activation trees, the
//                              parameter counts, the memory plan of a rank
//   model_init.cpp             counter-based initialization of the parameters
//   model_passes.cpp           forward and backward of a micro-batch, with the head and its loss
//   model_pipeline_stages.cpp  the chunks this rank runs, and the stage_* entry points
//   model_experts.cpp          the expert shard and placement, the dispatcher and its slots, the
//                              redundant experts' plumbing
//   model_expert_load.cpp      expert loads and the router bias update; expert rows and time
//   model_grad_sync.cpp        gradient readiness, and the spans gradient synchronization sees
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moetron/core/arena.h"
#include "moetron/kernels/op_types.h"
#include "moetron/model/block.h"
#include "moetron/model/model.h"
#include "moetron/model/mtp.h"
#include "moetron/model/params.h"
#include "moetron/model/vocab_parallel.h"
#include "moetron/parallel/expert_dispatcher.h"
#include "moetron/parallel/expert_placement.h"
#include "moetron/parallel/replica_gradients.h"
#include "moetron/parallel/tensor_parallel.h"

namespace moetron {

struct ModelParams {
    float* embed = nullptr;  // (V, D) HF model.embed_tokens
    std::vector<BlockParams> layers;
    float* final_norm = nullptr;  // (D) HF model.norm
    float* head = nullptr;        // (V, D) HF lm_head, untied
    std::vector<MtpParams> mtp;
};

// The final norm, output head and cross-entropy; shared by the main model and the MTP depths.
// Nr: this rank's token rows, N/tp (sequence parallelism, block.h).
struct HeadScratch {
    float* normed = nullptr;    // (Nr, D)
    float* rstd = nullptr;      // (Nr)
    float* logits = nullptr;    // (N, V/tp) this rank's vocabulary part; their gradient after
                                // a backward
    float* lse = nullptr;       // (N)
    float* losses = nullptr;    // (N)
    float* d_normed = nullptr;  // (Nr, D)
    // tp > 1 only: the gathered normed rows, the head's partial input gradient over all N rows,
    // the final norm gain's partial gradient.
    float* normed_full = nullptr;    // (N, D)
    float* d_normed_full = nullptr;  // (N, D)
    float* d_norm_weight = nullptr;  // (D)
    VocabParallelScratch vocab;
};

// The activation arena's tensors: what bind_model_activations plans or binds.
struct ActivationSet {
    // (N) the micro-batch's tokens and targets, copied from the caller's host memory.
    int32_t* input_tokens = nullptr;
    int32_t* input_targets = nullptr;
    float* rope_cos = nullptr;  // (S, rope_dim / 2)
    float* rope_sin = nullptr;
    std::vector<float*> residual;  // L + 1 of (N, D): the stream entering each block, and after
    std::vector<BlockActivations> layers;
    std::vector<MtpActivations> mtp;
    BlockScratch block_scratch;
    MtpScratch mtp_scratch;
    HeadScratch head;
    float* d_stream = nullptr;  // (N, D) the main stream's gradient, updated in place
    float* d_h_prev = nullptr;  // (N, D) an MTP module's gradient on its h_{d-1}
};

// What a micro-batch's backward needs from its forward, kept with its activation set.
struct PassContext {
    int64_t batch = 0, seq_len = 0;
    float grad_scale = 1.0f;
    float balance_scale = 1.0f;  // this micro-batch's share of the balance loss's mean
    bool backward = false;       // the forward prepared a backward
    size_t chunk = 0;            // which of the rank's chunks ran
};

// [begin, end) of the flat buffer, in floats.
struct FloatRange {
    int64_t begin = 0;
    int64_t end = 0;
};

template <class Pred>
bool any_chunk(const std::vector<PipelineChunk>& chunks, Pred pred) {
    return std::any_of(chunks.begin(), chunks.end(), pred);
}

// ---- model_layout.cpp ----
// An unbound tree whose MoE layers hold `shard` of the routed experts (bind_moe_params reads it).
ModelParams sharded_tree(const ModelConfig& c, const ExpertShard& shard);

// The chunk that is the whole model: what a Model without pipelining runs.
PipelineChunk whole_model_chunk(const ModelConfig& c);

// Binds the parameters of `chunks` (in model order) in p, whose vectors sharded_tree() sized; the
// rest stay null. The entries come in the whole model's order whatever the chunks.
void bind_model_params(ParamBinder& b, ModelParams& p, const ModelConfig& c,
                       const std::vector<PipelineChunk>& chunks);

// The parameters of this rank (its expert shard, TP rank and chunks), in the whole model's order.
std::vector<TensorSpec> sharded_param_specs(const ModelConfig& c, const ExpertShard& shard,
                                            int tp_rank, int tp_size,
                                            const std::vector<PipelineChunk>& chunks);

// Plans (a BufferBinder over a plan) or binds (over the arena) every activation buffer of
// `chunk`, names prefixed with `prefix` (one set per micro-batch in flight); the other layers'
// stay null. expert_rows: R of every MoE layer's expert-side buffers (the dispatcher's
// capacity_rows).
void bind_model_activations(BufferBinder b, ActivationSet& a, const ModelConfig& c,
                            const ModelRuntime& runtime, int tp_size, int64_t expert_rows,
                            const std::vector<PipelineChunk>& chunks,
                            const std::string& prefix = "");

// ---- model_experts.cpp ----
// Which routed experts this rank holds (with redundant experts: which physical slots); checks
// that the groups can hold them.
ExpertShard expert_shard_of(const ModelConfig& c, const ModelParallel& parallel);
// The expert slots the EP group holds: the routed experts and the redundant experts beside them
// (MoeSettings::redundant_experts), (E + R) / ep per rank.
int64_t physical_expert_slots(const ModelConfig& c, const MoeSettings& moe);

// The expert dispatcher's configuration for max_tokens tokens per rank: one function for the
// Model that builds the dispatcher and for plan_rank_memory, which must plan the same buffers.
parallel::ExpertDispatchConfig expert_dispatch_config(const ModelConfig& c, int64_t max_tokens,
                                                      const MoeSettings& moe,
                                                      int64_t ep_ranks_per_domain);

// ---- model_pipeline_stages.cpp ----
// The chunk a Model runs, checked: the MTP modules share the head of their stage (the last).
std::vector<PipelineChunk> checked_chunks(const ModelConfig& c, const ModelParallel& par);

// Which chunk each activation set serves: pipeline_in_flight[c] sets for chunk c, in chunk order.
std::vector<size_t> sets_by_chunk(const ModelParallel& par, size_t num_chunks);

// The state of a Model. Its member functions live in the files of their purpose, named below.
struct Model::Impl {
    Backend& ops;          // runs every op; owns the arenas' memory
    ModelCompute compute;  // ops, and the format of each GEMM (compute.h)
    ModelConfig config;
    ModelRuntime runtime;
    LossWeights loss_weights;
    ModelParallel parallel;
    std::vector<PipelineChunk> chunks;  // the blocks this rank runs, in model order
    parallel::TensorParallel tp;        // declared before table: the specs read it
    ExpertShard shard;
    // Redundant experts (MoeSettings::redundant_experts): which logical expert each slot holds,
    // and the sum of the replicas' gradients, which arm_replica_gradient_sum() turns on for the
    // next backward (the last micro-batch's: the gradients are then whole).
    // One placement per MoE layer (the load slots' order: main layers, then MTP blocks; empty
    // without redundant experts), and the MoE layer of each parameter entry (-1: none).
    std::vector<parallel::ExpertPlacement> placements;
    std::vector<int64_t> entry_moe_layer;
    std::optional<parallel::ReplicaGradientSum> replica_grads;
    bool replica_sum_armed = false;
    double expert_compute_s = 0;       // since the last take_expert_compute_s()
    std::vector<int64_t> expert_rows;  // (MoE layers) since the last take_expert_rows()
    ParamTable table;
    Arena params, grads, acts;
    ModelParams w, g;  // the same tree, pointing into params and into grads
    std::unique_ptr<parallel::ExpertDispatcher> dispatcher;  // null without routed experts

    // One activation set per micro-batch in flight, chunk by chunk
    // (ModelParallel::pipeline_in_flight): set k holds chunk set_chunk[k]'s activations.
    std::vector<ActivationSet> sets;
    std::vector<size_t> set_chunk;
    std::vector<int64_t> first_set;  // per chunk
    std::vector<PassContext> contexts;
    RopeTables rope;

    // MoE layers ("slots"): main layers in order, then MTP blocks, of the whole model, so that the
    // loads of every pipeline stage line up when summed; a stage counts only its own.
    std::vector<int64_t> main_slot, mtp_slot;   // -1 for a dense block
    std::vector<float*> slot_bias;              // (E) each slot's correction bias; null off-stage
    std::vector<const int32_t*> slot_topk_ids;  // (N, K) each slot's last routing (set 0)
    // Tokens routed to each expert since the last bias update, in the backend's memory: (slots,
    // E) in `loads`, load_counts[slot] its row. The host copies are for summing over ranks.
    Arena loads;
    std::vector<int64_t*> load_counts;
    std::vector<int64_t> load_host;  // (slots * E)
    std::vector<double> load_sum;    // (slots * E)
    bool load_summed = false;
    int64_t last_num_tokens = 0;

    // Gradient readiness: the parameter groups in the order their gradients become final.
    GradReadyCallback grad_ready;
    FloatRange head_range, embed_range;
    std::vector<FloatRange> layer_range, mtp_range;

    // ---- model.cpp: construction ----
    Impl(const ModelConfig& c, const ModelRuntime& r, const LossWeights& lw,
         const ModelParallel& par);
    void bind_activations(const BufferBinder& b);
    void check_fits_before_allocating(const ArenaPlan& param_plan) const;

    // ---- model_pipeline_stages.cpp: what of the model this rank runs ----
    bool shares_embedding() const;
    bool runs_embedding() const;
    bool owns_layer(int64_t l) const;
    bool owns_mtp(int64_t d) const;

    // ---- model_experts.cpp: the dispatcher, its slots, the redundant experts ----
    void build_expert_dispatcher();
    void number_moe_slots();
    template <class BlockOf>
    int64_t add_slot(bool is_moe, const BlockParams* bp, BlockOf block_of);
    void map_expert_entries_to_layers();
    void sum_replica_grads(const BlockParams& grads, int64_t moe_layer);

    // ---- model_expert_load.cpp ----
    void plan_expert_loads();
    void sum_loads();

    // ---- model_grad_sync.cpp ----
    void plan_grad_ranges();
    void notify_grads_ready(const FloatRange& r) const;

    // ---- model_init.cpp ----
    void init_expert_shard(uint64_t seed);
    void init_expert_slots(uint64_t seed);

    // ---- model_passes.cpp ----
    BlockMoeOptions moe_options(int64_t slot, bool backward, float grad_scale, float balance_scale);
    bool mtp_needs_backward() const;
    void check_inputs(const int32_t* tokens, const int32_t* targets, int64_t batch,
                      int64_t seq_len) const;
    void check_denominators(const LossDenominators& den, const int32_t* targets, int64_t batch,
                            int64_t seq_len) const;
    MicroBatchLosses forward_pass(size_t ci, size_t k, const int32_t* tokens,
                                  const int32_t* targets, int64_t batch, int64_t seq_len,
                                  bool backward, float grad_scale, const LossDenominators* den);
    void backward_pass(size_t k);
    MicroBatchLosses run(const int32_t* tokens, const int32_t* targets, int64_t batch,
                         int64_t seq_len, bool backward, float grad_scale,
                         const LossDenominators* den);
    static double mean_loss(const CrossEntropyResult& ce, int64_t denominator);
};

}  // namespace moetron
