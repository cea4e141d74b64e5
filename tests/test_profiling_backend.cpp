// ProfilingBackend (kernels/profiling_backend.h): its table is the op list, each op once with a
// category; it counts and times what it forwards, GEMMs by the format of the call; and a
// training step through it computes exactly what one without it does, the optimizer's ops and
// every recipe's GEMMs included.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "moetron/kernels/profiling_backend.h"
#include "moetron/model/config.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/metrics.h"
#include "moetron/train/trainer.h"

namespace moetron {
namespace {

// The op list (kernels/backend_ops.inc) names each op once; the profiler's table is that list.
TEST(ProfilingBackend, EveryOpOfTheListIsProfiledOnceByName) {
    std::set<std::string_view> names;
    for (size_t i = 0; i < backend_op_list().size(); ++i) {
        const BackendOpInfo& op = backend_op_list()[i];
        EXPECT_TRUE(names.insert(op.name).second) << op.name << " is listed twice";
        EXPECT_EQ(static_cast<size_t>(backend_op_named(op.name)), i) << op.name;
    }
    EXPECT_EQ(names.size(), kNumBackendOps);
    EXPECT_GE(names.size(), 70u) << "the op list lost ops";
    for (const char* gemm : {"matmul", "linear_forward", "linear_backward",
                             "grouped_linear_forward", "grouped_linear_backward"})
        EXPECT_TRUE(backend_op(backend_op_named(gemm)).gemm) << gemm;
    EXPECT_FALSE(backend_op(backend_op_named("add")).gemm);
}

// A GEMM's calls are kept apart by the format of the call, and each format gets its own row.
TEST(ProfilingBackend, GemmsAreCountedByTheirFormat) {
    ProfilingBackend profiling;
    std::vector<float> a(64, 1.0f), b(64, 2.0f), c(64, 0.0f);
    profiling.matmul(c.data(), a.data(), b.data(), 8, 8, 8, false, false, 0.0f, kFp32Gemm);
    for (int i = 0; i < 2; ++i)
        profiling.matmul(c.data(), a.data(), b.data(), 8, 8, 8, false, false, 0.0f,
                         {Precision::mxfp8});
    EXPECT_EQ(profiling.calls("matmul"), 3);
    EXPECT_EQ(profiling.totals(BackendOp::matmul, Precision::fp32).calls, 1);
    EXPECT_EQ(profiling.totals(BackendOp::matmul, Precision::mxfp8).calls, 2);
    const std::string table = format_op_profile(profiling, /*steps=*/1, /*step_seconds=*/1.0);
    EXPECT_NE(table.find("  matmul [mxfp8]"), std::string::npos) << table;
    EXPECT_NE(table.find("  matmul "), std::string::npos) << table;
}

TEST(ProfilingBackend, CountsAndTimesEachOpUnderItsCategory) {
    ProfilingBackend profiling;
    std::vector<float> a(64, 1.0f), b(64, 2.0f), c(64, 0.0f);
    for (int i = 0; i < 3; ++i)
        profiling.matmul(c.data(), a.data(), b.data(), 8, 8, 8, false, false, 0.0f, kFp32Gemm);
    profiling.add(c.data(), a.data(), b.data(), 64);
    EXPECT_EQ(profiling.calls("matmul"), 3);
    EXPECT_EQ(profiling.calls("add"), 1);
    EXPECT_EQ(profiling.calls("attention_forward"), 0);
    EXPECT_FLOAT_EQ(c[5], 3.0f);  // forwarded: 1 + 2
    EXPECT_THROW((void)profiling.calls("no_such_op"), std::invalid_argument);

    const std::string table = format_op_profile(profiling, /*steps=*/1, /*step_seconds=*/1.0);
    const size_t gemms = table.find("GEMMs");
    const size_t matmul = table.find("  matmul");
    const size_t other = table.find("other");
    const size_t add = table.find("  add");
    ASSERT_NE(gemms, std::string::npos) << table;
    ASSERT_NE(other, std::string::npos) << table;
    EXPECT_GT(matmul, gemms) << table;  // listed under its category
    EXPECT_GT(add, other) << table;
    EXPECT_EQ(table.find("attention"), std::string::npos) << "a category never called is left out";

    profiling.reset();
    EXPECT_EQ(profiling.calls("matmul"), 0);
}

// The trainer routes its model and its optimizer through the backend it is given, and the
// decorator changes no number, under every recipe; it sees each GEMM in its role's format.
class ProfilingARecipe : public ::testing::TestWithParam<Precision> {};

TEST_P(ProfilingARecipe, ATrainingStepThroughItIsBitIdentical) {
    const Precision precision = GetParam();
    const ModelConfig model = load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
    TrainConfig config;
    config.batch_size = 2;
    config.seq_len = 16;
    config.steps = 4;
    config.warmup_steps = 0;
    config.seed = 3;
    config.eval_batches = 1;
    const auto make_loader = [&] {
        TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/20000);
        return DataLoader(std::move(data.tokens), data.source, model.vocab_size, config.seq_len,
                          config.val_fraction, config.seed);
    };
    RunSettings recipe;
    recipe.precision = precision;
    ProfilingBackend profiling;
    const RunPlan plan = plan_run(model, config, recipe, 1);
    Trainer profiled(model, config, make_loader(), plan, nullptr, profiling);
    Trainer plain(model, config, make_loader(), plan);
    for (int step = 0; step < 2; ++step) {
        const StepRecord got = profiled.step();
        const StepRecord want = plain.step();
        EXPECT_EQ(got.loss, want.loss) << "step " << step;
        EXPECT_EQ(got.mtp_loss, want.mtp_loss) << "step " << step;
        EXPECT_EQ(got.balance_loss, want.balance_loss) << "step " << step;
        EXPECT_EQ(got.grad_norm, want.grad_norm) << "step " << step;
    }
    EXPECT_GT(profiling.calls("attention_forward"), 0);
    EXPECT_GT(profiling.calls("grouped_linear_backward"), 0);
    EXPECT_GT(profiling.calls("adamw_update"), 0);  // the optimizer's math, too
    EXPECT_GT(profiling.calls("sum_squares"), 0);
    // The layers' and experts' GEMMs in the recipe's format; the router's in float32 always.
    const BackendOp linear = BackendOp::linear_forward;
    EXPECT_GT(profiling.totals(linear, precision).calls, 0);
    EXPECT_GT(profiling.totals(BackendOp::grouped_linear_forward, precision).calls, 0);
    EXPECT_GT(profiling.totals(linear, Precision::fp32).calls, 0);
}

INSTANTIATE_TEST_SUITE_P(EveryRecipe, ProfilingARecipe,
                         ::testing::Values(Precision::fp32, Precision::bf16, Precision::mxfp8,
                                           Precision::fp8_blockwise),
                         [](const ::testing::TestParamInfo<Precision>& info) {
                             return std::string(info.param == Precision::fp8_blockwise
                                                    ? "fp8_blockwise"
                                                    : precision_name(info.param));
                         });

// `moetron train --profile-ops` runs its steps with validations between them; bench_train_step
// runs steps only. The trainer pauses its profiler during validations, so both count the same ops
// per step.
TEST(ProfilingBackend, ARunsProfileCountsItsStepsNotItsValidations) {
    const ModelConfig model = load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
    TrainConfig config;
    config.batch_size = 2;
    config.seq_len = 16;
    config.steps = 3;
    config.warmup_steps = 0;
    config.eval_every = 1;  // a validation after every step
    config.eval_batches = 2;
    const auto make_loader = [&] {
        TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/20000);
        return DataLoader(std::move(data.tokens), data.source, model.vocab_size, config.seq_len,
                          config.val_fraction, config.seed);
    };
    const RunPlan plan = plan_run(model, config, {}, 1);
    ProfilingBackend run_profile, step_profile;
    Trainer with_validations(model, config, make_loader(), plan, nullptr, run_profile);
    Trainer steps_only(model, config, make_loader(), plan, nullptr, step_profile);
    with_validations.set_profiler(&run_profile);
    run_profile.reset();
    step_profile.reset();
    std::FILE* sink = std::fopen("/dev/null", "w");
    ASSERT_NE(sink, nullptr);
    {
        MetricsLog log(config.steps, /*print_every=*/1, "", /*terminal=*/false, sink);
        with_validations.run(log);
    }
    std::fclose(sink);
    for (int64_t i = 0; i < config.steps; ++i) steps_only.step();
    for (const BackendOpInfo& op : backend_op_list()) {
        if (op.name == "copy_to_host" || op.name == "copy_from_host") continue;  // the log's
        EXPECT_EQ(run_profile.calls(op.name), step_profile.calls(op.name)) << op.name;
    }
    EXPECT_GT(run_profile.calls("attention_forward"), 0);
}

}  // namespace
}  // namespace moetron
