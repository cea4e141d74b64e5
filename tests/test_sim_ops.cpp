// sim/ops and sim/costs: the per-op FLOPs add up to model/flops' total (the one source of
// truth), recompute moves forward ops into the backward and drops saved activations, and the
// efficiency curves and roofline behave.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/model/config.h"
#include "moetron/model/flops.h"
#include "moetron/sim/costs.h"
#include "moetron/sim/hardware.h"
#include "moetron/sim/layout.h"
#include "moetron/sim/ops.h"
#include "moetron/sim/timeline.h"

namespace moetron::sim {
namespace {

const std::string kRoot = MOETRON_SOURCE_DIR;

struct Fixture {
    ModelConfig model = load_model_config(kRoot + "/configs/models/dsv3-671b.toml");
    ClusterSpec cluster = load_cluster_spec(kRoot + "/configs/clusters/gb300-nvl72.toml");

    OpContext context(const char* layout, int64_t gpus, int64_t seq, int64_t mbs) const {
        OpContext ctx;
        ctx.model = &model;
        ctx.cluster = &cluster;
        ctx.layout = parallel::parse_layout(layout, gpus);
        ctx.placement = place_layout(ctx.layout, cluster.scale_up.domain_gpus);
        ctx.seq_len = seq;
        ctx.micro_batch = mbs;
        ctx.settings.precision = Precision::mxfp8;
        return ctx;
    }
};

double model_flops(const BlockOps& b) {
    double sum = 0;
    for (const Op& op : b.forward) sum += op.model_flops;
    for (const Op& op : b.backward) sum += op.model_flops;
    return sum;
}

// Sum of the ops' convention FLOPs for a whole model, per token of the micro-batch.
double per_token_from_ops(const Fixture& f, const OpContext& ctx, bool mtp) {
    const ModelConfig& m = f.model;
    double sum = model_flops(build_block_ops(ctx, BlockKind::embedding)) +
                 model_flops(build_block_ops(ctx, BlockKind::output_head));
    const double dense = model_flops(build_block_ops(ctx, BlockKind::dense_layer));
    const double moe = model_flops(build_block_ops(ctx, BlockKind::moe_layer));
    sum += static_cast<double>(m.num_dense_layers()) * dense +
           static_cast<double>(m.num_moe_layers()) * moe;
    if (mtp) sum += model_flops(build_block_ops(ctx, BlockKind::mtp_extra)) + moe;
    // Ops are per rank: scale back to the whole micro-batch, then per token.
    const double ranks = static_cast<double>(ctx.layout.tp * ctx.layout.cp);
    return sum * ranks / static_cast<double>(ctx.micro_batch * ctx.seq_len);
}

TEST(SimOps, PerOpFlopsAddUpToModelFlops) {
    Fixture f;
    for (const char* layout : {"tp1.ep8", "tp2.ep8", "tp2.cp2.ep8", "tp8.ep64"}) {
        for (int64_t seq : {1024, 4096}) {
            for (bool mtp : {false, true}) {
                const OpContext ctx = f.context(layout, 64, seq, 2);
                const double want = flops_per_token(f.model, seq, mtp).total;
                EXPECT_NEAR(per_token_from_ops(f, ctx, mtp) / want, 1.0, 1e-12)
                    << layout << " seq " << seq << " mtp " << mtp;
            }
        }
    }
}

// The zero-bubble schedule's W pass holds what the engine defers
// (kernels/split_backward_backend.h): the layers' GEMM weight gradients, not the router's, the
// head's or, under TP, MTP's eh_proj's.
TEST(SimOps, ZeroBubbleDefersTheWeightGradientsTheEngineDefers) {
    Fixture f;
    auto deferred = [](const BlockOps& b) {
        std::string names;
        for (const Op& op : b.backward) {
            if (op.weight_gradient) names += op.name + " ";
        }
        return names;
    };
    for (const char* layout : {"tp1.ep8", "tp2.ep8"}) {
        const OpContext ctx = f.context(layout, 64, 1024, 1);
        const std::string head = deferred(build_block_ops(ctx, BlockKind::output_head));
        EXPECT_EQ(head, "") << layout;
        const std::string moe = deferred(build_block_ops(ctx, BlockKind::moe_layer));
        EXPECT_NE(moe.find("attn.o_proj.wgrad"), std::string::npos) << moe;
        EXPECT_EQ(moe.find("moe.router"), std::string::npos) << moe;
        const std::string mtp = deferred(build_block_ops(ctx, BlockKind::mtp_extra));
        EXPECT_EQ(mtp.find("mtp.eh_proj.wgrad") != std::string::npos, ctx.layout.tp == 1)
            << layout << ": " << mtp;
        EXPECT_EQ(mtp.find("mtp.head"), std::string::npos) << mtp;
    }
}

// A split backward copies each deferred wgrad's two operands into a stash (the engine's
// kernels/split_backward_backend.cpp): B pays for the copies, the unsplit backward does not.
TEST(SimOps, SplitBackwardPaysForTheStashCopiesInB) {
    Fixture f;
    const OpContext ctx = f.context("tp1.ep8", 64, 1024, 1);
    const BlockOps moe = build_block_ops(ctx, BlockKind::moe_layer);
    double deferred_bytes = 0, stash_bytes = 0;
    int deferred = 0, stashes = 0;
    for (const Op& op : moe.backward) {
        if (op.weight_gradient) {
            deferred_bytes += op.weight_gradient_input_bytes;
            ++deferred;
        }
        if (op.split_backward_stash) {
            EXPECT_EQ(op.kind, OpKind::copy) << op.name;
            EXPECT_FALSE(op.weight_gradient) << op.name;
            stash_bytes += op.bytes;
            ++stashes;
        }
    }
    EXPECT_GT(deferred, 0);
    EXPECT_EQ(stashes, deferred);
    EXPECT_DOUBLE_EQ(stash_bytes, 2 * deferred_bytes);  // each operand read and written once

    auto stash_ops = [](const OpList& list) {
        int n = 0;
        for (const Op* op : list.ops) n += op->split_backward_stash ? 1 : 0;
        return n;
    };
    OpList unsplit, input_part, weight_part;
    unsplit.append(moe.backward);
    input_part.append_part(moe.backward, false);
    weight_part.append_part(moe.backward, true);
    EXPECT_EQ(stash_ops(unsplit), 0);
    EXPECT_EQ(stash_ops(input_part), stashes);
    EXPECT_EQ(stash_ops(weight_part), 0);
    EXPECT_EQ(unsplit.ops.size() + static_cast<size_t>(stashes),
              input_part.ops.size() + weight_part.ops.size());
}

// The engine runs each output head's backward right after its loss, in the micro-batch's
// forward (model_passes.cpp, head_loss): the model prices it in F, where a pipeline schedule places
// it (the last stage's F is longer and its B shorter), and recompute reruns none of the head.
TEST(SimOps, OutputHeadBackwardRunsInTheForwardAsTheEngineDoes) {
    Fixture f;
    const OpContext ctx = f.context("tp2.ep8", 64, 1024, 1);
    for (BlockKind kind : {BlockKind::output_head, BlockKind::mtp_extra}) {
        const BlockOps block = build_block_ops(ctx, kind);
        const std::string head = kind == BlockKind::output_head ? "head" : "mtp.head";
        std::vector<std::string> forward, backward;
        for (const Op& op : block.forward) forward.push_back(op.name);
        for (const Op& op : block.backward) backward.push_back(op.name);
        auto at = [](const std::vector<std::string>& names, const std::string& name) {
            return std::find(names.begin(), names.end(), name) - names.begin();
        };
        const auto logits = at(forward, head + ".logits");
        const auto dgrad = at(forward, head + ".logits.dgrad");
        const auto wgrad = at(forward, head + ".logits.wgrad");
        const auto loss_backward = at(forward, head + ".cross_entropy.bwd");
        ASSERT_LT(wgrad, static_cast<long>(forward.size())) << head;
        EXPECT_LT(logits, loss_backward) << head;
        EXPECT_LT(loss_backward, dgrad) << head;  // in the order the backward runs them
        EXPECT_EQ(at(backward, head + ".logits.wgrad"), static_cast<long>(backward.size())) << head;
        EXPECT_TRUE(block.forward[static_cast<size_t>(wgrad)].fused_head);
        EXPECT_TRUE(block.forward[static_cast<size_t>(logits)].fused_head);
        if (kind == BlockKind::output_head) {
            EXPECT_TRUE(block.backward.empty());
        } else {  // MTP's eh_proj, before its head, keeps its backward in B
            EXPECT_LT(at(backward, "mtp.eh_proj.dgrad"), static_cast<long>(backward.size()));
        }

        const RecomputedBlock full = apply_recompute(block, parse_recompute("full"));
        for (const Op& op : full.backward)
            EXPECT_FALSE(op.is_recompute && op.name.starts_with(head + ".")) << op.name;
    }
}

TEST(SimOps, ExecutedFlopsExceedTheConventionWhereRealKernelsDoMore) {
    Fixture f;
    const BlockOps moe = build_block_ops(f.context("tp2.ep8", 64, 4096, 1), BlockKind::moe_layer);
    double executed = 0, counted = 0;
    for (const auto* list : {&moe.forward, &moe.backward}) {
        for (const Op& op : *list) {
            executed += op.flops;
            counted += op.model_flops;
        }
    }
    // Duplicated MLA down-projections, flash-attention recompute and the router GEMM.
    EXPECT_GT(executed, counted * 1.02);
}

// Issue 17: a calibrated CPU trains in fp32, and this engine keeps its activations, their
// gradients and its weights in fp32 too. The ops counted 2-byte (bf16) activations whatever the
// GEMM format, and the calibrated file halved its stream rate to make up for it, which also
// halved the rate of the optimizer, whose bytes were right: small's optimizer came out at twice
// the engine's. At precision fp32 every byte an op moves of activations is now 4.
TEST(SimOps, Fp32TrainingMovesFp32Activations) {
    Fixture f;
    OpContext bf16 = f.context("tp2.ep8", 64, 1024, 1);
    bf16.settings.precision = Precision::bf16;
    OpContext fp32 = bf16;
    fp32.settings.precision = Precision::fp32;
    EXPECT_EQ(high_precision_bytes(Precision::fp32), 4);
    EXPECT_EQ(high_precision_bytes(Precision::bf16), 2);
    EXPECT_EQ(high_precision_bytes(Precision::mxfp8), 2);
    for (BlockKind kind : {BlockKind::dense_layer, BlockKind::moe_layer, BlockKind::output_head}) {
        const BlockOps half = build_block_ops(bf16, kind), full = build_block_ops(fp32, kind);
        EXPECT_DOUBLE_EQ(full.layer_input_bytes, 2 * half.layer_input_bytes);
        for (auto [a, b] :
             {std::pair{&half.forward, &full.forward}, {&half.backward, &full.backward}}) {
            ASSERT_EQ(a->size(), b->size());
            for (size_t i = 0; i < a->size(); ++i) {
                const Op &x = (*a)[i], &y = (*b)[i];
                // The router runs in fp32 and weight gradients accumulate in fp32 at any
                // precision.
                const bool fp32_in_both = y.name.starts_with("moe.router") ||
                                          y.name == "moe.preprocess" || y.name.ends_with(".wgrad");
                if (!fp32_in_both && x.kind != OpKind::sync) {
                    EXPECT_DOUBLE_EQ(y.bytes, 2 * x.bytes) << y.name;
                }
            }
        }
    }
}

TEST(SimOps, RecomputeRerunsForwardOpsAndSavesMemory) {
    Fixture f;
    const BlockOps moe = build_block_ops(f.context("tp1.ep32", 256, 4096, 1), BlockKind::moe_layer);
    const RecomputedBlock none = apply_recompute(moe, parse_recompute("none"));
    const RecomputedBlock act = apply_recompute(moe, parse_recompute("moe_act"));
    const RecomputedBlock full = apply_recompute(moe, parse_recompute("full"));
    EXPECT_EQ(none.backward.size(), moe.backward.size());
    EXPECT_LT(act.saved_bytes, none.saved_bytes);
    EXPECT_LT(full.saved_bytes, act.saved_bytes);
    EXPECT_DOUBLE_EQ(full.saved_bytes, moe.layer_input_bytes);
    int reruns = 0;
    for (const Op& op : act.backward) {
        if (op.is_recompute) {
            ++reruns;
            EXPECT_EQ(op.module, Module::moe_act) << op.name;
        }
    }
    EXPECT_EQ(reruns, 1);
    // Full recompute reruns the whole forward, its all-to-alls included.
    EXPECT_EQ(full.backward.size(), moe.backward.size() + moe.forward.size());
    EXPECT_EQ(recompute_name(parse_recompute("mlp,moe_act")), "mlp,moe_act");
    EXPECT_THROW(parse_recompute("mlp,attention"), Error);
}

TEST(SimCosts, GemmEfficiencyGrowsWithSizeAndRooflineBoundsIt) {
    Fixture f;
    const EfficiencyParams& e = f.cluster.efficiency;
    const double small = gemm_efficiency(e, MathRate::mxfp8, 4096, 32768, 512);
    const double big = gemm_efficiency(e, MathRate::mxfp8, 4096, 7168, 16384);
    EXPECT_LT(small, big);
    EXPECT_LT(big, e.gemm_max.at(MathRate::mxfp8));
    EXPECT_LT(grouped_gemm_efficiency(e, MathRate::mxfp8, 64, 4096, 7168),
              grouped_gemm_efficiency(e, MathRate::mxfp8, 4096, 4096, 7168));
    // A skinny GEMM is memory-bound: its time follows the bytes, not the FLOPs.
    Op op;
    op.kind = OpKind::gemm;
    op.rate = MathRate::mxfp8;
    op.m = 1;
    op.n = 8192;
    op.k = 8192;
    op.flops = 2 * op.m * op.n * op.k;
    op.bytes = op.n * op.k;
    op.kernels = 0;
    EXPECT_NEAR(op_gpu_time_s(f.cluster, op),
                op.bytes / (f.cluster.gpu.hbm_bytes_per_s * e.memory_bw), 1e-12);
    // A large one is compute-bound at its efficiency.
    op.m = 8192;
    op.flops = 2 * op.m * op.n * op.k;
    op.bytes = 3 * 8192.0 * 8192.0;
    EXPECT_NEAR(op_gpu_time_s(f.cluster, op),
                op.flops / (f.cluster.peak_flops(MathRate::mxfp8) *
                            gemm_efficiency(e, MathRate::mxfp8, op.m, op.n, op.k)),
                1e-12);
}

}  // namespace
}  // namespace moetron::sim
