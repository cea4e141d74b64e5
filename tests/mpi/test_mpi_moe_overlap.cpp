// The MoE overlap (--moe-overlap shared | dual, model/moe.h) trains the same model as no overlap:
// the tiny model (configs/models/tiny.toml) trained for a few steps through train/trainer.h, once
// with each overlap, in every layout this world size allows (the local dispatcher on one rank;
// flat and two_tier over ep2 / ep4; tp2.ep2 on four ranks). Per-step losses and gradient norms
// agree within 1e-5 relative and the final parameters within 1e-5 (relative to max(1, |p|)): the
// same rows are exchanged and the same sums taken, only the expert weight gradients of the two
// halves of dual are summed in another order. The byte counts are identical. A routing that sends
// every token to rank 0's experts (the other ranks receive none) trains the same too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "moetron/model/model.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/trainer.h"
#include "mpi/mpi_test_main.h"

namespace moetron::testing {
namespace {

constexpr int kSteps = 3;
constexpr double kRelTolerance = 1e-5;
constexpr double kLr = 3e-3;

ModelConfig tiny_config() {
    return load_model_config(std::string(MOETRON_SOURCE_DIR) + "/configs/models/tiny.toml");
}

struct Variant {
    std::string layout;
    parallel::DispatchKind dispatch = parallel::DispatchKind::flat;
    int domain_size = 0;
    bool skewed = false;  // every token routed to experts 0 and 1 (rank 0's with ep >= 2)
    std::string name() const {
        return layout + " " + std::string(parallel::dispatch_kind_name(dispatch)) + " domain " +
               std::to_string(domain_size) + (skewed ? " skewed" : "");
    }
};

struct TrainingRun {
    std::vector<StepRecord> steps;
    std::vector<float> first_grads;  // this rank's gradients of the first step
    std::vector<float> params;       // this rank's parameters after the last step
};

TrainingRun train(const ModelConfig& model, const Variant& v, MoeOverlap overlap) {
    TrainConfig c;
    c.batch_size = 8;
    c.seq_len = 32;
    c.steps = kSteps;
    c.warmup_steps = 1;
    c.lr = kLr;
    c.min_lr = 3e-4;
    c.seed = 1234;
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/40000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    RunSettings p;
    parallel::Communicator* job = &mpi_world();
    p.layout = v.layout;
    p.domain_size = v.domain_size;
    p.moe.dispatch = v.dispatch;
    p.moe.overlap = overlap;
    Trainer trainer(model, c, std::move(loader),
                    plan_run(model, c, p, job != nullptr ? job->size() : 1), job);
    if (v.skewed) {
        // A correction bias far above the scores picks experts 0 and 1 (router group 0) for
        // every token; the bias update moves it by gamma per step only.
        for (const ParamEntry& e : trainer.model().param_entries()) {
            if (!e.name.ends_with("router_bias")) continue;
            float* bias = trainer.model().param(e.name).f32();
            bias[0] = bias[1] = 100.0f;
        }
    }
    TrainingRun run;
    const auto n = static_cast<size_t>(trainer.model().num_params());
    for (int s = 0; s < kSteps; ++s) {
        run.steps.push_back(trainer.step());
        // The gradients stay in grads() until the next step zeroes them.
        if (s == 0) run.first_grads.assign(trainer.model().grads(), trainer.model().grads() + n);
    }
    run.params.assign(trainer.model().params(), trainer.model().params() + n);
    return run;
}

double rel(double got, double want) {
    return std::abs(got - want) / std::max(std::abs(want), 1e-30);
}

// The MoE layers of the tiny model (main and MTP): one routing each per micro-batch.
int64_t num_moe_layers(const ModelConfig& c) {
    int64_t n = c.num_moe_layers();
    for (int64_t d = 0; d < c.num_nextn_predict_layers; ++d) n += c.mtp_layer_is_moe(d);
    return n;
}

void expect_same_training(const TrainingRun& got, const TrainingRun& want, bool dual,
                          int64_t num_routings_per_step, const std::string& what) {
    ASSERT_EQ(got.steps.size(), want.steps.size());
    for (size_t s = 0; s < want.steps.size(); ++s) {
        const StepRecord &g = got.steps[s], &w = want.steps[s];
        const std::string at = what + " step " + std::to_string(s + 1);
        EXPECT_LE(rel(g.loss, w.loss), kRelTolerance) << at << ": " << g.loss << " vs " << w.loss;
        EXPECT_LE(rel(g.mtp_loss, w.mtp_loss), kRelTolerance) << at;
        EXPECT_LE(rel(g.balance_loss, w.balance_loss), kRelTolerance) << at;
        EXPECT_LE(rel(g.grad_norm, w.grad_norm), kRelTolerance) << at;
        // The same rows travel; dual routes each half apart, which adds one count per peer and
        // hop to each MoE layer's layout exchange.
        const double extra = dual ? 4.0 * mpi_world().size() * num_routings_per_step : 0.0;
        for (auto [got_bytes, want_bytes] :
             {std::pair{g.dispatch_intra_domain_bytes, w.dispatch_intra_domain_bytes},
              std::pair{g.dispatch_inter_domain_bytes, w.dispatch_inter_domain_bytes}}) {
            EXPECT_GE(got_bytes, want_bytes) << at;
            EXPECT_LE(got_bytes, want_bytes + extra) << at;
        }
    }
    // The first step's gradients, against the largest one (a gradient at rounding level has no
    // relative precision to compare).
    ASSERT_EQ(got.first_grads.size(), want.first_grads.size()) << what;
    double scale = 0, worst_grad = 0;
    for (float g : want.first_grads) scale = std::max(scale, std::abs(static_cast<double>(g)));
    for (size_t i = 0; i < want.first_grads.size(); ++i)
        worst_grad = std::max(
            worst_grad, std::abs(static_cast<double>(got.first_grads[i]) - want.first_grads[i]));
    EXPECT_LE(worst_grad, kRelTolerance * scale) << what << ": first step's gradients";
    // The parameters after the last step. AdamW divides each gradient by its own RMS, so an
    // element whose gradient is at rounding level moves by up to lr per step either way: the
    // bound is kRelTolerance or that (lr * steps), whichever is larger.
    ASSERT_EQ(got.params.size(), want.params.size()) << what;
    double worst = 0;
    size_t worst_at = 0;
    for (size_t i = 0; i < want.params.size(); ++i) {
        const double d = std::abs(static_cast<double>(got.params[i]) - want.params[i]) /
                         std::max(1.0, std::abs(static_cast<double>(want.params[i])));
        if (d > worst) worst = d, worst_at = i;
    }
    std::printf(
        "[overlap] %s: worst gradient difference %.3g (largest gradient %.3g), worst "
        "parameter difference %.3g\n",
        what.c_str(), worst_grad, scale, worst);
    EXPECT_LE(worst, std::max(kRelTolerance, kLr * kSteps))
        << what << ": parameter " << worst_at << " is " << got.params[worst_at]
        << ", without overlap " << want.params[worst_at];
}

// The layouts of this world size.
std::vector<Variant> variants(const ModelConfig& model) {
    const int world = mpi_world().size();
    const std::string ep = "ep" + std::to_string(world);
    std::vector<Variant> out = {{ep, parallel::DispatchKind::flat, 0, false},
                                {ep, parallel::DispatchKind::flat, 0, true}};
    for (int L = 1; L < world; ++L) {
        if (world % L != 0 || model.n_group % (world / L) != 0) continue;
        out.push_back({ep, parallel::DispatchKind::two_tier, L, false});
        out.push_back({ep, parallel::DispatchKind::two_tier, L, true});
    }
    if (world == 4) {
        out.push_back({"tp2.ep2", parallel::DispatchKind::flat, 0, false});
        out.push_back({"tp2.ep2", parallel::DispatchKind::flat, 0, true});
    }
    return out;
}

TEST(MpiMoeOverlap, SharedAndDualTrainAsNoOverlap) {
    const ModelConfig model = tiny_config();
    for (const Variant& v : variants(model)) {
        const TrainingRun off = train(model, v, MoeOverlap::off);
        for (MoeOverlap overlap : {MoeOverlap::shared, MoeOverlap::dual}) {
            const TrainingRun run = train(model, v, overlap);
            expect_same_training(run, off, overlap == MoeOverlap::dual, num_moe_layers(model),
                                 v.name() + " overlap " + std::string(moe_overlap_name(overlap)));
        }
    }
}

// Without shared experts the overlap has only the routed experts to work with.
TEST(MpiMoeOverlap, DualWithoutSharedExperts) {
    ModelConfig model = tiny_config();
    model.n_shared_experts = 0;
    const Variant v{"ep" + std::to_string(mpi_world().size()), parallel::DispatchKind::flat, 0,
                    false};
    const TrainingRun off = train(model, v, MoeOverlap::off);
    expect_same_training(train(model, v, MoeOverlap::dual), off, true, num_moe_layers(model),
                         v.name() + " no shared experts");
}

TEST(MpiMoeOverlap, NamesParse) {
    EXPECT_EQ(parse_moe_overlap("off"), MoeOverlap::off);
    EXPECT_EQ(parse_moe_overlap("shared"), MoeOverlap::shared);
    EXPECT_EQ(parse_moe_overlap("dual"), MoeOverlap::dual);
    EXPECT_EQ(moe_overlap_name(MoeOverlap::dual), "dual");
    EXPECT_THROW(parse_moe_overlap("both"), Error);
}

}  // namespace
}  // namespace moetron::testing
