// N ranks train the same as 1 rank (training_equivalence.h), with the step assembled here from
// the model and the optimizer: the reference is one Model with every expert and plain AdamW per
// tensor; the parallel run is data parallel (all-reduce or ZeRO-1), expert parallel, tensor
// parallel and their combinations, with bucketed gradient sync overlapped with the backward.
// Also: sharded parameters initialize as their slice of the full model, and a TP rank's gradients
// are slices of the one-process gradients.
//
// Runs under mpirun -np 1, 2 and 4; a layout that needs another world size is skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/cpu/adamw.h"
#include "moetron/model/layout_fit.h"
#include "moetron/model/model.h"
#include "moetron/parallel/grad_sync.h"
#include "moetron/parallel/topology.h"
#include "moetron/train/optimizer.h"
#include "mpi/mpi_test_main.h"
#include "mpi/training_equivalence.h"
#include "testing.h"

namespace moetron::testing {
namespace {

// The global batch of one step: random tokens, next-token targets, -1 at sequence ends and at a
// few positions of the first sequences only, so that the ranks' valid-token counts differ.
struct GlobalBatch {
    std::vector<int32_t> tokens, targets;
};

GlobalBatch global_batch(const ModelConfig& c, int step) {
    GlobalBatch b;
    RngStream rng(kSeed, static_cast<uint64_t>(100 + step));
    b.tokens.resize(kGlobalBatch * kSeq);
    for (int32_t& t : b.tokens) t = static_cast<int32_t>(rng.next_below(c.vocab_size));
    b.targets.assign(b.tokens.size(), -1);
    for (int64_t s = 0; s < kGlobalBatch; ++s)
        for (int64_t t = 0; t + 1 < kSeq; ++t) b.targets[s * kSeq + t] = b.tokens[s * kSeq + t + 1];
    for (int i : {3, 4, 7, 30, 40, 41}) b.targets[static_cast<size_t>(i)] = -1;
    return b;
}

// Every token's experts on EP rank 0, whatever the EP group: a correction bias far above the
// sigmoid scores (in (0, 1)) on experts 0 and 1 (K = 2, both in router group 0), which 5 bias
// updates of kBiasSpeed cannot undo. Each rank then sends all its copies to rank 0.
void route_everything_to_rank_zero(Model& model) {
    for (const ParamEntry& e : model.param_entries()) {
        if (!e.name.ends_with("router_bias")) continue;
        float* bias = model.params() + e.offset;
        bias[0] = bias[1] = 10.0f;
    }
}

// One process, every expert, the whole batch in one micro-batch, AdamW tensor by tensor
// (train/optimizer.h's conventions).
RunResult reference_run(const ModelConfig& c, bool adversarial = false) {
    Model model(c, {kGlobalBatch, kSeq}, kLossWeights);
    model.init_parameters(kSeed);
    if (adversarial) route_everything_to_rank_zero(model);
    const AdamWConfig hp = adamw_config();
    std::vector<float> m(static_cast<size_t>(model.num_params()), 0.0f), v = m;
    RunResult r;
    for (int step = 1; step <= kSteps; ++step) {
        const GlobalBatch b = global_batch(c, step);
        model.zero_grads();
        const MicroBatchLosses l =
            model.forward_backward(b.tokens.data(), b.targets.data(), kGlobalBatch, kSeq, 1.0f);
        r.losses.push_back({l.lm_loss, l.mtp_loss, l.balance_loss});
        double sum = 0;
        for (const ParamEntry& e : model.param_entries())
            if (e.trainable) sum += cpu::sum_squares(model.grads() + e.offset, e.numel);
        const float factor = cpu::clip_factor(std::sqrt(sum), static_cast<float>(hp.grad_clip));
        for (const ParamEntry& e : model.param_entries()) {
            if (!e.trainable) continue;
            cpu::scale_inplace(model.grads() + e.offset, e.numel, factor);
            const cpu::AdamWParams p{static_cast<float>(kLr),
                                     static_cast<float>(hp.beta1),
                                     static_cast<float>(hp.beta2),
                                     static_cast<float>(hp.eps),
                                     e.weight_decay ? static_cast<float>(hp.weight_decay) : 0.0f,
                                     step};
            cpu::adamw_update(model.params() + e.offset, m.data() + e.offset, v.data() + e.offset,
                              model.grads() + e.offset, e.numel, p);
        }
        model.update_router_bias(kBiasSpeed);
    }
    r.params.assign(model.params(), model.params() + model.num_params());
    r.entries = model.param_entries();
    return r;
}

struct Case {
    std::string layout;  // as --layout
    bool zero1 = false;
    bool overlap = true;
    int micro_batches = 1;            // per rank and step
    int64_t bucket_bytes = 64 << 10;  // several buckets even for the tiny model
    bool adversarial = false;         // route_everything_to_rank_zero
    double capacity_factor = parallel::kDefaultMoeCapacityFactor;
    MoeOverlap moe_overlap = MoeOverlap::off;
};

struct ParallelRun {
    RunResult result;
    parallel::GradSyncStats last_sync;
    parallel::DispatchStats dispatch;  // over the whole run
    int ep = 1, edp = 1, dp = 1;
};

// The distributed step: zero grads; the rank's micro-batches normalized by the global batch's
// counts (summed over the world); gradient sync overlapped with the last backward; clipping by
// the global norm; AdamW (ZeRO-1 when sharded); the router bias from the loads of every rank.
ParallelRun parallel_run(const ModelConfig& c, const Case& k) {
    parallel::Communicator& world = mpi_world();
    const parallel::Topology topo =
        parallel::make_topology(parallel::parse_layout(k.layout), world.size());
    validate_topology_for_model(topo, c);
    parallel::ParallelGroups groups = parallel::build_groups(world, topo);
    const int dp_rank = groups.dp->rank();
    const int64_t rank_batch = kGlobalBatch / topo.dp;
    const int64_t micro_batch = rank_batch / k.micro_batches;

    ModelParallel mp;
    mp.ep = groups.ep.get();
    mp.tp = groups.tp.get();
    mp.load = &world;
    mp.moe.capacity_factor = k.capacity_factor;
    mp.moe.overlap = k.moe_overlap;
    Model model(c, {micro_batch, kSeq}, kLossWeights, mp);
    model.init_parameters(kSeed);
    if (k.adversarial) route_everything_to_rank_zero(model);
    // moetron info's per-rank plan (plan_rank_memory) is this rank's arenas, in every layout.
    const RankMemoryPlan memory =
        plan_rank_memory(c, {micro_batch, kSeq}, topo, mp.moe, /*zero1=*/true);
    EXPECT_EQ(memory.parameters + memory.gradients + memory.activations + memory.expert_side +
                  memory.communication,
              model.planned_bytes())
        << k.layout;
    AdamWConfig config = adamw_config();
    config.grad_sync.bucket_bytes = k.bucket_bytes;
    config.grad_sync.zero1 = k.zero1;
    config.grad_sync.overlap = k.overlap;
    const std::vector<parallel::ParamSpan> spans = model.param_spans();
    AdamW optimizer(spans, model.num_params(), model.grads(), {world, *groups.dp, *groups.edp},
                    config);
    parallel::GradSync& sync = optimizer.grad_sync();
    model.set_grad_ready_callback(
        [&sync](int64_t begin, int64_t end) { sync.grads_ready(begin, end); });

    ParallelRun run;
    run.ep = topo.ep;
    run.edp = topo.edp;
    run.dp = topo.dp;
    for (int step = 1; step <= kSteps; ++step) {
        const GlobalBatch b = global_batch(c, step);
        const int64_t first_row = dp_rank * rank_batch;
        // The global denominators: each rank counts its slice, one all-reduce sums them.
        LossDenominators den;
        for (int mb = 0; mb < k.micro_batches; ++mb)
            den += count_loss_denominators(
                c, b.targets.data() + (first_row + mb * micro_batch) * kSeq, micro_batch, kSeq);
        std::array<double, 2 + kMaxMtpDepths> counts{};
        counts[0] = static_cast<double>(den.lm_tokens);
        counts[1] = static_cast<double>(den.sequences);
        for (int64_t d = 0; d < kMaxMtpDepths; ++d)
            counts[2 + d] = static_cast<double>(den.mtp_tokens[d]);
        groups.dp->all_reduce_sum(std::span<double>(counts), kHostStream);
        den.lm_tokens = static_cast<int64_t>(counts[0]);
        den.sequences = static_cast<int64_t>(counts[1]);
        for (int64_t d = 0; d < kMaxMtpDepths; ++d)
            den.mtp_tokens[d] = static_cast<int64_t>(counts[2 + d]);

        model.zero_grads();
        std::array<double, 3> shares{};
        for (int mb = 0; mb < k.micro_batches; ++mb) {
            if (mb + 1 == k.micro_batches) sync.arm();
            const int64_t row = first_row + mb * micro_batch;
            const MicroBatchLosses l =
                model.forward_backward(b.tokens.data() + row * kSeq, b.targets.data() + row * kSeq,
                                       micro_batch, kSeq, 1.0f, den);
            shares[0] += l.lm_loss;
            shares[1] += l.mtp_loss;
            shares[2] += l.balance_loss;
        }
        sync.finish();
        groups.dp->all_reduce_sum(std::span<double>(shares), kHostStream);
        run.result.losses.push_back({shares[0], shares[1], shares[2]});
        optimizer.clip_gradients(model.grads());
        optimizer.step(model.params(), model.grads(), kLr);
        model.update_router_bias(kBiasSpeed);
    }
    run.last_sync = sync.last_stats();
    if (const parallel::ExpertDispatcher* d = model.expert_dispatcher()) run.dispatch = d->stats();
    run.result.params.assign(model.params(), model.params() + model.num_params());
    run.result.entries = model.param_entries();
    run.result.shard = model.expert_shard();
    return run;
}

ParallelRun run_case(const Case& k, const ModelConfig& c = tiny_config()) {
    const RunResult want = reference_run(c, k.adversarial);
    const ParallelRun got = parallel_run(c, k);
    const std::string what = (k.layout.empty() ? std::string("dp") : k.layout) +
                             (k.zero1 ? "+zero1" : "") + (k.overlap ? "" : " no-overlap") + " x" +
                             std::to_string(k.micro_batches) + " micro" +
                             (k.adversarial ? " adversarial" : "") + " moe-overlap " +
                             std::string(moe_overlap_name(k.moe_overlap));
    expect_matches_reference(got.result, want, what);
    if (k.overlap) {
        // The overlap happened: buckets went out during the backward.
        EXPECT_GT(got.last_sync.buckets_posted_in_backward, 0) << what;
    } else {
        EXPECT_EQ(got.last_sync.buckets_posted_in_backward, 0) << what;
    }
    EXPECT_GT(got.last_sync.num_buckets, 3) << what;
    return got;
}

TEST(MpiTraining, DataParallelAllReduceMatchesOneRank) {
    run_case({"", false});
}

TEST(MpiTraining, DataParallelZero1MatchesOneRank) {
    run_case({"", true});
}

TEST(MpiTraining, ExpertParallelMatchesOneRank) {
    run_case({ep_world(), false});
}

TEST(MpiTraining, ExpertParallelZero1MatchesOneRank) {
    run_case({ep_world(), true});
}

// Every token to EP rank 0's experts, with expert-side buffers for the balanced load: each
// MoE layer runs in several rounds through them (the backward recomputes all but the last
// round's experts), and the run still trains as one rank does, with or without the dual overlap.
TEST(MpiTraining, AdversarialRoutingBeyondTheCapacityMatchesOneRank) {
    for (MoeOverlap overlap : {MoeOverlap::off, MoeOverlap::dual}) {
        Case k{ep_world(), false};
        k.adversarial = true;
        k.capacity_factor = 1.0;
        k.moe_overlap = overlap;
        const ParallelRun got = run_case(k);
        if (got.ep == 1) continue;  // one rank holds every expert: nothing to overflow
        // 2 MoE layers + 1 MTP block, 5 steps, each forward once.
        EXPECT_EQ(got.dispatch.overflowed_plans, 3 * kSteps);
        EXPECT_GE(got.dispatch.extra_rounds, 3 * kSteps * (got.ep - 1));
    }
}

// dp2 x ep2 on 4 ranks: attention data-parallel over 4, experts split over 2 and replicated
// over 2 (Megatron's folding). dp is the attention side's; "ep2" leaves it out: the same run.
TEST(MpiTraining, DataTimesExpertParallelZero1MatchesOneRank) {
    if (mpi_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
    run_case({"ep2", true});
    run_case({"dp4.ep2", false});
}

// Tensor parallelism (Megatron style, sequence-parallel stream and norms): heads, vocabulary,
// dense MLP and shared experts split over TP; on 4 ranks tp2 is dp2 x tp2.
TEST(MpiTraining, TensorParallelMatchesOneRank) {
    if (mpi_world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
    run_case({"tp2", false});
    run_case({"tp2", true});
}

TEST(MpiTraining, TensorParallelOverTheWorldMatchesOneRank) {
    if (mpi_world().size() < 4) GTEST_SKIP() << "needs 4 ranks (tp2 is covered above)";
    run_case({"tp4", true});
}

// The other paths of the split layers: one query projection (q_lora_rank = 0, split by heads
// with its input gradient summed over TP), and MoE layers without shared experts.
TEST(MpiTraining, TensorParallelWithoutLowRankQueryOrSharedExpertsMatchesOneRank) {
    if (mpi_world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
    ModelConfig one_query = tiny_config();
    one_query.q_lora_rank = 0;
    run_case({"tp2", true}, one_query);
    ModelConfig no_shared = tiny_config();
    no_shared.n_shared_experts = 0;
    run_case({"tp2", true}, no_shared);
}

// tp2 x ep2 on 4 ranks (parallel folding: attention dp2 x tp2, experts edp2 x ep2), and ep4 with
// tp2: each TP rank sends its share of the tokens to the experts.
TEST(MpiTraining, TensorTimesExpertParallelMatchesOneRank) {
    if (mpi_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
    run_case({"tp2.ep2", true});
    run_case({"tp2.ep4", false});
}

// Two micro-batches per rank (accumulation with the global denominators) and the sync posted
// only after the backward: the same result.
TEST(MpiTraining, AccumulationWithoutOverlapMatchesOneRank) {
    if (kGlobalBatch / mpi_world().size() < 2) GTEST_SKIP() << "needs 2 sequences per rank";
    Case k{ep_world(), true, false, 2};
    k.bucket_bytes = 10000;  // not a multiple of the group: padded shards
    run_case(k);
}

// Counter-based initialization by global index: the rank's experts are the same numbers as the
// same experts of the unsharded model.
TEST(MpiTraining, ShardedExpertsInitializeAsTheirSliceOfTheFullModel) {
    parallel::Communicator& world = mpi_world();
    const ModelConfig c = tiny_config();
    Model full(c, {1, 8}, {});
    full.init_parameters(kSeed);
    ModelParallel mp;
    mp.ep = &world;
    mp.load = &world;
    Model sharded(c, {1, 8}, {}, mp);
    sharded.init_parameters(kSeed);
    const int64_t local = c.n_routed_experts / world.size();
    EXPECT_EQ(sharded.expert_shard().first, world.rank() * local);
    EXPECT_EQ(sharded.expert_shard().local_experts(c.n_routed_experts), local);
    int checked = 0;
    for (const ParamEntry& e : sharded.param_entries()) {
        const TensorView want = full.param(e.name);
        const float* got = sharded.params() + e.offset;
        const int64_t first = is_routed_expert_param(e.name) ? world.rank() * e.numel : 0;
        EXPECT_EQ(e.shape[0], is_routed_expert_param(e.name) ? local : want.shape[0]) << e.name;
        EXPECT_TRUE(std::equal(got, got + e.numel, want.ptr<float>() + first)) << e.name;
        checked += is_routed_expert_param(e.name);
    }
    EXPECT_EQ(checked, 6);
    EXPECT_GT(sharded.planned_bytes(), 0u);
    if (world.size() > 1) {
        // Without a group to sum the loads over, the ranks' router biases would drift apart.
        ModelParallel no_load;
        no_load.ep = &world;
        EXPECT_THROW(Model(c, {1, 8}, {}, no_load), Error);
    }
}

// Counter-based initialization by global index: each TP shard (heads of q_b/kv_b/o_proj, features
// of the MLPs) holds the same numbers as its slice of the unsharded model; the rest is replicated.
TEST(MpiTraining, TensorParallelShardsInitializeAsTheirSliceOfTheFullModel) {
    parallel::Communicator& world = mpi_world();
    const ModelConfig c = tiny_config();
    Model full(c, {1, 8}, {});
    full.init_parameters(kSeed);
    ModelParallel mp;
    mp.tp = &world;
    mp.load = &world;
    Model sharded(c, {1, 8}, {}, mp);
    sharded.init_parameters(kSeed);
    int split = 0;
    for (const ParamEntry& e : sharded.param_entries()) {
        const TensorView want = full.param(e.name);
        const ParamEntry& we = full.param_entries()[&e - sharded.param_entries().data()];
        const std::vector<float> slice = reference_slice(e, we, want.ptr<float>(), {});
        EXPECT_TRUE(std::equal(slice.begin(), slice.end(), sharded.params() + e.offset)) << e.name;
        EXPECT_EQ(e.numel * (e.tp.sharded() ? world.size() : 1), we.numel) << e.name;
        split += e.tp.sharded();
    }
    // Per block q_b, kv_b, o_proj and gate_up, down of the dense MLP or the shared experts; the
    // embedding and the head.
    const int64_t blocks = c.num_hidden_layers + c.num_nextn_predict_layers;
    EXPECT_EQ(split, world.size() > 1 ? 5 * blocks + 2 : 0);
}

// One forward_backward over the world as one TP group: every rank's gradient is its slice of the
// one-process model's, before any optimizer (sharper than the 5-step comparison, which AdamW's
// sensitivity to near-zero gradients limits). Split tensors and those replicated over TP compare
// as they are; the routed experts, fed each rank's share of the tokens, once summed over the
// world (their expert-data-parallel group here).
TEST(MpiTraining, TensorParallelGradientsAreSlicesOfTheOneProcessGradients) {
    parallel::Communicator& world = mpi_world();
    const ModelConfig c = tiny_config();
    const GlobalBatch b = global_batch(c, 1);
    Model full(c, {kGlobalBatch, kSeq}, kLossWeights);
    full.init_parameters(kSeed);
    full.zero_grads();
    const MicroBatchLosses want =
        full.forward_backward(b.tokens.data(), b.targets.data(), kGlobalBatch, kSeq, 1.0f);
    ModelParallel mp;
    mp.tp = &world;
    mp.load = &world;
    Model sharded(c, {kGlobalBatch, kSeq}, kLossWeights, mp);
    sharded.init_parameters(kSeed);
    sharded.zero_grads();
    const MicroBatchLosses got =
        sharded.forward_backward(b.tokens.data(), b.targets.data(), kGlobalBatch, kSeq, 1.0f);
    EXPECT_NEAR(got.lm_loss, want.lm_loss, 1e-6 * want.lm_loss);
    EXPECT_NEAR(got.mtp_loss, want.mtp_loss, 1e-6 * want.mtp_loss);
    EXPECT_NEAR(got.balance_loss, want.balance_loss, 1e-5 * want.balance_loss);
    double worst = 0;
    for (size_t i = 0; i < full.param_entries().size(); ++i) {
        const ParamEntry& e = sharded.param_entries()[i];
        if (!e.trainable) continue;
        const ParamEntry& we = full.param_entries()[i];
        std::vector<float> g(sharded.grads() + e.offset, sharded.grads() + e.offset + e.numel);
        if (is_routed_expert_param(e.name)) world.all_reduce_sum(std::span<float>(g), kHostStream);
        const std::vector<float> slice = reference_slice(e, we, full.grads() + we.offset, {});
        const TensorError err = tensor_error(g.data(), slice.data(), e.numel);
        EXPECT_LE(err.l2_rel, 1e-5) << e.name;
        worst = std::max(worst, err.l2_rel);
    }
    std::printf("[maxerr] mpi_training tp%d gradients (rank %d): l2rel=%.3e\n", world.size(),
                world.rank(), worst);
}

}  // namespace
}  // namespace moetron::testing
