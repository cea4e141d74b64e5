// train/trainer: gradient accumulation (a step of 2 micro-batches equals a step of 1 micro-batch
// on the concatenated batch), determinism, and a short run that learns.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "moetron/core/user_error.h"
#include "moetron/model/config.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/trainer.h"

namespace moetron {
namespace {

ModelConfig tiny_config() {
    return load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
}

TrainConfig base_config() {
    TrainConfig c;
    c.batch_size = 4;
    c.seq_len = 32;
    c.grad_accum = 1;
    c.steps = 10;
    c.warmup_steps = 0;
    c.lr = 1e-3;
    c.min_lr = 1e-4;
    c.seed = 11;
    c.eval_batches = 2;
    return c;
}

Trainer make_trainer(const ModelConfig& model, const TrainConfig& c) {
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/5, /*num_bytes=*/20000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    return Trainer(model, c, std::move(loader));
}

TEST(TrainStep, TwoMicroBatchesEqualOneConcatenatedBatch) {
    const ModelConfig model = tiny_config();
    TrainConfig one = base_config();
    // A larger eps keeps Adam's first step (g / (|g| + eps)) from amplifying float rounding in
    // gradients that are nearly zero; the comparison is of the gradients' sum, not of Adam.
    one.eps = 1e-6;
    TrainConfig two = one;
    two.batch_size = one.batch_size / 2;
    two.grad_accum = 2;
    Trainer a = make_trainer(model, one);
    Trainer b = make_trainer(model, two);
    for (int s = 0; s < 2; ++s) {
        // The loader draws windows in order, so b's two micro-batches are a's one batch split.
        const StepRecord ra = a.step();
        const StepRecord rb = b.step();
        std::printf("[maxerr] train_step micro-batches loss a=%.7f b=%.7f | gnorm a=%.7f b=%.7f\n",
                    ra.loss, rb.loss, ra.grad_norm, rb.grad_norm);
        EXPECT_NEAR(ra.loss, rb.loss, 1e-5 * ra.loss) << "step " << s;
        EXPECT_NEAR(ra.mtp_loss, rb.mtp_loss, 1e-5 * ra.mtp_loss) << "step " << s;
        EXPECT_NEAR(ra.balance_loss, rb.balance_loss, 1e-5 * ra.balance_loss + 1e-12);
        EXPECT_NEAR(ra.grad_norm, rb.grad_norm, 1e-4 * ra.grad_norm) << "step " << s;
    }
    const int64_t n = a.model().num_params();
    ASSERT_EQ(n, b.model().num_params());
    double max_diff = 0;
    for (int64_t i = 0; i < n; ++i)
        max_diff =
            std::max(max_diff,
                     static_cast<double>(std::fabs(a.model().params()[i] - b.model().params()[i])));
    std::printf("[maxerr] train_step micro-batches params abs=%.3e (lr %.1e)\n", max_diff, one.lr);
    EXPECT_LT(max_diff, 1e-2 * one.lr) << "updated parameters differ by more than 1% of one step";
    // The step did move the parameters (a test of equality must be able to fail).
    Trainer fresh = make_trainer(model, one);
    double moved = 0;
    for (int64_t i = 0; i < n; ++i)
        moved = std::max(moved, static_cast<double>(
                                    std::fabs(a.model().params()[i] - fresh.model().params()[i])));
    EXPECT_GT(moved, 0.5 * one.lr);
}

TEST(TrainStep, SameSeedSameRunDifferentSeedDifferentRun) {
    const ModelConfig model = tiny_config();
    TrainConfig c = base_config();
    Trainer a = make_trainer(model, c);
    Trainer b = make_trainer(model, c);
    c.seed = 12;
    Trainer d = make_trainer(model, c);
    for (int s = 0; s < 3; ++s) {
        const double la = a.step().loss, lb = b.step().loss, ld = d.step().loss;
        EXPECT_EQ(la, lb) << "step " << s;
        EXPECT_NE(la, ld) << "step " << s;
    }
    EXPECT_EQ(a.steps_done(), 3);
}

TEST(TrainStep, ShortRunLowersTheValidationLossAndLogsJsonl) {
    const ModelConfig model = tiny_config();
    TrainConfig c = base_config();
    c.steps = 40;
    c.lr = 3e-3;
    c.min_lr = 3e-4;
    c.warmup_steps = 4;
    c.eval_every = 20;
    Trainer t = make_trainer(model, c);
    const double before = t.evaluate();
    const std::string jsonl = ::testing::TempDir() + "moetron_train_step.jsonl";
    std::FILE* sink = std::tmpfile();
    ASSERT_NE(sink, nullptr);
    MetricsLog log(c.steps, 10, jsonl, /*terminal=*/false, sink);
    const TrainSummary s = t.run(log);
    std::fclose(sink);
    std::printf("[train] 40 steps: val %.4f -> %.4f, train %.4f -> %.4f\n", before, s.last_val_loss,
                s.first_loss, s.last_loss);
    EXPECT_EQ(s.steps, 40);
    EXPECT_LT(s.last_val_loss, before - 1.0) << "40 steps on the synthetic grammar must learn";
    // One JSON object per step with the promised keys; validation on steps 20 and 40.
    std::FILE* f = std::fopen(jsonl.c_str(), "r");
    ASSERT_NE(f, nullptr);
    char line[2048];
    int lines = 0, with_val = 0;
    while (std::fgets(line, sizeof line, f)) {
        ++lines;
        const std::string l = line;
        for (const char* key : {"\"step\":", "\"loss\":", "\"lr\":", "\"grad_norm\":",
                                "\"tokens_per_s\":", "\"tflops\":"})
            EXPECT_NE(l.find(key), std::string::npos) << key << " missing in " << l;
        with_val += l.find("\"val_loss\":") != std::string::npos;
    }
    std::fclose(f);
    std::remove(jsonl.c_str());
    EXPECT_EQ(lines, 40);
    EXPECT_EQ(with_val, 2);
}

TEST(TrainStep, RejectsASequenceLongerThanTheModelAllows) {
    const ModelConfig model = tiny_config();
    TrainConfig c = base_config();
    c.seq_len = model.max_position_embeddings + 1;
    TokenData data = make_synthetic_data(model.vocab_size, 5, 20000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    EXPECT_THROW(Trainer(model, c, std::move(loader)), Error);
}

// A mistaken pipeline schedule or layout is the user's error before any work, also on a layout
// without pipeline parallelism (where neither would otherwise be read).
TEST(TrainStep, RejectsABadPipelineScheduleOrLayoutOnAnyLayout) {
    const ModelConfig model = tiny_config();
    const TrainConfig c = base_config();
    auto build = [&](const std::string& schedule, const std::string& layout) {
        TokenData data = make_synthetic_data(model.vocab_size, 5, 20000);
        DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                          c.val_fraction, c.seed);
        RunSettings p;
        p.pp_schedule = schedule;
        p.pp_layout = layout;
        Trainer t(model, c, std::move(loader), plan_run(model, c, p, 1));
    };
    EXPECT_THROW(build("gpipe", ""), UserError);
    EXPECT_THROW(build("interleaved", ""), UserError);  // needs vpp > 1
    EXPECT_THROW(build("1f1b", "Et|ttmL"), UserError);  // two chunks for one stage
    EXPECT_NO_THROW(build("1f1b", "EtttmL"));
}

}  // namespace
}  // namespace moetron
