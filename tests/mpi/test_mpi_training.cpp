// N ranks train the same as 1 rank: the tiny model (configs/models/tiny.toml) trained for 5 steps
// on one global batch per step, once in this process alone (the reference: one Model, every
// expert, plain AdamW per tensor) and once over the world in a parallel layout (data parallel
// with all-reduce or ZeRO-1, expert parallel, tensor parallel, and their combinations), with
// bucketed gradient sync overlapped with the backward. Per-step losses must agree within 1e-5
// relative, final parameters (each rank's share, experts against their slice) within 1e-4 relative
// per tensor (see kParamL2Tolerance), router biases exactly. A tensor split over TP is compared
// with its slice of the reference.
//
// The same comparison through train/trainer.h: Trainer::step on N ranks (TrainParallel) against
// Trainer::step on one process (a world of one, with the same optimizer, train/optimizer.h).
//
// Runs under mpirun -np 1, 2 and 4; a layout that needs another world size is skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/cpu/adamw.h"
#include "moetron/model/layout_fit.h"
#include "moetron/model/model.h"
#include "moetron/parallel/grad_sync.h"
#include "moetron/parallel/topology.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/optimizer.h"
#include "moetron/train/trainer.h"
#include "mpi/mpi_test_main.h"
#include "testing.h"

namespace moetron::testing {
namespace {

constexpr int64_t kGlobalBatch = 8;  // sequences per step, over all ranks
constexpr int64_t kSeq = 32;
constexpr int kSteps = 5;
constexpr uint64_t kSeed = 1234;
constexpr double kLr = 3e-3;
constexpr float kBiasSpeed = 1e-3f;
const LossWeights kLossWeights{0.3f, 1e-4f};

ModelConfig tiny_config() {
    return load_model_config(std::string(MOETRON_SOURCE_DIR) + "/configs/models/tiny.toml");
}

AdamWConfig adamw_config() {
    AdamWConfig c;
    c.grad_clip = 1.0;
    c.weight_decay = 0.1;
    return c;
}

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

struct StepLosses {
    double lm = 0, mtp = 0, balance = 0;
};

struct RunResult {
    std::vector<StepLosses> losses;
    std::vector<float> params;
    std::vector<ParamEntry> entries;
    ExpertShard shard;
};

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

// The elements of the reference tensor `want` (its whole flat data) that the local tensor `e`
// holds: a TP shard's slice, a routed-expert shard's experts, or all of it.
std::vector<float> reference_slice(const ParamEntry& e, const ParamEntry& want_entry,
                                   const float* want, const ExpertShard& shard) {
    std::vector<float> out(static_cast<size_t>(e.numel));
    if (e.tp.sharded()) {
        e.tp.for_each_run(e.numel, [&](int64_t local, int64_t global, int64_t count) {
            std::copy(want + global, want + global + count, out.begin() + local);
        });
        return out;
    }
    int64_t first = 0;
    if (e.numel != want_entry.numel) {
        EXPECT_TRUE(is_routed_expert_param(e.name)) << e.name;
        first = shard.first * (want_entry.numel / want_entry.shape[0]);
    }
    std::copy(want + first, want + first + e.numel, out.begin());
    return out;
}

// Per tensor: ||got - want||_2 / ||want||_2, and the largest elementwise difference.
struct TensorError {
    double l2_rel = 0;
    double max_abs = 0;
};

// split_over: for a tensor split over TP, the group whose ranks hold its parts (the world: every
// data-parallel replica then adds its copy to both sums alike), so that the error is the whole
// tensor's; a collective over it. Null for a tensor this rank holds whole.
TensorError tensor_error(const float* got, const float* want, int64_t n,
                         parallel::Communicator* split_over = nullptr) {
    std::array<double, 2> sums{};  // diff2, norm2
    TensorError e;
    for (int64_t i = 0; i < n; ++i) {
        const double d = static_cast<double>(got[i]) - want[i];
        sums[0] += d * d;
        sums[1] += static_cast<double>(want[i]) * want[i];
        e.max_abs = std::max(e.max_abs, std::fabs(d));
    }
    if (split_over != nullptr) split_over->all_reduce_sum(std::span<double>(sums), kHostStream);
    e.l2_rel = sums[1] > 0 ? std::sqrt(sums[0] / sums[1]) : std::sqrt(sums[0]);
    return e;
}

// Parameters are compared per tensor by the relative L2 norm of the difference, not element by
// element: AdamW maps a gradient of size ~eps to an update whose size depends on its exact
// value, and gradients that small come from cancellation, where summing in another order (over
// ranks, micro-batches, expert segments) changes them by percents. Such elements move by up to
// ~1e-5 differently in 5 steps while the tensor as a whole agrees to ~1e-5 of its norm. The
// elementwise guard (a tenth of one step's learning rate) still catches any real divergence: a
// wrong gradient moves its elements by whole learning-rate steps. A tensor split over TP is
// measured whole (its parts' sums added over the ranks), not part by part: such elements can
// gather in one part.
constexpr double kParamL2Tolerance = 1e-4;
constexpr double kParamMaxAbsTolerance = 0.1 * kLr;
constexpr double kLossTolerance = 1e-5;

// holders: the ranks that hold this rank's tensors (null: the world); with pipeline parallelism
// the ranks of its stage, over which a tensor split by TP is measured whole.
void expect_matches_reference(const RunResult& got, const RunResult& want, const std::string& what,
                              bool pipelined = false, parallel::Communicator* holders = nullptr) {
    ASSERT_EQ(got.losses.size(), want.losses.size());
    auto rel = [](double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-12); };
    double worst_loss = 0;
    for (size_t s = 0; s < want.losses.size(); ++s) {
        const StepLosses& g = got.losses[s];
        const StepLosses& w = want.losses[s];
        EXPECT_LE(rel(g.lm, w.lm), kLossTolerance)
            << what << " step " << s + 1 << " lm " << g.lm << " vs " << w.lm;
        EXPECT_LE(rel(g.mtp, w.mtp), kLossTolerance)
            << what << " step " << s + 1 << " mtp " << g.mtp << " vs " << w.mtp;
        EXPECT_LE(rel(g.balance, w.balance), kLossTolerance)
            << what << " step " << s + 1 << " balance " << g.balance << " vs " << w.balance;
        worst_loss =
            std::max({worst_loss, rel(g.lm, w.lm), rel(g.mtp, w.mtp), rel(g.balance, w.balance)});
    }
    // Every local tensor against the same tensor (experts: the same slice) of the reference. A
    // pipeline stage holds its blocks' tensors only, in the reference's order.
    if (!pipelined) {
        ASSERT_EQ(got.entries.size(), want.entries.size());
    }
    TensorError worst;
    std::string worst_name;
    size_t wi = 0;
    for (size_t i = 0; i < got.entries.size(); ++i, ++wi) {
        const ParamEntry& ge = got.entries[i];
        while (wi < want.entries.size() && want.entries[wi].name != ge.name) ++wi;
        ASSERT_LT(wi, want.entries.size()) << what << ": no reference tensor " << ge.name;
        const ParamEntry& we = want.entries[wi];
        const std::vector<float> slice =
            reference_slice(ge, we, want.params.data() + we.offset, got.shard);
        const float* g = got.params.data() + ge.offset;
        const float* w = slice.data();
        if (!ge.trainable) {  // the router bias moves by whole steps of gamma: exactly alike
            EXPECT_TRUE(std::equal(g, g + ge.numel, w)) << what << " " << ge.name;
            continue;
        }
        const TensorError e =
            tensor_error(g, w, ge.numel,
                         ge.tp.sharded() ? (holders != nullptr ? holders : &mpi_world()) : nullptr);
        EXPECT_LE(e.l2_rel, kParamL2Tolerance) << what << " " << ge.name;
        EXPECT_LE(e.max_abs, kParamMaxAbsTolerance) << what << " " << ge.name;
        worst.max_abs = std::max(worst.max_abs, e.max_abs);
        if (e.l2_rel >= worst.l2_rel) {
            worst.l2_rel = e.l2_rel;
            worst_name = ge.name;
        }
    }
    std::printf(
        "[maxerr] mpi_training %s (rank %d): losses rel=%.3e, params l2rel=%.3e (%s) "
        "max_abs=%.3e\n",
        what.c_str(), mpi_world().rank(), worst_loss, worst.l2_rel, worst_name.c_str(),
        worst.max_abs);
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

std::string ep_world() {
    return "ep" + std::to_string(mpi_world().size());
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

// ---- the trainer (moetron train's step) on N ranks against the same trainer on one process ----

TrainConfig trainer_config(int64_t grad_accum) {
    TrainConfig c;
    c.batch_size = kGlobalBatch;
    c.seq_len = kSeq;
    c.grad_accum = grad_accum;
    c.steps = kSteps;
    c.warmup_steps = 2;
    c.lr = kLr;
    c.min_lr = kLr / 10;
    c.eval_batches = 2;
    c.seed = kSeed;
    return c;
}

struct TrainerRun {
    RunResult result;
    std::vector<double> grad_norms;
    double val_loss = 0;
    StepRecord last_step;
    parallel::GradSyncStats last_sync;
};

TrainerRun trainer_run(const ModelConfig& model, const TrainConfig& c, const TrainParallel& p) {
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/40000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    Trainer trainer(model, c, std::move(loader), p);
    TrainerRun run;
    for (int s = 0; s < kSteps; ++s) {
        const StepRecord r = trainer.step();
        run.result.losses.push_back({r.loss, r.mtp_loss, r.balance_loss});
        run.grad_norms.push_back(r.grad_norm);
        run.last_step = r;
    }
    run.last_sync = trainer.last_sync_stats();
    run.val_loss = trainer.evaluate();
    Model& m = trainer.model();
    run.result.params.assign(m.params(), m.params() + m.num_params());
    run.result.entries = m.param_entries();
    run.result.shard = m.expert_shard();
    return run;
}

struct TrainerCase {
    std::string layout;
    bool zero1 = true;
    bool overlap = true;
    int64_t grad_accum = 1;
    std::string pp_schedule = "1f1b";
    bool mtp = true;  // the tiny model's MTP module; off: num_nextn_predict_layers 0
};

TrainerRun run_trainer_case(const TrainerCase& k) {
    ModelConfig model = tiny_config();
    if (!k.mtp) model.num_nextn_predict_layers = 0;
    const TrainConfig c = trainer_config(k.grad_accum);
    const TrainerRun want = trainer_run(model, c, {});
    TrainParallel p;
    p.world = &mpi_world();
    p.layout = k.layout;
    p.bucket_mb = 0.0625;  // several buckets even for the tiny model
    p.zero1 = k.zero1;
    p.overlap = k.overlap;
    p.pp_schedule = k.pp_schedule;
    const TrainerRun got = trainer_run(model, c, p);
    const std::string what = "trainer " + (k.layout.empty() ? std::string("dp") : k.layout) +
                             (k.zero1 ? "+zero1" : "") + (k.overlap ? "" : " no-overlap") + " x" +
                             std::to_string(k.grad_accum) + " micro" +
                             (k.layout.find("pp") != std::string::npos ? " " + k.pp_schedule : "");
    const bool pipelined = k.layout.find("pp") != std::string::npos;
    const parallel::Topology topo =
        parallel::make_topology(parallel::parse_layout(k.layout), mpi_world().size());
    // The ranks of this rank's pipeline stage (a collective over the world).
    const std::unique_ptr<parallel::Communicator> stage = mpi_world().split(
        parallel::coordinates_of(topo, mpi_world().rank()).pp, mpi_world().rank(), "stage");
    expect_matches_reference(got.result, want.result, what, pipelined, stage.get());
    // Each stage of the pipeline reports its busy and idle time (one process: no pipeline).
    const StepRecord& last = got.last_step;
    EXPECT_EQ(last.stage_busy_s.size(), pipelined ? static_cast<size_t>(topo.pp) : 0u) << what;
    EXPECT_EQ(last.stage_idle_s.size(), last.stage_busy_s.size()) << what;
    for (size_t s = 0; s < last.stage_busy_s.size(); ++s) {
        EXPECT_GT(last.stage_busy_s[s], 0.0) << what << " stage " << s;
        EXPECT_GE(last.stage_idle_s[s], 0.0) << what << " stage " << s;
    }
    EXPECT_TRUE(want.last_step.stage_busy_s.empty());
    for (size_t s = 0; s < want.grad_norms.size(); ++s)
        EXPECT_NEAR(got.grad_norms[s], want.grad_norms[s], 1e-5 * want.grad_norms[s])
            << what << " step " << s + 1;
    EXPECT_NEAR(got.val_loss, want.val_loss, kLossTolerance * want.val_loss) << what;
    return got;
}

void run_trainer_case(const std::string& layout, bool zero1, bool overlap, int64_t grad_accum) {
    run_trainer_case(
        {.layout = layout, .zero1 = zero1, .overlap = overlap, .grad_accum = grad_accum});
}

TEST(MpiTrainer, DataParallelZero1MatchesOneProcess) {
    run_trainer_case("", true, true, 1);
}

TEST(MpiTrainer, ExpertParallelMatchesOneProcess) {
    run_trainer_case(ep_world(), true, true, 1);
}

TEST(MpiTrainer, DataTimesExpertParallelMatchesOneProcess) {
    if (mpi_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
    run_trainer_case("dp4.ep2", true, true, 1);
}

TEST(MpiTrainer, TensorParallelMatchesOneProcess) {
    if (mpi_world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
    run_trainer_case("tp2", true, true, 1);
}

TEST(MpiTrainer, TensorTimesExpertParallelMatchesOneProcess) {
    if (mpi_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
    run_trainer_case("tp2.ep2", true, true, 2);
}

TEST(MpiTrainer, AccumulationReplicatedOptimizerWithoutOverlapMatchesOneProcess) {
    run_trainer_case(ep_world(), false, false, 2);
}

// Pipeline parallelism: the stages of one model run their micro-batches in the 1F1B order and
// train the same model as one process. 3 micro-batches over 2 stages and 6 over 4: not multiples
// of pp. The tiny model's MTP module sits on the last stage with a copy of the embedding, whose
// gradient the first and last stages add up: its parameters match the reference on both. pp4
// without MTP puts the head alone on the last stage.
TEST(MpiTrainer, PipelineOneFOneBMatchesOneProcess) {
    const int n = mpi_world().size();
    if (n == 1) GTEST_SKIP() << "needs 2 or 4 ranks";
    run_trainer_case({.layout = "pp" + std::to_string(n), .grad_accum = n == 2 ? 3 : 6});
    if (n == 4) run_trainer_case({.layout = "pp4", .grad_accum = 5, .mtp = false});
}

// Virtual stages (Megatron-LM's interleaved 1F1B): tiny's E|t*2|t|mL, chunks 0 and 2 on the first
// rank and 1 and 3 on the second, so the stream goes round the pipeline twice; on 4 ranks with
// the experts of each stage's MoE layers over two ranks.
TEST(MpiTrainer, PipelineInterleavedMatchesOneProcess) {
    const int n = mpi_world().size();
    if (n == 1) GTEST_SKIP() << "needs 2 or 4 ranks";
    if (n == 2) run_trainer_case({.layout = "pp2.vpp2", .grad_accum = 4});
    if (n == 4)
        run_trainer_case({.layout = "pp2.vpp2.ep2", .grad_accum = 2, .pp_schedule = "interleaved"});
}

// The zero-bubble schedule zb-h1: each backward split into B and W (the GEMMs' weight gradients
// queued with copies of their operands and replayed later), the W's filling the cool-down. 3
// micro-batches over 2 stages and 6 over 4: not multiples of pp. With data parallelism the
// gradient sync posts buckets as the stage's last W makes them final; with expert parallelism
// the routed experts' grouped GEMMs are split too, with tensor parallelism the split weights'.
TEST(MpiTrainer, PipelineZeroBubbleMatchesOneProcess) {
    const int n = mpi_world().size();
    if (n == 1) GTEST_SKIP() << "needs 2 or 4 ranks";
    run_trainer_case(
        {.layout = "pp" + std::to_string(n), .grad_accum = n == 2 ? 3 : 6, .pp_schedule = "zb-h1"});
    if (n == 4) {
        const TrainerRun dp =
            run_trainer_case({.layout = "pp2.dp2", .grad_accum = 3, .pp_schedule = "zb-h1"});
        // The last B's notices reach the sync during the last W: buckets post while it runs.
        EXPECT_GT(dp.last_sync.buckets_posted_in_backward, 0);
        run_trainer_case({.layout = "pp2.ep2", .grad_accum = 2, .pp_schedule = "zb-h1"});
        run_trainer_case({.layout = "tp2.pp2", .grad_accum = 3, .pp_schedule = "zb-h1"});
    }
}

// Tensor parallelism inside each stage: each TP rank sends its sequence-parallel rows of the
// stream to the same TP rank of the next stage.
TEST(MpiTrainer, PipelineWithTensorParallelMatchesOneProcess) {
    if (mpi_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
    run_trainer_case({.layout = "tp2.pp2", .grad_accum = 3});
}

// A NaN gradient on one stage skips the step on every stage: the gradient norm is the world's, so
// all stages see it non-finite, and none moves its parameters (nor its router biases).
TEST(MpiTrainer, PipelineStagesSkipANonFiniteStepTogether) {
    if (mpi_world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
    const ModelConfig model = tiny_config();
    const TrainConfig c = trainer_config(2);
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/40000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    TrainParallel p;
    p.world = &mpi_world();
    p.layout = "pp2";
    Trainer trainer(model, c, std::move(loader), p);
    // Only the last stage's gradient is poisoned, at step 2.
    const bool poisoner = mpi_world().rank() == 1;
    trainer.set_grad_hook([poisoner](int64_t step, float* grads) {
        if (poisoner && step == 2) grads[0] = std::numeric_limits<float>::quiet_NaN();
    });
    trainer.step();
    const std::vector<float> before(trainer.model().params(),
                                    trainer.model().params() + trainer.model().num_params());
    const StepRecord skipped = trainer.step();
    EXPECT_FALSE(std::isfinite(skipped.grad_norm)) << "rank " << mpi_world().rank();
    EXPECT_TRUE(trainer.last_step_skipped()) << "rank " << mpi_world().rank();
    EXPECT_EQ(trainer.skipped_steps(), 1);
    const std::vector<float> after(trainer.model().params(),
                                   trainer.model().params() + trainer.model().num_params());
    EXPECT_EQ(before, after) << "rank " << mpi_world().rank() << " moved in a skipped step";
    trainer.step();
    EXPECT_FALSE(trainer.last_step_skipped());
}

// A pipeline of data-parallel replicas (ZeRO-1 per stage), and expert parallelism inside a stage.
TEST(MpiTrainer, PipelineWithDataOrExpertParallelMatchesOneProcess) {
    if (mpi_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
    run_trainer_case({.layout = "pp2.dp2", .grad_accum = 3});
    run_trainer_case({.layout = "pp2.ep2", .grad_accum = 2});
}

// Redundant experts sum their replicas' gradients in the last micro-batch's backward, which an
// interleaved pipeline splits: the combination is refused, on every rank alike.
TEST(MpiTrainer, RedundantExpertsUnderAPipelineAreRefused) {
    if (mpi_world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
    const ModelConfig model = tiny_config();
    const TrainConfig c = trainer_config(2);
    TrainParallel p;
    p.world = &mpi_world();
    p.layout = "pp2.ep2";
    p.moe.redundant_experts = 2;
    try {
        trainer_run(model, c, p);
        ADD_FAILURE() << "no error for --redundant-experts under pp2.ep2";
    } catch (const UserError& e) {
        EXPECT_NE(std::string(e.what()).find("pipeline"), std::string::npos) << e.what();
    }
}

// ZeRO-1 shards the routed experts' optimizer state over the expert-data-parallel group: with
// edp > 1 each rank keeps 1/edp of the replicated baseline's expert moments (up to one padding
// float per bucket), the shards of the EDP group tile the experts once, and after a few steps
// they hold the same numbers as the replicated moments (the trainer's losses and parameters are
// checked against one process by the cases above, which include these layouts).
void expect_expert_state_sharded(const std::string& layout) {
    const ModelConfig model = tiny_config();
    TrainConfig c = trainer_config(1);
    c.steps = 2;
    TrainParallel p;
    p.world = &mpi_world();
    p.layout = layout;
    p.bucket_mb = 0.0625;
    std::array<std::unique_ptr<Trainer>, 2> trainers;  // replicated, zero1
    for (const bool zero1 : {false, true}) {
        TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/40000);
        DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                          c.val_fraction, c.seed);
        p.zero1 = zero1;
        std::unique_ptr<Trainer>& t = trainers[static_cast<size_t>(zero1)];
        t = std::make_unique<Trainer>(model, c, std::move(loader), p);
        for (int64_t s = 0; s < c.steps; ++s) t->step();
    }
    Trainer& replicated = *trainers[0];
    Trainer& sharded = *trainers[1];
    const int edp = sharded.topology().edp;
    ASSERT_GT(edp, 1) << layout;
    AdamW& rep_opt = replicated.optimizer();
    AdamW& zero_opt = sharded.optimizer();
    constexpr auto kExperts = parallel::ReplicaGroup::expert_data_parallel;
    constexpr auto kData = parallel::ReplicaGroup::data_parallel;

    // Floats per rank: replicated 2 moments per expert float; ZeRO-1 3 per owned float (m, v and
    // the fp32 parameter shard), padding included.
    const int64_t num_buckets = static_cast<int64_t>(sharded.last_sync_stats().num_buckets);
    const int64_t rep_moments = rep_opt.state_numel(kExperts);
    const int64_t zero_moments = zero_opt.state_numel(kExperts) / 3 * 2;
    EXPECT_GT(rep_moments, 0) << layout;
    EXPECT_GE(zero_moments * edp, rep_moments) << layout;
    EXPECT_LE(zero_moments * edp, rep_moments + 2 * edp * num_buckets) << layout;
    EXPECT_LT(sharded.optimizer_state_numel(), replicated.optimizer_state_numel()) << layout;
    EXPECT_EQ(zero_opt.state_numel(kData) + zero_opt.state_numel(kExperts),
              sharded.optimizer_state_numel());
    if (mpi_world().rank() == 0)
        std::printf(
            "[state] %s: expert optimizer floats per rank %lld replicated, %lld zero1 "
            "(edp %d); all optimizer floats %lld -> %lld\n",
            layout.c_str(), static_cast<long long>(rep_moments),
            static_cast<long long>(zero_opt.state_numel(kExperts)), edp,
            static_cast<long long>(replicated.optimizer_state_numel()),
            static_cast<long long>(sharded.optimizer_state_numel()));

    // Each sharded expert range lies inside a replicated one, with the same moments; over the
    // EDP group (all ranks with this rank's experts) they cover every expert float once.
    std::vector<parallel::ParamSpan> spans = sharded.model().param_spans();
    auto is_expert = [&](int64_t offset) {
        for (const parallel::ParamSpan& sp : spans)
            if (offset >= sp.offset && offset < sp.offset + sp.numel) return sp.group == kExperts;
        return false;
    };
    const std::vector<AdamW::MomentRange> rep = rep_opt.moment_ranges();
    // The two sum the same gradients in different orders (reduce-scatter vs all-reduce).
    auto rel = [](float got, float want) {
        return std::fabs(static_cast<double>(got) - want) / (std::fabs(want) + 1e-12);
    };
    std::array<double, 2> owned{};  // expert floats owned here, worst relative moment difference
    for (const AdamW::MomentRange& r : zero_opt.moment_ranges()) {
        if (!is_expert(r.offset)) continue;
        EXPECT_FALSE(r.replicated) << layout;
        owned[0] += static_cast<double>(r.numel);
        const auto in = std::find_if(rep.begin(), rep.end(), [&](const auto& q) {
            return q.offset <= r.offset && r.offset + r.numel <= q.offset + q.numel;
        });
        ASSERT_NE(in, rep.end()) << layout << " range at " << r.offset;
        for (int64_t i = 0; i < r.numel; ++i) {
            const int64_t j = r.offset - in->offset + i;
            owned[1] = std::max({owned[1], rel(r.m[i], in->m[j]), rel(r.v[i], in->v[j])});
        }
    }
    EXPECT_LE(owned[1], 1e-4) << layout << ": sharded and replicated expert moments differ";
    // Summed over the world, each expert float is owned once per EDP group: the world holds
    // world/edp groups of experts (one per EP x TP position).
    mpi_world().all_reduce_sum(std::span<double>(owned.data(), 1), kHostStream);
    EXPECT_EQ(owned[0] * edp, static_cast<double>(rep_moments / 2 * mpi_world().size())) << layout;
}

TEST(MpiTrainer, Zero1ShardsTheExpertStateOverExpertDataParallel) {
    if (mpi_world().size() == 1) GTEST_SKIP() << "needs edp > 1: 2 ranks";
    expect_expert_state_sharded("");  // experts replicated on every rank: edp = world
    if (mpi_world().size() == 4) {
        expect_expert_state_sharded("dp4.ep2");  // ep2 on 4 ranks: edp 2
        expect_expert_state_sharded("tp2.ep2");
    }
}

TEST(MpiTrainer, BatchThatDoesNotSplitOverTheRanksIsNamed) {
    if (mpi_world().size() == 1) GTEST_SKIP() << "every batch splits over one rank";
    const ModelConfig model = tiny_config();
    TrainConfig c = trainer_config(1);
    c.batch_size = mpi_world().size() + 1;
    TrainParallel p;
    p.world = &mpi_world();
    try {
        trainer_run(model, c, p);
        ADD_FAILURE() << "no error for batch_size " << c.batch_size;
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("do not split"), std::string::npos) << e.what();
    }
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
