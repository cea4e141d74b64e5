// The DeepSeek-V3 model: embedding, num_hidden_layers blocks (MLA attention; a dense SwiGLU MLP
// for the first first_k_dense_replace layers, MoE after), final norm, output head, and the MTP
// modules. Forward and hand-written backward; parameters, gradients and activations live in
// arenas planned in the constructor, so forward_backward allocates nothing.
//
// This header is the contract between model/ and train/. Its owner may extend it; the functions
// below keep their meaning.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moetron/core/precision.h"
#include "moetron/core/tensor.h"
#include "moetron/model/config.h"
#include "moetron/model/moe.h"     // ExpertShard
#include "moetron/model/params.h"  // ParamEntry, TensorSpec
#include "moetron/model/pipeline_layout.h"
#include "moetron/parallel/expert_dispatcher.h"
#include "moetron/parallel/grad_buckets.h"
#include "moetron/parallel/topology.h"

namespace moetron::parallel {
class Communicator;
}

namespace moetron {

class Backend;  // kernels/backend.h

// Sizes the activation arena: the largest micro-batch the model will see; and where the model
// runs.
struct ModelRuntime {
    int64_t batch_size = 1;  // B: sequences per micro-batch
    int64_t seq_len = 0;     // S
    // The backend that runs every op of the model and owns its arenas (parameters, gradients,
    // activations, expert loads); it must outlive the model. Null: cpu_backend().
    Backend* backend = nullptr;
    // Under a split backward (zb-h1: backend is a SplitBackwardBackend), the backend below it, for
    // the GEMMs whose backward stays whole (compute.h). Null: backend.
    Backend* whole_backward = nullptr;
    // The recipe (--precision): the format of each GEMM by its role (compute.h).
    Precision precision = Precision::fp32;
};

// Loss-side knobs of DeepSeek-V3 training (its report, sec. 2.1-2.2).
struct LossWeights {
    float mtp_lambda = 0.3f;        // weight of the MTP loss (averaged over depths)
    float balance_alpha = 0.0001f;  // sequence-wise balance loss weight (0 disables)
};

struct MicroBatchLosses {
    double lm_loss = 0;       // mean cross-entropy of next-token prediction (nats/token)
    double mtp_loss = 0;      // mean over MTP depths of their cross-entropy (0 without MTP)
    double balance_loss = 0;  // alpha * sum over MoE layers (main and MTP) of the sequence-wise
                              // balance loss, each averaged over the micro-batch's sequences
    int64_t num_tokens = 0;   // tokens with a valid target
};

// Where the model sits in a distributed job (DESIGN.md sec. 3). The communicators belong to the
// caller and must outlive the model. The default is one process holding every expert.
// How the MoE layers run, as the user chose them (train's --dispatch, --moe-overlap,
// --moe-capacity-factor): one struct from the command line to the Model and plan_rank_memory.
struct MoeSettings {
    // How the EP group's all-to-all crosses scale-up domains (parallel/expert_dispatcher.h).
    // two_tier needs n_group to be a multiple of the EP domains (domain-limited routing: each
    // router group's experts in one domain).
    parallel::DispatchKind dispatch = parallel::DispatchKind::flat;
    // How each MoE layer hides its all-to-all (moe.h); dual gives every layer two dispatcher
    // slots and the dispatcher two exchange buffers.
    MoeOverlap overlap = MoeOverlap::off;
    // The expert-side buffers hold this many times the balanced load (ExpertDispatchConfig::
    // capacity_factor; 0: the worst case); a step that exceeds it runs in rounds, dropless. Only
    // used with expert parallelism.
    double capacity_factor = parallel::kDefaultMoeCapacityFactor;
    // --redundant-experts R: the EP group holds E + R physical expert slots, (E + R) / ep per
    // rank; the spare ones replicate hot experts (parallel/expert_placement.h). Needs expert
    // parallelism; 0: every expert once, contiguously.
    int64_t redundant_experts = 0;
    // --rebalance-every N: every N steps the trainer places the slots for the measured load and
    // migrates them (train/expert_balance.h); 0: the placement never moves.
    int64_t rebalance_every = 0;
    // The format the tokens travel to the routed experts in (parallel/dispatch_payload.h): the
    // recipe's (--precision) by default, so that the experts consume the recipe's quantized copy
    // as it arrives; fp32 sends float32 and quantizes at the GEMM.
    Precision token_format = Precision::fp32;
};

struct ModelParallel {
    // The routed experts are split over this group: its rank r holds experts [r*El, (r+1)*El),
    // El = E / size, and every MoE layer exchanges token copies over it. Null or one rank: all E.
    parallel::Communicator* ep = nullptr;
    // The group over which expert loads are summed before the router bias update: every rank
    // that routes different tokens (the world; with tp > 1 each TP rank counts its own share).
    // Null: this process only.
    parallel::Communicator* load = nullptr;
    MoeSettings moe;
    // The groups two_tier works over (ParallelGroups::ep_rail and ep_domain, built from the
    // Topology). ep_domain is also where the EP group's domain split is read: its size is the EP
    // ranks per domain (null: the EP group is one domain).
    parallel::Communicator* ep_rail = nullptr;
    parallel::Communicator* ep_domain = nullptr;
    // Tensor parallelism (Megatron style) over this group: its ranks hold the same tokens and
    // split the attention heads, the dense MLP and the shared experts (attention_mla.h, mlp.h,
    // moe.h) and the vocabulary of the embedding, output head and cross-entropy
    // (vocab_parallel.h); the residual stream and the norms are sequence-parallel (each rank
    // holds N/tp token rows, block.h), so B*S must split over the group. Each sends its 1/tp share
    // of the tokens to the routed experts, so `load` must then count every rank (the world). Null
    // or one rank: none.
    parallel::Communicator* tp = nullptr;
    // Pipeline parallelism: the model chunks this rank runs (model/pipeline_layout.h), in model
    // order: one per stage, or vpp of them (chunks s, s + pp, ...) with virtual stages. The Model
    // then holds only their parameters and activations, and the residual stream enters from the
    // previous virtual stage and leaves to the next through the stage_* calls. The MTP modules
    // use their stage's copy of the embedding (shares_embedding). Empty: the whole model.
    std::vector<PipelineChunk> pipeline_chunks;
    // For each of pipeline_chunks, the micro-batches whose activations it keeps at once: the
    // activation sets planned for it (stage_sets), each stage_forward of the chunk filling one
    // and its stage_backward freeing it (1F1B: pp - stage). Empty: one set per chunk.
    std::vector<int64_t> pipeline_in_flight;
};

inline constexpr int64_t kMaxMtpDepths = 8;

// The denominators of the mean losses that forward_backward differentiates. By default each
// micro-batch is normalized by its own counts. A rank whose micro-batch is one slice of a larger
// batch (data parallelism, gradient accumulation) passes the whole batch's counts instead: its
// losses and gradients are then its share of the whole batch's means, and the shares add up to
// them (sum the gradients over ranks and micro-batches, and the returned losses likewise).
struct LossDenominators {
    int64_t lm_tokens = 0;                            // valid targets of the main head
    std::array<int64_t, kMaxMtpDepths> mtp_tokens{};  // valid targets of each MTP depth
    int64_t sequences = 0;                            // for the sequence-wise balance loss

    LossDenominators& operator+=(const LossDenominators& other);
};

// The counts of one micro-batch: what it contributes to LossDenominators.
LossDenominators count_loss_denominators(const ModelConfig& config, const int32_t* targets,
                                         int64_t batch, int64_t seq_len);

// Called by the backward of forward_backward each time a range [begin, end) of grads() (in floats)
// has received its last contribution of the micro-batch, so that gradient reduction can start
// while the backward goes on. Ranges come in backward order: head and final norm, MTP modules,
// main layers last to first, embedding; together they cover the whole buffer once.
using GradReadyCallback = std::function<void(int64_t begin, int64_t end)>;

// Expert load of the tokens seen since the last reset, per MoE layer: the main model's MoE layers
// in order, then the MoE blocks of the MTP modules (each has its own router and correction bias,
// as layer 61 of DeepSeek-V3's checkpoint). Only forward_backward counts (training tokens).
struct ExpertLoadStats {
    std::vector<std::vector<int64_t>> tokens_per_expert;  // [moe layer][expert]
    double max_over_mean = 0;                             // worst layer's max(load) / mean(load)
    double min_over_mean = 0;                             // worst layer's min(load) / mean(load)
};

class Model {
  public:
    Model(const ModelConfig& config, const ModelRuntime& runtime, const LossWeights& weights,
          const ModelParallel& parallel = {});
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    // Counter-based initialization: element i of parameter P from (seed, P's name, i), i the
    // global index, so a rank's slice of the experts equals the same slice of the full model.
    void init_parameters(uint64_t seed);

    // Forward and backward of one micro-batch of B x S tokens (B, S <= the runtime's). targets are
    // the next tokens (ignore_index -1 where there is none); MTP depth d predicts targets shifted
    // by d. Gradients (scaled by grad_scale, e.g. 1 / micro-batches) accumulate into grads().
    // The loss differentiated is lm_loss + mtp_lambda * mtp_loss + balance_loss (each term a mean
    // over this micro-batch), times grad_scale. Also counts the expert loads.
    MicroBatchLosses forward_backward(const int32_t* tokens, const int32_t* targets, int64_t batch,
                                      int64_t seq_len, float grad_scale);
    // The same with the denominators of a larger batch this micro-batch is a slice of: every mean
    // of the loss (the returned ones included) divides by them instead of this micro-batch's
    // counts. num_tokens stays this micro-batch's count.
    MicroBatchLosses forward_backward(const int32_t* tokens, const int32_t* targets, int64_t batch,
                                      int64_t seq_len, float grad_scale,
                                      const LossDenominators& denominators);
    // Null (the default) turns the notifications off.
    void set_grad_ready_callback(GradReadyCallback callback);
    // The callback set last (a pipeline runner with split backwards wraps it).
    const GradReadyCallback& grad_ready_callback() const;

    // ---- pipeline stages (ModelParallel::pipeline_chunk; also fine for the whole model) ----
    // The forward of this rank's chunk `chunk` (an index into pipeline_chunks()) for one
    // micro-batch (as forward_backward's arguments), into activation set `set`, one of the
    // chunk's stage_sets, which stays taken until stage_backward(set). Without the
    // embedding, stage_input(chunk, set) must hold the stream from the previous virtual stage
    // first. With the loss (the last chunk), returns the losses and prepares their gradient;
    // elsewhere only the balance loss of its MoE layers. denominators null: evaluation (forward
    // only, no backward may follow; losses are this micro-batch's means).
    MicroBatchLosses stage_forward(int64_t chunk, int64_t set, const int32_t* tokens,
                                   const int32_t* targets, int64_t batch, int64_t seq_len,
                                   const LossDenominators* denominators);
    // The backward of the micro-batch and chunk in `set`. Without the loss, stage_grad(set) must
    // hold the gradient of stage_output from the next virtual stage first; afterwards
    // stage_grad(set) holds the gradient of stage_input, for the previous one. Gradients
    // accumulate into grads().
    void stage_backward(int64_t set);
    // (B*S/tp, D) rows of the residual stream entering and leaving the chunk, and the gradient
    // buffer above; planned for the runtime's batch, in the backend's memory.
    float* stage_input(int64_t chunk, int64_t set);
    const float* stage_output(int64_t chunk, int64_t set) const;
    float* stage_grad(int64_t set);
    // Floats of those buffers for a micro-batch of batch x seq_len.
    int64_t stage_numel(int64_t batch, int64_t seq_len) const;
    // The activation sets of chunk `chunk`: [first, first + count).
    struct SetRange {
        int64_t first = 0, count = 0;
    };
    SetRange stage_sets(int64_t chunk) const;
    // The chunks this rank runs (the whole model without pipelining).
    const std::vector<PipelineChunk>& pipeline_chunks() const;
    // Whether one of them is the first, with the embedding (the first stage; every rank without
    // pipelining).
    bool runs_embedding() const;
    // The MTP modules embed with the main model's embedding, which is on the first stage: the
    // stage of the MTP modules holds a copy, as Megatron-LM shares embeddings between stages. On
    // both stages this is true; param("embed") is initialized alike on both, its gradient is
    // never announced to the GradReadyCallback, and the caller adds the other stage's gradient
    // to grad("embed") before the gradient sync, so both copies take the same updates. (Its span
    // counts twice as many copies, so the gradient norm counts it once.)
    bool shares_embedding() const;
    // Forward only (validation, sampling). Afterwards logits() holds the (B*S, V) main-head logits.
    // Touches neither the gradients nor the load counts.
    MicroBatchLosses forward(const int32_t* tokens, const int32_t* targets, int64_t batch,
                             int64_t seq_len);
    // The main head's logits after forward(); after forward_backward() the buffer holds gradients.
    // With tensor parallelism, this rank's vocabulary part: (B*S, V/tp), columns from
    // rank * V/tp.
    const float* logits() const;
    // grads() = 0: the trainer calls it once per optimizer step, before the first micro-batch.
    void zero_grads();
    // The experts chosen by the last forward or forward_backward: for each MoE layer in
    // expert_load()'s order, its (B*S, K) ids. For tests and routing analysis; allocates.
    std::vector<int32_t> last_routing() const;

    // The aux-loss-free balancing step, after each optimizer step:
    // bias_e += gamma * sign(mean load - load_e) from the loads counted since the last call,
    // summed over ModelParallel::load first (a collective over it), so every rank moves its bias
    // alike.
    void update_router_bias(float gamma);
    // Sums the loads counted since the last bias update over ModelParallel::load (a collective
    // over it; once per step: later calls before the update do nothing). update_router_bias()
    // does it itself; call it earlier to read the global loads from expert_load().
    void sum_expert_load_over_ranks();
    // The loads counted on this rank, or over ModelParallel::load after sum_expert_load_over_ranks.
    ExpertLoadStats expert_load() const;
    // Seconds this rank spent in the routed experts' computation since the last call (MoE layers'
    // grouped GEMMs and SwiGLU, forward and backward; host time, exact on the CPU backend).
    double take_expert_compute_s();
    // The expert-side rows (token copies) this rank's routed experts computed since the last
    // call, per MoE layer (main layers, then MTP blocks; 0 for one another pipeline stage holds):
    // what the dispatch brought them, counted once per backward. rows_per_moe_layer holds
    // num_moe_layers() values.
    void take_expert_rows(std::span<int64_t> rows_per_moe_layer);
    int64_t num_moe_layers() const;  // 0 without routed experts

    const ModelConfig& config() const;
    const LossWeights& loss_weights() const;
    // The backend the model was built for: params() and grads() live in its memory.
    Backend& backend() const;
    // params() and grads() are num_params() floats each: the entries of param_entries() back to
    // back, no padding, so num_params() is the exact parameter count (main model + MTP).
    float* params();
    float* grads();
    int64_t num_params() const;
    const std::vector<ParamEntry>& param_entries() const;
    // The flat buffer as gradient synchronization sees it: one span per entry, with its replica
    // group (the routed experts: the expert-data-parallel group; the rest: data-parallel) and,
    // for a parameter replicated over the TP group, its tp identical copies outside that group
    // (with redundant experts, one span per expert slot: its expert's replicas are its copies).
    std::vector<parallel::ParamSpan> param_spans() const;
    // Which routed experts this rank holds (with redundant experts: which physical slots).
    ExpertShard expert_shard() const;
    // With redundant experts, the logical expert each physical slot of MoE layer moe_layer holds
    // (layers in expert_load()'s order); else null.
    const parallel::ExpertPlacement* expert_placement(int64_t moe_layer) const;
    // The MoE layer whose routed experts param_name is a tensor of, with redundant experts; else
    // -1.
    int64_t moe_layer_of(const std::string& param_name) const;
    // With redundant experts: the next forward_backward (the step's last micro-batch, when the
    // gradients are whole) sums each replicated expert's gradients over its replicas, layer by
    // layer before announcing them ready (a collective over the EP group), so that the replicas
    // take the same update. Nothing without redundant experts.
    void arm_replica_gradient_sum();
    // With redundant experts: installs a new placement of the same shape, after the caller moved
    // the slots' weights to it (train/expert_balance.h); the dispatcher routes by it from the next
    // forward. Allocates nothing.
    void set_expert_placement(int64_t moe_layer, const parallel::ExpertPlacement& placement);
    // Only the replicas' shares (ExpertPlacement::slot_share) of the layer's placement: a new
    // split of the tokens over the same slots, which moves no weights.
    void set_expert_shares(int64_t moe_layer, std::span<const int32_t> slot_share);
    TensorView param(const std::string& name) const;
    TensorView grad(const std::string& name) const;
    size_t planned_bytes() const;  // all arenas together, for the peak-RSS report
    // The MoE layers' dispatcher (its kind, byte and spread statistics); null without routed
    // experts.
    parallel::ExpertDispatcher* expert_dispatcher() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// The memory one rank plans for training, by category, from the planners the engine uses: the
// parameter table a Model builds, the activation arena's plan (bound as a Model binds it), the
// dispatcher's rows and exchange buffers. Allocates nothing of that size (for moetron info).
struct RankMemoryPlan {
    size_t parameters = 0;       // fp32 weights: this rank's experts and TP share, MTP included
    size_t gradients = 0;        // as many
    size_t optimizer_state = 0;  // AdamW m and v, ZeRO-1 shard (without bucket padding)
    size_t activations = 0;      // the activation arena, without the expert-side buffers
    size_t expert_side = 0;      // the MoE buffers of expert-side rows (is_expert_side_buffer)
    size_t communication = 0;    // the MoE dispatcher's (exchange buffers; one rank: indices)
    int64_t expert_rows = 0;     // R per MoE layer, planned for the capacity factor
    int64_t worst_case_expert_rows = 0;  // R per MoE layer with capacity factor 0
};
// For a rank of `topology` (ZeRO-1, when zero1, shards the dense moments over dp and the routed
// experts' over edp) running its MoE layers with `moe`.
RankMemoryPlan plan_rank_memory(const ModelConfig& config, const ModelRuntime& runtime,
                                const parallel::Topology& topology, const MoeSettings& moe,
                                bool zero1);

}  // namespace moetron
