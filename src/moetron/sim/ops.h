// The operations one GPU runs for one layer and one micro-batch: FLOPs, HBM bytes, kernel
// launches, saved activations and communication, forward and backward, derived from the
// ModelConfig and the layout. This is sim/'s own per-op breakdown of model/flops: each op also
// carries the FLOPs the Megatron-LM convention counts for it (model_flops), and the test
// test_sim_ops checks that they add up to flops_per_token(). Executed FLOPs can be higher:
// MLA's down-projections are duplicated on every TP rank, flash attention's backward recomputes
// QK^T (2.5x the forward, where the convention counts 2x), the router GEMM is not counted.
//
// Names: T tokens of a micro-batch on this rank (sequence-parallel shard), Tf the tokens a
// column-parallel GEMM sees after the TP all-gather, R = T*K expert rows this rank processes
// (balanced routing; the busiest rank gets more, see OpSettings), h = heads per TP rank.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "moetron/model/config.h"
#include "moetron/sim/collectives.h"
#include "moetron/sim/hardware.h"
#include "moetron/sim/layout.h"

namespace moetron::sim {

enum class OpKind : uint8_t {
    gemm,          // dense GEMM (also the router GEMM, at the tf32 rate)
    grouped_gemm,  // one GEMM per local expert
    attention,     // flash attention core
    memory,        // memory-bound: norms, activations, quantization, permutes, residuals
    copy,          // a plain copy, at the stream rate (a split backward's stash)
    comm_tp,       // TP all-gather / reduce-scatter (sequence parallel)
    comm_ep,       // MoE dispatch / combine
    comm_cp,       // context-parallel K/V exchange (overlaps the attention core)
    sync,          // device-to-host synchronization (dropless MoE reads tokens per expert)
};

// Recompute modules (Megatron-LM's --recompute-modules names) plus full-layer recompute.
enum class Module : uint8_t {
    none,
    layernorm,
    mla_up_proj,
    core_attn,
    mlp,  // the dense layers' MLP
    moe_act,
    shared_expert,
    moe,  // the whole routed-expert part: router, dispatch, experts, combine
    count,
};
inline constexpr int kNumModules = static_cast<int>(Module::count);

struct Recompute {
    bool full = false;  // keep only each layer's input, rerun the whole forward in backward
    std::array<bool, kNumModules> modules{};
    bool has(Module m) const { return modules[static_cast<int>(m)]; }
};
// "none", "full", or a comma list of modules ("mla_up_proj,mlp,moe_act").
Recompute parse_recompute(const std::string& text);
std::string recompute_name(const Recompute& r);

struct Op {
    std::string name;
    OpKind kind = OpKind::memory;
    Module module = Module::none;
    bool in_moe_block = false;     // recomputed by "moe" as well as by its own module
    bool graphable = true;         // static shapes: a partial CUDA graph can capture it
    bool is_recompute = false;     // a forward op rerun in backward
    bool weight_gradient = false;  // a wgrad GEMM: the W pass of zero-bubble schedules
    // The copy of a deferred wgrad's two operands into the engine's stash, which B makes only
    // when the backward is split (kernels/split_backward_backend.h): priced in B, left out of
    // the unsplit backward.
    bool split_backward_stash = false;
    // An output head's op: the engine runs the head's backward right after its loss, in the
    // forward pass (model_passes.cpp, head_loss; the logits are never kept), so its backward ops
    // sit in the forward list after its forward ops, and recompute reruns none of it.
    bool fused_head = false;
    // A wgrad GEMM's inputs (the forward's GEMM input and the output gradient B computed), which
    // stay in memory until the W pass runs when a zero-bubble schedule defers it.
    double weight_gradient_input_bytes = 0;

    double flops = 0;                        // executed
    double model_flops = 0;                  // counted by the Megatron-LM convention
    double bytes = 0;                        // HBM bytes read + written
    double exps = 0;                         // softmax exponentials (attention)
    double work_per_query = 0;               // attention: S_kv (Dqk + Dv) per query
    double m = 0, n = 0, k = 0, groups = 1;  // GEMM shape (grouped: m = rows per expert)
    MathRate rate = MathRate::bf16;          // GEMMs: the tensor cores' rate class they run at
    bool attention_backward = false;
    int kernels = 1;

    CommCost comm;              // comm_* ops
    bool overlappable = false;  // comm_tp / comm_cp: a neighbouring GEMM can hide it

    double saved_bytes = 0;         // activations kept for backward unless recomputed
    double saved_always_bytes = 0;  // kept when the op's own module is recomputed (its inputs);
                                    // dropped when an enclosing region (moe, full) is
};

enum class BlockKind : uint8_t { dense_layer, moe_layer, embedding, output_head, mtp_extra };

struct OpSettings {
    Precision precision = Precision::bf16;  // the recipe: linear layers and experts; the
                                            // attention core and the head stay bf16
    parallel::DispatchKind dispatcher = parallel::DispatchKind::two_tier;
    // The tokens dispatched to the experts in the recipe's GEMM format (quantized before the
    // send), else as the activations are (bf16; fp32 under the fp32 recipe).
    bool dispatch_in_recipe = false;
    // The MoE SwiGLU's input (fc1's output) kept for backward in the GEMM format, not bf16
    // (DeepSeek-V3 report sec. 3.3.2: cached in FP8, the output recomputed).
    bool low_precision_swiglu_input = false;
    bool cuda_graph_moe_sync_free = false;  // full CUDA graphs: no device-host sync in MoE
    // Tokens on the busiest EP rank over the mean from the experts' loads (1: balanced): scales
    // that rank's expert rows and the receive side of its dispatch and combine.
    double expert_load_imbalance = 1;
    int64_t redundant_experts = 0;  // spare expert slots over the EP group: (E + R) / ep local
};

struct OpContext {
    const ModelConfig* model = nullptr;
    const ClusterSpec* cluster = nullptr;
    parallel::Layout layout;
    LayoutPlacement placement;
    int64_t seq_len = 0;
    int64_t micro_batch = 1;
    OpSettings settings;
};

struct BlockOps {
    BlockKind kind = BlockKind::dense_layer;
    std::vector<Op> forward;
    std::vector<Op> backward;      // without recompute; apply_recompute() adds the reruns
    double layer_input_bytes = 0;  // what full recompute keeps
};

// Forward and backward ops of one block for one micro-batch on one rank.
BlockOps build_block_ops(const OpContext& ctx, BlockKind kind);

// Backward with the recomputed forward ops put in front (marked is_recompute), and the
// activation bytes the block keeps between its forward and backward: on the GPU, or in host
// memory for the modules in `offload` (Megatron-LM's fine-grained activation offloading, same
// module names; "moe" offloads everything of the routed-expert part). A recomputed module has
// nothing to offload.
struct RecomputedBlock {
    std::vector<Op> backward;
    double saved_bytes = 0;
    double offloaded_bytes = 0;
    // What a deferred W pass holds after B freed the saved activations (sum of its wgrad
    // GEMMs' inputs).
    double weight_gradient_input_bytes = 0;
};
RecomputedBlock apply_recompute(const BlockOps& block, const Recompute& recompute,
                                const Recompute& offload = Recompute{});

}  // namespace moetron::sim
