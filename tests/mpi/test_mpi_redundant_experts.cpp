// Redundant experts (--redundant-experts R, parallel/expert_placement.h) and their rebalancing
// (--rebalance-every N, train/expert_balance.h) do not change the math: the tiny model trained
// expert parallel over the world with R = ep spare slots (one per rank), placed anew every 2
// steps with the slots' weights and moments migrated, gives the losses and gradient norms of the
// same run without them (1e-5 relative), flat and two_tier over emulated domains, and with the
// experts' ZeRO-1 shards over an EDP group (the migration then moves the sharded moments too).
// The replicas of an expert are bit-identical after every step; a checkpoint keeps logical
// experts, so a run saved with R resumes without R (and the other way) on the same losses, and one
// saved right after a migration (also under ZeRO-1) resumes bit for bit.
//
// Runs under mpirun -np 1, 2 and 4 (one rank has no expert parallelism and is skipped).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "moetron/model/model.h"
#include "moetron/parallel/expert_placement.h"
#include "moetron/train/checkpoint.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/trainer.h"
#include "mpi/mpi_test_main.h"
#include "mpi/shared_temp_dir.h"

namespace moetron::testing {
namespace {

constexpr int kSteps = 6;
constexpr int kSaveAt = 3;
constexpr double kRelTolerance = 1e-5;

ModelConfig tiny_config() {
    return load_model_config(std::string(MOETRON_SOURCE_DIR) + "/configs/models/tiny.toml");
}

struct RunSetup {
    std::string layout;
    int domain_size = 0;
    parallel::DispatchKind dispatch = parallel::DispatchKind::flat;
    int64_t redundant = 0;
    int64_t rebalance_every = 0;
    std::string str() const {
        return fmt::format("{} domain_size {} {} R {} rebalance every {}", layout, domain_size,
                           parallel::dispatch_kind_name(dispatch), redundant, rebalance_every);
    }
};

std::unique_ptr<Trainer> make_trainer(const ModelConfig& model, const RunSetup& s) {
    TrainConfig c;
    c.batch_size = 8;
    c.seq_len = 16;
    c.steps = kSteps;
    c.warmup_steps = 2;
    c.lr = 3e-3;
    c.min_lr = 3e-4;
    c.seed = 1234;
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/20000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    RunSettings p;
    parallel::Communicator* job = &mpi_world();
    p.layout = s.layout;
    p.domain_size = s.domain_size;
    p.moe.dispatch = s.dispatch;
    p.moe.redundant_experts = s.redundant;
    p.moe.rebalance_every = s.rebalance_every;
    p.bucket_mb = 0.0625;  // several buckets: ZeRO-1 shards cut the expert tensors
    const RunPlan plan = plan_run(model, c, p, job->size());
    auto trainer = std::make_unique<Trainer>(model, c, std::move(loader), plan, job);
    // The plan of this rank's memory (`moetron info`'s) is what the trainer's model allocated,
    // the spare expert slots included.
    const RankMemoryPlan memory = plan_run_memory(model, c, plan);
    EXPECT_EQ(memory.parameters + memory.gradients + memory.activations + memory.expert_side +
                  memory.communication,
              trainer->model().planned_bytes())
        << s.layout << " with " << s.redundant << " redundant experts";
    return trainer;
}

double rel(double got, double want) {
    return std::abs(got - want) / std::max(std::abs(want), 1e-30);
}

void expect_same_step(const StepRecord& got, const StepRecord& want, const std::string& what) {
    EXPECT_LE(rel(got.loss, want.loss), kRelTolerance) << what << " step " << want.step;
    EXPECT_LE(rel(got.mtp_loss, want.mtp_loss), kRelTolerance) << what << " step " << want.step;
    EXPECT_LE(rel(got.balance_loss, want.balance_loss), kRelTolerance)
        << what << " step " << want.step;
    EXPECT_LE(rel(got.grad_norm, want.grad_norm), kRelTolerance) << what << " step " << want.step;
}

// Every replica of every expert holds the same bits as the expert's first replica, over the EP
// group (each rank's expert tensors all-gathered over the world: the EP groups' ranks are
// consecutive and every rank holds as many slots).
void expect_identical_replicas(const Model& model, const std::string& what) {
    const int world = mpi_world().size();
    for (const ParamEntry& e : model.param_entries()) {
        if (!is_routed_expert_param(e.name)) continue;
        const parallel::ExpertPlacement* placement =
            model.expert_placement(model.moe_layer_of(e.name));
        ASSERT_NE(placement, nullptr) << what;
        const int64_t slots_per_rank = placement->shape.slots_per_rank();
        const int ep_first_rank = mpi_world().rank() / static_cast<int>(placement->shape.ep_size) *
                                  static_cast<int>(placement->shape.ep_size);
        const TensorView local = model.param(e.name);
        std::vector<float> all(static_cast<size_t>(e.numel * world));
        mpi_world().all_gather(all.data(), local.data, static_cast<size_t>(e.numel), DType::f32,
                               kHostStream);
        const int64_t per_slot = e.numel / slots_per_rank;
        auto slot_data = [&](int64_t slot) {
            return all.data() + (ep_first_rank * slots_per_rank + slot) * per_slot;
        };
        for (int64_t x = 0; x < placement->shape.num_experts; ++x) {
            const auto slots = placement->slots_of(x);
            for (size_t r = 1; r < slots.size(); ++r)
                EXPECT_EQ(std::memcmp(slot_data(slots[0]), slot_data(slots[r]),
                                      static_cast<size_t>(per_slot) * sizeof(float)),
                          0)
                    << what << ": " << e.name << " expert " << x << " replica in slot " << slots[r]
                    << " differs from slot " << slots[0];
        }
    }
}

// The balancer's per-step figures, gathered over the EP group in one collective (the rows of
// each MoE layer, then the expert compute time's bits): a rank's rows are at most all of them and
// at least none, so max / mean lies in [1, ep]; the experts' compute time is a real duration (their
// GEMMs over a step's rows take more than 100 ns, where a row count's bits read as a double are a
// denormal) and the slowest rank's is at least the mean; and every rank of an EP group (consecutive
// ranks) computed the same figures from the same gathered record.
void expect_gathered_step_figures(const StepRecord& r, int ep, const std::string& what) {
    const int world = mpi_world().size();
    EXPECT_GE(r.rank_load_max_over_mean, 1.0) << what << " step " << r.step;
    EXPECT_LE(r.rank_load_max_over_mean, static_cast<double>(ep)) << what << " step " << r.step;
    EXPECT_GT(r.expert_compute_mean_s, 1e-7) << what << " step " << r.step;
    // (the mean's divisions and sum may round it an ulp above an equal maximum)
    EXPECT_GE(r.expert_compute_max_s, r.expert_compute_mean_s * (1 - 1e-12))
        << what << " step " << r.step;
    EXPECT_LT(r.expert_compute_max_s, 60.0) << what << " step " << r.step;
    const std::vector<double> mine = {r.rank_load_max_over_mean, r.expert_compute_max_s,
                                      r.expert_compute_mean_s};
    std::vector<double> all(mine.size() * static_cast<size_t>(world));
    mpi_world().all_gather(all.data(), mine.data(), mine.size(), DType::f64, kHostStream);
    for (int rank = 0; rank < world; ++rank) {
        const int first = rank / ep * ep;
        for (size_t i = 0; i < mine.size(); ++i)
            EXPECT_EQ(all[static_cast<size_t>(rank) * mine.size() + i],
                      all[static_cast<size_t>(first) * mine.size() + i])
                << what << " step " << r.step << ": figure " << i << " of rank " << rank
                << " differs from rank " << first << "'s, the first of its EP group";
    }
}

std::vector<RunSetup> setups(int world) {
    const std::string ep = fmt::format("ep{}", world);
    std::vector<RunSetup> out = {{ep, 0, parallel::DispatchKind::flat, world, 2}};
    // two_tier over two emulated domains (tiny's 4 router groups split over them).
    out.push_back({ep, world / 2, parallel::DispatchKind::two_tier, world, 2});
    // The experts' ZeRO-1 shards over an EDP group of 2, placed anew every 2 steps: the
    // migration moves the sharded moments too.
    if (world == 4) out.push_back({"ep2", 0, parallel::DispatchKind::flat, 2, 2});
    return out;
}

TEST(MpiRedundantExperts, TrainLikeTheRunWithoutThemWithIdenticalReplicas) {
    const int world = mpi_world().size();
    if (world < 2) GTEST_SKIP() << "redundant experts need expert parallelism";
    const ModelConfig model = tiny_config();
    for (const RunSetup& with : setups(world)) {
        RunSetup without = with;
        without.redundant = 0;
        without.rebalance_every = 0;
        auto base = make_trainer(model, without);
        auto eplb = make_trainer(model, with);
        // One spare slot per EP rank: some expert has two replicas.
        const parallel::ExpertPlacement* placement = eplb->model().expert_placement(0);
        ASSERT_NE(placement, nullptr);
        int64_t max_replicas = 0;
        for (int64_t x = 0; x < placement->shape.num_experts; ++x)
            max_replicas = std::max(max_replicas, placement->replicas(x));
        EXPECT_GE(max_replicas, 2) << with.str();
        double migrated_slots = 0;
        for (int s = 0; s < kSteps; ++s) {
            const StepRecord want = base->step();
            const StepRecord got = eplb->step();
            expect_same_step(got, want, with.str());
            expect_identical_replicas(eplb->model(),
                                      fmt::format("{} after step {}", with.str(), s + 1));
            EXPECT_EQ(got.rebalanced, with.rebalance_every > 0 && (s + 1) % 2 == 0) << with.str();
            expect_gathered_step_figures(got, static_cast<int>(placement->shape.ep_size),
                                         with.str());
            migrated_slots += got.rebalance_migrated_slots;
        }
        // The rebalances moved slots (so the equality above covers a migration).
        if (with.rebalance_every > 0) {
            EXPECT_GT(migrated_slots, 0) << with.str();
        }
    }
}

// A checkpoint keeps logical experts: saved with R, it resumes without R, and saved without R it
// resumes with R, each on the losses of the straight run; one saved right after a migration
// (rebalancing every kSaveAt steps) keeps the placements and the moving averages, so resumed with
// rebalancing it continues bit for bit as the straight run with rebalancing.
TEST(MpiRedundantExperts, CheckpointsResumeWithAnotherNumberOfRedundantExperts) {
    const int world = mpi_world().size();
    if (world < 2) GTEST_SKIP() << "redundant experts need expert parallelism";
    const ModelConfig model = tiny_config();
    SharedTempDir dir(mpi_world());
    const std::string ep = fmt::format("ep{}", world);
    const RunSetup with{ep, 0, parallel::DispatchKind::flat, world};
    const RunSetup without{ep, 0, parallel::DispatchKind::flat, 0};
    const RunSetup rebalancing{ep, 0, parallel::DispatchKind::flat, world, kSaveAt};
    std::vector<std::pair<RunSetup, RunSetup>> cases = {
        {with, without}, {without, with}, {rebalancing, rebalancing}};
    // On 4 ranks also ep2 x edp2, whose ZeRO-1 shards split the experts' moments.
    if (world == 4)
        cases.push_back({{"ep2", 0, parallel::DispatchKind::flat, 2, kSaveAt},
                         {"ep2", 0, parallel::DispatchKind::flat, 2, kSaveAt}});
    for (const auto& [saved_as, resumed_as] : cases) {
        const std::string what =
            fmt::format("saved as {}, resumed as {}", saved_as.str(), resumed_as.str());
        std::vector<StepRecord> want;  // the straight run of the layout without R
        {
            auto straight =
                make_trainer(model, {saved_as.layout, 0, parallel::DispatchKind::flat, 0});
            for (int s = 0; s < kSteps; ++s) want.push_back(straight->step());
        }
        std::vector<StepRecord> want_rebalancing;  // the straight run with rebalancing
        if (saved_as.rebalance_every > 0) {
            auto straight_rebalancing = make_trainer(model, saved_as);
            for (int s = 0; s < kSteps; ++s)
                want_rebalancing.push_back(straight_rebalancing->step());
        }
        auto first = make_trainer(model, saved_as);
        double migrated = 0;
        for (int s = 0; s < kSaveAt; ++s) migrated += first->step().rebalance_migrated_slots;
        if (saved_as.rebalance_every > 0) {
            EXPECT_GT(migrated, 0) << what;
        }
        const auto root = dir.path() / fmt::format("{}-R{}-every{}", saved_as.layout,
                                                   saved_as.redundant, saved_as.rebalance_every);
        save_checkpoint(*first, root, 0);
        first.reset();
        auto resumed = make_trainer(model, resumed_as);
        load_checkpoint(*resumed, root);
        for (int s = kSaveAt; s < kSteps; ++s) {
            const StepRecord got = resumed->step();
            expect_same_step(got, want[static_cast<size_t>(s)], what);
            if (saved_as.rebalance_every > 0) {
                const StepRecord& exact = want_rebalancing[static_cast<size_t>(s)];
                EXPECT_EQ(got.loss, exact.loss) << what << " step " << s + 1;
                EXPECT_EQ(got.grad_norm, exact.grad_norm) << what << " step " << s + 1;
                EXPECT_EQ(got.rebalance_migrated_slots, exact.rebalance_migrated_slots) << what;
            }
        }
        if (resumed_as.redundant > 0) expect_identical_replicas(resumed->model(), what);
    }
}

}  // namespace
}  // namespace moetron::testing
