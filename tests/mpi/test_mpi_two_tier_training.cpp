// Training with the two-tier dispatch equals training with the flat one: the tiny model
// (configs/models/tiny.toml) trained for a few steps through train/trainer.h, expert parallel
// over the world in emulated domains (--domain-size), once with --dispatch flat and once with
// --dispatch two_tier. Per-step losses and gradient norms must agree within 1e-5 relative; the
// two-tier run sends no more inter-domain bytes over the job, and its tokens reach at most
// topk_group domains.
//
// Runs under mpirun -np 1, 2 and 4: 2 domains of 1 rank on 2 ranks, 2 domains of 2 and 4 domains
// of 1 on 4 ranks; one rank has no second domain and is skipped.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/model/model.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/trainer.h"
#include "mpi/mpi_test_main.h"

namespace moetron::testing {
namespace {

constexpr int kSteps = 4;
constexpr double kRelTolerance = 1e-5;

ModelConfig tiny_config() {
    return load_model_config(std::string(MOETRON_SOURCE_DIR) + "/configs/models/tiny.toml");
}

TrainConfig train_config() {
    TrainConfig c;
    c.batch_size = 8;
    c.seq_len = 32;
    c.steps = kSteps;
    c.warmup_steps = 2;
    c.lr = 3e-3;
    c.min_lr = 3e-4;
    c.seed = 1234;
    return c;
}

struct TrainingRun {
    std::vector<StepRecord> steps;
    std::string kind;        // the dispatcher's kind: "flat" or "two_tier"
    std::string dispatcher;  // and its description
};

TrainingRun train(const ModelConfig& model, parallel::DispatchKind dispatch, int domain_size) {
    const TrainConfig c = train_config();
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/40000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    RunSettings p;
    parallel::Communicator* job = &mpi_world();
    p.layout = "ep" + std::to_string(mpi_world().size());
    p.domain_size = domain_size;
    p.moe.dispatch = dispatch;
    Trainer trainer(model, c, std::move(loader),
                    plan_run(model, c, p, job != nullptr ? job->size() : 1), job);
    TrainingRun run;
    run.kind = trainer.model().expert_dispatcher()->kind();
    run.dispatcher = trainer.model().expert_dispatcher()->description();
    for (int s = 0; s < kSteps; ++s) run.steps.push_back(trainer.step());
    return run;
}

double rel(double got, double want) {
    return std::abs(got - want) / std::max(std::abs(want), 1e-30);
}

void expect_same_training(const TrainingRun& two_tier, const TrainingRun& flat,
                          const std::string& what) {
    ASSERT_EQ(two_tier.steps.size(), flat.steps.size());
    for (size_t s = 0; s < flat.steps.size(); ++s) {
        const StepRecord &g = two_tier.steps[s], &w = flat.steps[s];
        EXPECT_LE(rel(g.loss, w.loss), kRelTolerance) << what << " step " << s + 1;
        EXPECT_LE(rel(g.mtp_loss, w.mtp_loss), kRelTolerance) << what << " step " << s + 1;
        EXPECT_LE(rel(g.balance_loss, w.balance_loss), kRelTolerance) << what << " step " << s + 1;
        EXPECT_LE(rel(g.grad_norm, w.grad_norm), kRelTolerance) << what << " step " << s + 1;
    }
}

TEST(MpiTwoTierTraining, LossesEqualFlatOnEveryDomainSplit) {
    const int world = mpi_world().size();
    if (world < 2) GTEST_SKIP() << "two tiers need two domains, so at least 2 ranks";
    const ModelConfig model = tiny_config();
    for (int L = 1; L < world; ++L) {
        if (world % L != 0 || model.n_group % (world / L) != 0) continue;
        const std::string what = "ep" + std::to_string(world) + " domain_size " + std::to_string(L);
        const TrainingRun flat = train(model, parallel::DispatchKind::flat, L);
        const TrainingRun two_tier = train(model, parallel::DispatchKind::two_tier, L);
        EXPECT_EQ(two_tier.kind, "two_tier") << two_tier.dispatcher;
        expect_same_training(two_tier, flat, what);
        for (size_t s = 0; s < flat.steps.size(); ++s) {
            const StepRecord &g = two_tier.steps[s], &w = flat.steps[s];
            EXPECT_GT(w.dispatch_inter_domain_bytes, 0) << what;
            // Over the job (not per rank: a forwarding rank sends back what its domain
            // returns), a token crosses to a domain once instead of once per rank there.
            std::array<double, 2> inter = {g.dispatch_inter_domain_bytes,
                                           w.dispatch_inter_domain_bytes};
            mpi_world().all_reduce_sum(std::span<double>(inter), kHostStream);
            EXPECT_LE(inter[0], inter[1]) << what << " step " << s + 1;
            // Domain-limited routing: the router's groups map to domains, topk_group bounds them.
            EXPECT_LE(g.domains_per_token_max, static_cast<double>(model.topk_group)) << what;
            // The first step routes with the same parameters, so the same spread.
            if (s == 0) {
                EXPECT_EQ(g.domains_per_token_mean, w.domains_per_token_mean) << what;
            }
        }
    }
}

// two_tier over an EP group inside one domain is the flat dispatch, and says so.
TEST(MpiTwoTierTraining, OneDomainFallsBackToFlat) {
    if (mpi_world().size() < 2) GTEST_SKIP() << "one rank has no expert parallelism";
    const ModelConfig model = tiny_config();
    const TrainingRun flat = train(model, parallel::DispatchKind::flat, 0);
    const TrainingRun two_tier = train(model, parallel::DispatchKind::two_tier, 0);
    EXPECT_EQ(two_tier.kind, "flat") << two_tier.dispatcher;
    EXPECT_NE(two_tier.dispatcher.find("one domain"), std::string::npos) << two_tier.dispatcher;
    expect_same_training(two_tier, flat, "one domain");
}

// Router groups that straddle domains would let topk_group bound nothing: an error at start-up.
TEST(MpiTwoTierTraining, RouterGroupsThatStraddleDomainsAreAnError) {
    if (mpi_world().size() < 2) GTEST_SKIP() << "two tiers need two domains, so at least 2 ranks";
    ModelConfig model = tiny_config();
    model.n_group = 1;
    model.topk_group = 1;
    try {
        train(model, parallel::DispatchKind::two_tier, 1);
        ADD_FAILURE() << "no error for n_group 1 over " << mpi_world().size() << " domains";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("needs n_group (1) to be a multiple of"),
                  std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace moetron::testing
