// MXFP8 training does not depend on the layout: the trainer with --precision mxfp8 over ep2 (2
// ranks) and tp2.ep2 (4 ranks) gives the losses of one process with mxfp8.
//
// Why it can: every MXFP8 block lies along one GEMM's reduction dimension inside what one rank
// holds. Row-wise blocks lie inside one token's row or one weight row; column-wise blocks run
// down one expert's token segment or one rank's tokens (128 per rank here, a multiple of 32, so
// the blocks are the one-process blocks). A block that would straddle a tensor-parallel split is
// cut there: each rank quantizes its own shard (as TE does), which equals one process exactly
// when the split reduction dimension is a multiple of 32 per rank and agrees to the format's
// rounding otherwise (tiny's shared expert, 32 wide, is 16 per rank under tp2: its tp2.ep2
// losses then differ by 3e-4 relative at step 5, so the test widens that expert). Floating-point
// sums in another order can also move a value across an E4M3 rounding boundary, so losses
// agree to a tolerance well under the mxfp8-vs-fp32 difference, not bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "moetron/model/config.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/trainer.h"
#include "mpi/mpi_test_main.h"

namespace moetron::testing {
namespace {

constexpr int kSteps = 6;

struct Losses {
    std::vector<double> train;
    double val = 0;
};

Losses run(Precision precision, const std::string& layout, bool distributed,
           const std::string& pp_schedule = "1f1b") {
    ModelConfig model =
        load_model_config(std::string(MOETRON_SOURCE_DIR) + "/configs/models/tiny.toml");
    // Every reduction dimension that tp2 splits is a multiple of 32 per rank: the shared expert
    // (64 / 2) and the query heads (4 x (24 + 8) / 2 = 64) besides tiny's own.
    model.moe_intermediate_size = 64;
    model.qk_nope_head_dim = 24;
    TrainConfig c;
    c.batch_size = 8;
    c.seq_len = 32;
    c.steps = kSteps;
    c.warmup_steps = 2;
    c.lr = 3e-3;
    c.min_lr = 3e-4;
    c.eval_batches = 2;
    c.seed = 1234;
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/40000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    RunSettings p;
    parallel::Communicator* job = nullptr;  // the world; null: one process
    if (distributed) {
        job = &mpi_world();
        p.layout = layout;
        p.pp_schedule = pp_schedule;
    }
    p.precision = precision;
    Trainer trainer(model, c, std::move(loader),
                    plan_run(model, c, p, job != nullptr ? job->size() : 1), job);
    Losses out;
    for (int s = 0; s < kSteps; ++s) out.train.push_back(trainer.step().loss);
    out.val = trainer.evaluate();
    return out;
}

void expect_layout_independent(const std::string& layout) {
    const Losses one = run(Precision::mxfp8, "", false);
    const Losses fp32 = run(Precision::fp32, "", false);
    const Losses got = run(Precision::mxfp8, layout, true);
    double largest_precision_effect = 0;
    for (int s = 0; s < kSteps; ++s) {
        EXPECT_NEAR(got.train[s], one.train[s], 2e-4 * one.train[s]) << layout << " step " << s + 1;
        largest_precision_effect =
            std::max(largest_precision_effect, std::fabs(one.train[s] - fp32.train[s]));
    }
    EXPECT_NEAR(got.val, one.val, 2e-4 * one.val) << layout;
    // The recipe is on: mxfp8 differs from float32 by more than the tolerance above.
    EXPECT_GT(largest_precision_effect, 1e-3) << "mxfp8 trained like fp32";
}

TEST(MpiLowPrecision, Mxfp8ExpertParallelMatchesOneProcess) {
    if (mpi_world().size() != 2) GTEST_SKIP() << "runs on 2 ranks";
    expect_layout_independent("ep2");
}

TEST(MpiLowPrecision, Mxfp8TensorTimesExpertParallelMatchesOneProcess) {
    if (mpi_world().size() != 4) GTEST_SKIP() << "runs on 4 ranks";
    expect_layout_independent("tp2.ep2");
}

// The zero-bubble schedule splits the GEMM backwards over a low-precision backend: the layers'
// weight gradients are quantized as in the whole backward, and the router and head GEMMs, which
// every recipe keeps in float32, stay so (high_precision sees through the split). The same ops
// on the same data as 1F1B: the same losses, bit for bit. bf16 runs the native AVX512_BF16 GEMM
// where the CPU has it, whose B must leave the weight gradient to W (a null dweight).
TEST(MpiLowPrecision, ZeroBubblePipelineMatchesOneFOneB) {
    if (mpi_world().size() != 2) GTEST_SKIP() << "runs on 2 ranks";
    for (const Precision precision : {Precision::mxfp8, Precision::bf16}) {
        SCOPED_TRACE(precision == Precision::bf16 ? "bf16" : "mxfp8");
        const Losses one_f_one_b = run(precision, "pp2", true, "1f1b");
        const Losses zero_bubble = run(precision, "pp2", true, "zb-h1");
        EXPECT_EQ(zero_bubble.train, one_f_one_b.train);
        EXPECT_EQ(zero_bubble.val, one_f_one_b.val);
    }
}

}  // namespace
}  // namespace moetron::testing
