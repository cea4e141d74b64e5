// sim/memory and sim/fit: the parameter, gradient and optimizer terms against Megatron-LM's own
// estimator (megatron/training/theoretical_memory_usage.py, compute_weight_and_optimizer_memory,
// re-derived here from its formula), the precision-aware optimizer's dtypes, activation
// offloading, and the cheapest change an over-budget configuration is told about.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>

#include "moetron/core/error.h"
#include "moetron/model/config.h"
#include "moetron/model/flops.h"
#include "moetron/sim/fit.h"
#include "moetron/sim/memory.h"
#include "moetron/sim/step.h"

namespace moetron::sim {
namespace {

const std::string kRoot = MOETRON_SOURCE_DIR;

// Megatron-LM's estimator for a DeepSeek-V3-shaped model (MLA with q LoRA, RMSNorm, SwiGLU,
// untied embeddings, MTP layers shaped like the last layer): parameters of the most loaded
// shard (1/pp of the transformer block + the MTP block + the embedding, over tp; the output
// layer too when pp is 1) times 18 bytes, or 6 + 12/dp with the distributed optimizer. It
// ignores expert parallelism.
struct MegatronArgs {
    int64_t tp = 1, pp = 1, dp = 1;
    bool distributed_optimizer = true;
};

double megatron_weight_and_optimizer_bytes(const ModelConfig& m, const MegatronArgs& a) {
    const double D = static_cast<double>(m.hidden_size), H = m.num_attention_heads;
    const double qk = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, v = m.v_head_dim;
    const double norm = 1;  // RMSNorm
    const double attn = m.q_lora_rank * (D + H * (qk + rope) + norm) +
                        m.kv_lora_rank * (D + H * (qk + v) + norm) + D * rope + H * v * D;
    const double dense_layer = 2 * D * (m.intermediate_size * 1.5 + norm) + attn;
    const double moe_layer = 2 * D *
                                 (m.moe_intermediate_size * m.n_routed_experts * 1.5 +
                                  m.n_shared_experts * m.moe_intermediate_size * 1.5 + norm) +
                             attn;
    const double dense_layers = static_cast<double>(m.first_k_dense_replace);
    const double moe_layers = static_cast<double>(m.num_hidden_layers) - dense_layers;
    const double block = dense_layer * dense_layers + moe_layer * moe_layers + norm * D;
    const double mtp = moe_layer * static_cast<double>(m.num_nextn_predict_layers);
    const double embedding = D * static_cast<double>(m.vocab_size);
    double shard =
        (block / static_cast<double>(a.pp) + mtp + embedding) / static_cast<double>(a.tp);
    if (a.pp == 1) shard += embedding / static_cast<double>(a.tp);  // untied output layer
    const double bytes_per_param =
        a.distributed_optimizer ? 6 + 12.0 / static_cast<double>(a.dp) : 18;
    return shard * bytes_per_param;
}

// The same shard in the simulator's blocks. Megatron's formula leaves out the router (E x D
// gate and E biases per MoE layer) and MTP's own projection and norms, and it splits the
// routed experts over TP (expert TP = TP), where the published recipes (and the simulator)
// keep expert TP at 1: experts whole on each TP rank, their optimizer state sharded over
// dp x tp instead. It also splits every other tensor over TP, where the simulator counts what
// the engine allocates: norms, router, MLA's down-projections and MTP's projection whole on
// each TP rank.
BlockParams shard_params(const ModelConfig& m, const parallel::Layout& l) {
    BlockParams sum, layers;
    auto add = [&](BlockParams& to, BlockKind k, double times) {
        const BlockParams b = block_params_per_gpu(m, k, l);
        to.dense += times * b.dense;
        to.expert += times * b.expert;
    };
    const double dense_layers = static_cast<double>(m.first_k_dense_replace);
    add(layers, BlockKind::dense_layer, dense_layers);
    add(layers, BlockKind::moe_layer, static_cast<double>(m.num_hidden_layers) - dense_layers);
    sum.dense = layers.dense / static_cast<double>(l.pp);
    sum.expert = layers.expert / static_cast<double>(l.pp);
    add(sum, BlockKind::embedding, 1);
    add(sum, BlockKind::moe_layer, static_cast<double>(m.num_nextn_predict_layers));
    add(sum, BlockKind::mtp_extra, static_cast<double>(m.num_nextn_predict_layers));
    if (l.pp == 1) add(sum, BlockKind::output_head, 1);
    return sum;
}

double left_out_by_megatron(const ModelConfig& m, const parallel::Layout& l) {
    const double tp = static_cast<double>(l.tp);
    const double router = count_layer_parameters(m, true).router;
    const double moe_layers = static_cast<double>(m.num_hidden_layers - m.first_k_dense_replace);
    const double mtp_own = count_mtp_module_parameters(m, 0) -
                           count_layer_parameters(m, m.mtp_layer_is_moe(0)).total();
    // The output head's final norm is in Megatron's transformer block, here in the head.
    const double final_norm = static_cast<double>(m.hidden_size);
    return router * (moe_layers / static_cast<double>(l.pp) + m.num_nextn_predict_layers) / tp +
           mtp_own / tp - (l.pp == 1 ? 0.0 : final_norm / static_cast<double>(l.pp) / tp);
}

// Megatron's defaults: bf16 weights, fp32 main gradients, fp32 main parameters and moments.
MemoryOptions megatron_defaults() {
    MemoryOptions o;
    o.optimizer = {4, 4, 4, 4};
    return o;
}

TEST(SimMemory, WeightsGradientsOptimizerMatchMegatronsEstimator) {
    const ModelConfig m = load_model_config(kRoot + "/configs/models/dsv3-671b.toml");
    struct Case {
        const char* layout;
        int64_t gpus;
        bool distributed;
    };
    for (const Case& c : {Case{"tp1.pp1.ep1", 64, true}, Case{"tp2.pp8.vpp4.ep1", 1024, true},
                          Case{"tp4.pp16.ep1", 512, true}, Case{"tp8.pp4.ep1", 32, false},
                          Case{"tp1.pp2.ep1", 256, false}}) {
        const parallel::Layout l = parallel::parse_layout(c.layout, c.gpus);
        MemoryOptions o = megatron_defaults();
        o.distributed_optimizer = c.distributed;
        const BlockParams sp = shard_params(m, l);
        parallel::Layout without_tp = l;
        without_tp.tp = 1;
        const double replicated_over_tp =
            sp.dense - shard_params(m, without_tp).dense / static_cast<double>(l.tp);
        const MemoryBreakdown mb = static_memory(sp, l, Precision::bf16, o, 0);
        const double ours = mb.weights_bytes + mb.grads_bytes + mb.optimizer_bytes;
        const double megatron =
            megatron_weight_and_optimizer_bytes(m, {l.tp, l.pp, l.dp, c.distributed});
        const double bytes_per_param = c.distributed ? 6 + 12.0 / l.dp : 18;
        // Experts whole on each TP rank: their weights and gradients (6 bytes) tp times, and
        // their optimizer state too unless the distributed optimizer shards it over dp x tp.
        const double expert_bytes_tp_times = c.distributed ? 6 : 18;
        const double expected =
            megatron + (left_out_by_megatron(m, l) + replicated_over_tp) * bytes_per_param +
            sp.expert * (1 - 1.0 / static_cast<double>(l.tp)) * expert_bytes_tp_times;
        EXPECT_NEAR(ours / expected, 1.0, 1e-9)
            << c.layout << " on " << c.gpus << ": " << ours / 1e9 << " GB vs Megatron "
            << megatron / 1e9 << " GB";
    }
}

TEST(SimMemory, ExpertParallelismAndPrecisionAwareOptimizer) {
    // Megatron's formula with the routed experts split over ep and their optimizer state over
    // expert-dp, and with the precision-aware optimizer's dtypes.
    const ModelConfig m = load_model_config(kRoot + "/configs/models/dsv3-671b.toml");
    const parallel::Layout l = parallel::parse_layout("tp2.pp8.vpp4.ep64", 1024);  // dp 64, edp 2
    const BlockParams sp = shard_params(m, l);
    const double routed = count_layer_parameters(m, true).moe_routed;
    const double moe_layers_here = 58.0 / 8 + 1;
    EXPECT_NEAR(sp.expert, routed * moe_layers_here / 64, 1);
    struct Dtypes {
        OptimizerPrecision p;
    };
    for (const OptimizerPrecision& p :
         {OptimizerPrecision{4, 4, 4, 4}, OptimizerPrecision{4, 4, 2, 2},
          OptimizerPrecision{2, 4, 2, 2}, OptimizerPrecision{2, 2, 1, 1}}) {
        MemoryOptions o;
        o.optimizer = p;
        const MemoryBreakdown mb = static_memory(sp, l, Precision::bf16, o, 0);
        const double params = sp.dense + sp.expert;
        EXPECT_DOUBLE_EQ(mb.weights_bytes, 2 * params);
        EXPECT_DOUBLE_EQ(mb.grads_bytes, p.main_grad_bytes * params);
        EXPECT_NEAR(mb.optimizer_bytes,
                    (p.main_param_bytes + p.exp_avg_bytes + p.exp_avg_sq_bytes) *
                        (sp.dense / 64 + sp.expert / 2),
                    1);
    }
    // fp8 primary weights hold the row- and column-wise copies only; otherwise bf16 beside them.
    MemoryOptions o;
    EXPECT_DOUBLE_EQ(static_memory(sp, l, Precision::fp8_blockwise, o, 0).weights_bytes,
                     2 * (sp.dense + sp.expert));
    o.low_precision_primary_weights = false;
    EXPECT_DOUBLE_EQ(static_memory(sp, l, Precision::fp8_blockwise, o, 0).weights_bytes,
                     4 * (sp.dense + sp.expert));
}

TEST(SimMemory, DtypeNamesAreCheckedWithAMessage) {
    MemoryFlags f;
    f.exp_avg = "int4";
    try {
        (void)memory_options_from_flags(f);
        FAIL() << "int4 accepted";
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()),
                  "--exp-avg-dtype must be fp32, bf16, fp16 or fp8, got 'int4'");
    }
    f = MemoryFlags{};
    f.offload = "full";
    EXPECT_THROW((void)memory_options_from_flags(f), Error);
}

struct Gb300 {
    ModelConfig dsv3 = load_model_config(kRoot + "/configs/models/dsv3-671b.toml");
    ClusterSpec gb300 = load_cluster_spec(kRoot + "/configs/clusters/gb300-nvl72.toml");
    ClusterSpec h100 = load_cluster_spec(kRoot + "/configs/clusters/h100-hgx.toml");
    SimOptions options() const {
        SimOptions o;
        o.precision = Precision::mxfp8;
        o.global_batch = 4096;
        o.count_mtp = false;
        return o;
    }
};

TEST(SimMemory, OffloadingMovesActivationsToTheHost) {
    Gb300 f;
    const parallel::Layout l = parallel::parse_layout("tp1.pp2.vpp4.ep32", 256);
    const StepResult kept = simulate_step_unchecked(f.dsv3, f.gb300, l, f.options());
    SimOptions o = f.options();
    o.memory.offload = parse_recompute("moe");
    const StepResult offloaded = simulate_step_unchecked(f.dsv3, f.gb300, l, o);
    EXPECT_EQ(kept.memory.offloaded_bytes, 0);
    EXPECT_GT(offloaded.memory.offloaded_bytes, 10e9);
    EXPECT_LT(offloaded.memory.activations_bytes,
              kept.memory.activations_bytes - 0.8 * offloaded.memory.offloaded_bytes);
    // What is recomputed has nothing to offload.
    o.recompute = parse_recompute("moe");
    EXPECT_EQ(simulate_step_unchecked(f.dsv3, f.gb300, l, o).memory.offloaded_bytes, 0);
}

// Offloading's copies run on a copy engine beside the compute: GB300's NVLink-C2C (225 GB/s per
// GPU) hides the MoE activations' round trip behind the forward and backward; a B200 on PCIe 5.0
// (55 GB/s) computes as fast but copies at a quarter of the speed, so its step waits, and says
// how long. A GPU without a host link figure refuses the option.
TEST(SimMemory, OffloadingCostsTheCopyTimeItCannotHide) {
    Gb300 f;
    const ClusterSpec b200 = load_cluster_spec(kRoot + "/configs/clusters/b200-hgx.toml");
    const parallel::Layout l = parallel::parse_layout("tp1.pp8.ep8", 256);  // EP inside an HGX node
    SimOptions o = f.options();
    o.cuda_graphs = CudaGraphs::full;  // the compute, not the host, sets the pace
    const StepResult gb300_kept = simulate_step_unchecked(f.dsv3, f.gb300, l, o);
    const StepResult b200_kept = simulate_step_unchecked(f.dsv3, b200, l, o);
    o.memory.offload = parse_recompute("moe");
    const StepResult gb300_offloaded = simulate_step_unchecked(f.dsv3, f.gb300, l, o);
    const StepResult b200_offloaded = simulate_step_unchecked(f.dsv3, b200, l, o);
    std::printf(
        "  offloading moe: GB300 step %.2f -> %.2f s, B200 %.2f -> %.2f s (%.2f s exposed)\n",
        gb300_kept.step_time_s, gb300_offloaded.step_time_s, b200_kept.step_time_s,
        b200_offloaded.step_time_s, b200_offloaded.breakdown.offload_exposed_s);
    EXPECT_LT(gb300_offloaded.step_time_s, 1.01 * gb300_kept.step_time_s);
    EXPECT_GT(b200_offloaded.breakdown.offload_exposed_s, 0.0);
    EXPECT_GT(b200_offloaded.step_time_s, 1.05 * b200_kept.step_time_s);
    EXPECT_NEAR(b200_offloaded.breakdown.total_s(), b200_offloaded.step_time_s,
                1e-9 * b200_offloaded.step_time_s);

    ClusterSpec no_link = b200;
    no_link.gpu.host_link_bytes_per_s = 0;
    try {
        (void)simulate_step_unchecked(f.dsv3, no_link, l, o);
        ADD_FAILURE() << "offloading without a host link was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("host_link_gbytes_per_s"), std::string::npos)
            << e.what();
    }
}

TEST(SimMemory, Fp8SwigluInputCacheShrinksTheExpertActivations) {
    // DeepSeek-V3 (sec. 3.3.2) keeps the MoE SwiGLU input in FP8 and recomputes its output:
    // fc1's output, 8 rows x 2 x 2048 per token, costs 1 byte per element instead of 2.
    Gb300 f;
    SimOptions o = f.options();
    o.precision = Precision::fp8_blockwise;
    o.recompute = parse_recompute("moe_act");
    const parallel::Layout l = parallel::parse_layout("tp1.pp16.ep64", 2048);
    const StepResult bf16_cache = simulate_step_unchecked(f.dsv3, f.h100, l, o);
    o.memory.low_precision_swiglu_input = true;
    const StepResult fp8_cache = simulate_step_unchecked(f.dsv3, f.h100, l, o);
    const double saved_per_micro_batch_layer = 4096.0 * 8 * 2 * 2048;  // one byte less each
    const double drop = bf16_cache.memory_per_stage[1].activations_bytes -
                        fp8_cache.memory_per_stage[1].activations_bytes;
    // Stage 1 of 16 holds 4 MoE layers of 16 micro-batches, rows inflated by routing noise.
    EXPECT_GT(drop, 0.95 * 16 * 4 * saved_per_micro_batch_layer);
    EXPECT_LT(drop, 1.10 * 16 * 4 * saved_per_micro_batch_layer);
}

TEST(SimMemory, InterleavingHoldsMoreMicroBatchesThanOneFOneB) {
    Gb300 f;
    const StepResult plain = simulate_step_unchecked(
        f.dsv3, f.gb300, parallel::parse_layout("tp1.pp4.ep32", 256), f.options());
    const StepResult interleaved = simulate_step_unchecked(
        f.dsv3, f.gb300, parallel::parse_layout("tp1.pp4.vpp4.ep32", 256), f.options());
    // Stage 0 of 1F1B holds pp micro-batches of its layers; interleaved, (1 + (p-1)/(p v)) as
    // many (Megatron's interleaved_schedule_memory_penalty).
    const double ratio = interleaved.memory_per_stage[0].activations_bytes /
                         plain.memory_per_stage[0].activations_bytes;
    EXPECT_GT(ratio, 1.1);
    EXPECT_LT(ratio, 1.0 + 3.0 / 16 + 0.15);
}

// A zero-bubble schedule defers W: after B frees a micro-batch's activations, its wgrad GEMMs'
// inputs (the forward's GEMM inputs and B's output gradients) wait for W. ZB-H1 (event
// simulated) therefore holds more than 1F1B on stage 0, by less than the W inputs of p - 1
// micro-batches. DualPipe's cool-down defers min(s, pp-1-s) + 1 W's on rank s (DeepSeek's
// dualpipe.py, steps 6-8): with full recompute, where a micro-batch keeps only its layer
// inputs, the W inputs of rank 1's two deferred W's outweigh its pp + 1 micro-batches.
TEST(SimMemory, DeferredWeightGradientsHoldTheirInputs) {
    Gb300 f;
    const parallel::Layout l = parallel::parse_layout("tp1.pp4.ep32", 256);
    const StepResult one_f_one_b = simulate_step_unchecked(f.dsv3, f.gb300, l, f.options());
    SimOptions o = f.options();
    o.pipeline_schedule = PipelineSchedule::zero_bubble_h1;
    const StepResult zb = simulate_step_unchecked(f.dsv3, f.gb300, l, o);
    const double plain_bytes = one_f_one_b.memory_per_stage[0].activations_bytes;
    const double zb_bytes = zb.memory_per_stage[0].activations_bytes;
    std::printf("  stage 0 activations: 1F1B %.1f GB, ZB-H1 %.1f GB\n", plain_bytes / 1e9,
                zb_bytes / 1e9);
    EXPECT_GT(zb_bytes, 1.02 * plain_bytes);
    EXPECT_LT(zb_bytes, 1.0 * (1 + 3.0 / 4) * plain_bytes);

    SimOptions d = f.options();
    d.precision = Precision::fp8_blockwise;
    d.global_batch = 15360;
    d.moe_overlap = MoeOverlap::dual;
    d.pipeline_schedule = PipelineSchedule::dualpipe;
    d.recompute = parse_recompute("full");
    const StepResult dualpipe =
        simulate_step_unchecked(f.dsv3, f.h100, parallel::parse_layout("tp1.pp16.ep64", 2048), d);
    // Stage 1 holds 4 MoE layers of each direction; full recompute keeps each layer's bf16 input.
    const double layer_inputs = 4 * 4096.0 * 7168 * 2;
    const double in_flight_only = 17 * layer_inputs;
    const double stage1 = dualpipe.memory_per_stage[1].activations_bytes;
    std::printf("  DualPipe stage 1, full recompute: %.1f GB (17 layer inputs: %.1f GB)\n",
                stage1 / 1e9, in_flight_only / 1e9);
    EXPECT_GT(stage1, 2 * in_flight_only);
}

TEST(SimMemory, OverBudgetNamesTheCheapestChangeThatFits) {
    Gb300 f;
    SimOptions o;
    o.precision = Precision::fp8_blockwise;
    o.global_batch = 8192;
    o.memory.optimizer = {4, 4, 4, 4};
    const parallel::Layout l = parallel::parse_layout("tp2.pp8.vpp4.ep64", 1024);
    const std::optional<FitChange> fit = find_cheapest_fit(f.dsv3, f.h100, l, o);
    ASSERT_TRUE(fit.has_value());
    EXPECT_LE(fit->memory_bytes, fit->capacity_bytes);
    std::string msg;
    try {
        (void)simulate_step(f.dsv3, f.h100, l, o);
    } catch (const Error& e) {
        msg = e.what();
    }
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("The cheapest change that fits: " + fit->change), std::string::npos) << msg;
    EXPECT_EQ(msg.find(".cpp:"), std::string::npos) << "a user's mistake has no source location";
}

}  // namespace
}  // namespace moetron::sim
