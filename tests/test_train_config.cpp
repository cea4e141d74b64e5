// train/: the [train] table (keys, defaults, errors) and the learning-rate schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "moetron/checkpoint/train_config.h"
#include "moetron/core/error.h"
#include "moetron/core/strings.h"
#include "moetron/train/lr_schedule.h"

namespace moetron {
namespace {

std::string error_of(const auto& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

TEST(TrainConfig, ReadsTheTrainTableAndKeepsDefaultsForTheRest) {
    const TrainConfig c = parse_train_config_toml(R"(
vocab_size = 256
[train]
batch_size = 4
lr = 1          # an integer is a number too
min_lr = 0.5
seed = 7
mtp_lambda = 0.1
)",
                                                  "preset.toml");
    EXPECT_EQ(c.batch_size, 4);
    EXPECT_DOUBLE_EQ(c.lr, 1.0);
    EXPECT_DOUBLE_EQ(c.min_lr, 0.5);
    EXPECT_EQ(c.seed, 7u);
    EXPECT_DOUBLE_EQ(c.mtp_lambda, 0.1);
    EXPECT_EQ(c.seq_len, TrainConfig{}.seq_len);
    EXPECT_EQ(c.tokens_per_step(), 4 * c.seq_len * c.grad_accum);
}

TEST(TrainConfig, NoTrainTableGivesDefaults) {
    const TrainConfig c = parse_train_config_toml("vocab_size = 256\n", "m.toml");
    EXPECT_EQ(c.steps, TrainConfig{}.steps);
}

TEST(TrainConfig, UnknownKeyNamesTheClosestKnownKey) {
    const std::string e =
        error_of([] { parse_train_config_toml("[train]\nwarmup_step = 10\n", "preset.toml"); });
    EXPECT_NE(e.find("preset.toml:2"), std::string::npos) << e;
    EXPECT_NE(e.find("unknown key 'warmup_step'"), std::string::npos) << e;
    EXPECT_NE(e.find("did you mean 'warmup_steps'"), std::string::npos) << e;
}

TEST(TrainConfig, WrongTypesAndImpossibleValuesAreErrors) {
    std::string e = error_of([] { parse_train_config_toml("[train]\nsteps = 1.5\n", "p.toml"); });
    EXPECT_NE(e.find("'steps' must be an integer"), std::string::npos) << e;
    e = error_of([] { parse_train_config_toml("[train]\nlr = \"fast\"\n", "p.toml"); });
    EXPECT_NE(e.find("'lr' must be a number"), std::string::npos) << e;
    e = error_of([] { parse_train_config_toml("[train]\nseed = -1\n", "p.toml"); });
    EXPECT_NE(e.find("'seed' must not be negative"), std::string::npos) << e;
    e = error_of([] { parse_train_config_toml("[train]\nbatch_size = 0\n", "p.toml"); });
    EXPECT_NE(e.find("batch_size must lie in [1, "), std::string::npos) << e;
    EXPECT_NE(e.find("p.toml"), std::string::npos) << e;
    e = error_of([] { parse_train_config_toml("[train]\nlr = 1e-3\nmin_lr = 1e-2\n", "p.toml"); });
    EXPECT_NE(e.find("min_lr must lie in"), std::string::npos) << e;
    e = error_of([] { parse_train_config_toml("train = 3\n", "p.toml"); });
    EXPECT_NE(e.find("'train' must be a table"), std::string::npos) << e;
    e = error_of([] { parse_train_config_toml("[train\n", "p.toml"); });
    EXPECT_NE(e.find("TOML syntax error"), std::string::npos) << e;
}

TEST(TrainConfig, MissingFileIsAnErrorNamingIt) {
    const std::string e = error_of([] { load_train_config("/nonexistent/preset.toml"); });
    EXPECT_NE(e.find("/nonexistent/preset.toml"), std::string::npos) << e;
    EXPECT_NE(e.find("no such file"), std::string::npos) << e;
}

TEST(TrainConfig, ClosestKnownKey) {
    EXPECT_EQ(closest_match("batchsize", train_config_keys()), "batch_size");
    EXPECT_EQ(closest_match("grad_clipping", train_config_keys()), "grad_clip");
}

TEST(LrSchedule, WarmsUpLinearlyThenDecaysByCosineToTheFloor) {
    const LrSchedule s(1e-3, 1e-4, /*warmup_steps=*/10, /*total_steps=*/110);
    EXPECT_DOUBLE_EQ(s.lr_at(0), 1e-4);  // (0 + 1) / 10 of the peak: step 0 already learns
    EXPECT_DOUBLE_EQ(s.lr_at(4), 5e-4);
    EXPECT_DOUBLE_EQ(s.lr_at(9), 1e-3);
    EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3);  // decay starts at the peak
    // Halfway through the decay (step 10 + 99/2) the cosine is at its midpoint.
    const double mid = 1e-4 + 0.9e-3 * 0.5 * (1 + std::cos(std::numbers::pi * 49.0 / 99.0));
    EXPECT_NEAR(s.lr_at(59), mid, 1e-15);
    EXPECT_NEAR(s.lr_at(109), 1e-4, 1e-15);  // the last step sits on the floor
    EXPECT_DOUBLE_EQ(s.lr_at(500), 1e-4);
    for (int64_t t = 10; t < 109; ++t) EXPECT_GE(s.lr_at(t), s.lr_at(t + 1)) << t;
}

TEST(LrSchedule, EdgeCases) {
    const LrSchedule no_warmup(2e-3, 0, 0, 3);
    EXPECT_DOUBLE_EQ(no_warmup.lr_at(0), 2e-3);
    EXPECT_NEAR(no_warmup.lr_at(1), 1e-3, 1e-15);
    EXPECT_DOUBLE_EQ(no_warmup.lr_at(2), 0);
    const LrSchedule one_step(2e-3, 0, 0, 1);
    EXPECT_DOUBLE_EQ(one_step.lr_at(0), 2e-3);
    EXPECT_THROW(LrSchedule(1e-3, 1e-2, 0, 10), Error);
}

}  // namespace
}  // namespace moetron
