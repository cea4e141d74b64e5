// What "N ranks train the same as one process" means for the MPI training tests
// (test_mpi_training.cpp: the step assembled by hand; test_mpi_training_trainer.cpp and
// test_mpi_training_pipeline.cpp: train/trainer.h's step): the tiny model
// (configs/models/tiny.toml) trained for 5 steps on one global batch per step, once in this process
// alone (the reference) and once over the world in a parallel layout. Per-step losses must agree
// within 1e-5 relative, final parameters (each rank's share, experts against their slice, a tensor
// split over TP against its slice of the reference) within 1e-4 relative per tensor (see
// kParamL2Tolerance), router biases exactly.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moetron/model/model.h"
#include "moetron/parallel/grad_sync.h"
#include "moetron/parallel/topology.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/optimizer.h"
#include "moetron/train/trainer.h"
#include "mpi/mpi_test_main.h"

namespace moetron::testing {

// The run both sides train.
inline constexpr int64_t kGlobalBatch = 8;  // sequences per step, over all ranks
inline constexpr int64_t kSeq = 32;
inline constexpr int kSteps = 5;
inline constexpr uint64_t kSeed = 1234;
inline constexpr double kLr = 3e-3;
inline constexpr float kBiasSpeed = 1e-3f;
inline const LossWeights kLossWeights{0.3f, 1e-4f};

inline ModelConfig tiny_config() {
    return load_model_config(std::string(MOETRON_SOURCE_DIR) + "/configs/models/tiny.toml");
}

inline AdamWConfig adamw_config() {
    AdamWConfig c;
    c.grad_clip = 1.0;
    c.weight_decay = 0.1;
    return c;
}

// ---- one run's result against the reference's ----

struct StepLosses {
    double lm = 0, mtp = 0, balance = 0;
};

struct RunResult {
    std::vector<StepLosses> losses;
    std::vector<float> params;
    std::vector<ParamEntry> entries;
    ExpertShard shard;
};

// The elements of the reference tensor `want` (its whole flat data) that the local tensor `e`
// holds: a TP shard's slice, a routed-expert shard's experts, or all of it.
inline std::vector<float> reference_slice(const ParamEntry& e, const ParamEntry& want_entry,
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
inline TensorError tensor_error(const float* got, const float* want, int64_t n,
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
inline constexpr double kParamL2Tolerance = 1e-4;
inline constexpr double kParamMaxAbsTolerance = 0.1 * kLr;
inline constexpr double kLossTolerance = 1e-5;

// holders: the ranks that hold this rank's tensors (null: the world); with pipeline parallelism
// the ranks of its stage, over which a tensor split by TP is measured whole.
inline void expect_matches_reference(const RunResult& got, const RunResult& want,
                                     const std::string& what, bool pipelined = false,
                                     parallel::Communicator* holders = nullptr) {
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

// Expert parallel over the whole world.
inline std::string ep_world() {
    return "ep" + std::to_string(mpi_world().size());
}

// ---- the trainer (moetron train's step) on N ranks against the same trainer on one process ----

inline TrainConfig trainer_config(int64_t grad_accum) {
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

// job: the world, or null for one process.
inline TrainerRun trainer_run(const ModelConfig& model, const TrainConfig& c, const RunSettings& p,
                              parallel::Communicator* job = nullptr) {
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/40000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    Trainer trainer(model, c, std::move(loader),
                    plan_run(model, c, p, job != nullptr ? job->size() : 1), job);
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

inline TrainerRun run_trainer_case(const TrainerCase& k) {
    ModelConfig model = tiny_config();
    if (!k.mtp) model.num_nextn_predict_layers = 0;
    const TrainConfig c = trainer_config(k.grad_accum);
    const TrainerRun want = trainer_run(model, c, {});
    RunSettings p;
    parallel::Communicator* job = &mpi_world();
    p.layout = k.layout;
    p.bucket_mb = 0.0625;  // several buckets even for the tiny model
    p.zero1 = k.zero1;
    p.overlap_dp_grad = k.overlap;
    p.pp_schedule = k.pp_schedule;
    const TrainerRun got = trainer_run(model, c, p, job);
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

inline void run_trainer_case(const std::string& layout, bool zero1, bool overlap,
                             int64_t grad_accum) {
    run_trainer_case(
        {.layout = layout, .zero1 = zero1, .overlap = overlap, .grad_accum = grad_accum});
}

}  // namespace moetron::testing
