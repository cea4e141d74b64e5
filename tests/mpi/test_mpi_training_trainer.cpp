// N ranks train the same as one process through train/trainer.h (training_equivalence.h):
// Trainer::step on N ranks (a RunPlan over the MPI world) in data, expert and tensor parallel
// layouts against Trainer::step on one process (a world of one, with the same optimizer,
// train/optimizer.h); ZeRO-1 shards the experts' optimizer state over expert data parallelism; a
// batch that does not split over the ranks is named. The pipelines are
// test_mpi_training_pipeline.cpp's.
//
// Runs under mpirun -np 1, 2 and 4; a layout that needs another world size is skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/optimizer.h"
#include "moetron/train/trainer.h"
#include "mpi/mpi_test_main.h"
#include "mpi/training_equivalence.h"

namespace moetron::testing {
namespace {

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

// ZeRO-1 shards the routed experts' optimizer state over the expert-data-parallel group: with
// edp > 1 each rank keeps 1/edp of the replicated baseline's expert moments (up to one padding
// float per bucket), the shards of the EDP group tile the experts once, and after a few steps
// they hold the same numbers as the replicated moments (the trainer's losses and parameters are
// checked against one process by the cases above, which include these layouts).
void expect_expert_state_sharded(const std::string& layout) {
    const ModelConfig model = tiny_config();
    TrainConfig c = trainer_config(1);
    c.steps = 2;
    RunSettings p;
    parallel::Communicator* job = &mpi_world();
    p.layout = layout;
    p.bucket_mb = 0.0625;
    std::array<std::unique_ptr<Trainer>, 2> trainers;  // replicated, zero1
    for (const bool zero1 : {false, true}) {
        TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/40000);
        DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                          c.val_fraction, c.seed);
        p.zero1 = zero1;
        std::unique_ptr<Trainer>& t = trainers[static_cast<size_t>(zero1)];
        t = std::make_unique<Trainer>(model, c, std::move(loader),
                                      plan_run(model, c, p, job != nullptr ? job->size() : 1), job);
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
    RunSettings p;
    parallel::Communicator* job = &mpi_world();
    try {
        trainer_run(model, c, p, job);
        ADD_FAILURE() << "no error for batch_size " << c.batch_size;
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("do not split"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace moetron::testing
