// Convergence: the tiny preset trained byte-level on Tiny Shakespeare for a CI-sized run (300
// steps of 16 x 128 bytes, under a minute on one thread) must reach a held-out loss below 2.5
// nats/byte (a uniform guess is ln 256 = 5.55; a unigram model about 3.3).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "moetron/model/config.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/data_source.h"
#include "moetron/train/metrics.h"
#include "moetron/train/trainer.h"

namespace moetron {
namespace {

// The corpus: the file MOETRON_SHAKESPEARE names, else the shared data folder beside the
// repository (tools/low_precision_convergence.py looks in the same two places).
constexpr const char* kShakespeareVariable = "MOETRON_SHAKESPEARE";
constexpr const char* kShakespeareDefault =
    MOETRON_SOURCE_DIR "/../shared/data/tinyshakespeare.txt";
constexpr const char* kShakespeareUrl =
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt";

TEST(TrainConvergence, TinyLearnsShakespeareBelow2p5NatsPerByte) {
    const char* named = std::getenv(kShakespeareVariable);
    if (named != nullptr && *named != '\0') {
        // A file named on purpose that is not there is a mistake to report, not a skip.
        ASSERT_TRUE(std::filesystem::is_regular_file(named))
            << kShakespeareVariable << "=" << named << " names no file";
    } else if (!std::filesystem::exists(kShakespeareDefault)) {
        GTEST_SKIP() << "convergence not run: no Tiny Shakespeare (char-rnn's 1.1 MB text, "
                     << "the corpus this test trains on) at "
                     << std::filesystem::weakly_canonical(kShakespeareDefault).string()
                     << "; download " << kShakespeareUrl << " there, or set "
                     << kShakespeareVariable << " to the file";
    }
    const std::string shakespeare =
        named != nullptr && *named != '\0' ? named : kShakespeareDefault;
    const ModelConfig model = load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
    TrainConfig c = load_train_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
    // The run's own settings, independent of the preset's defaults for the synthetic data.
    c.batch_size = 16;
    c.seq_len = 128;
    c.grad_accum = 1;
    c.steps = 300;
    c.warmup_steps = 30;
    c.lr = 3e-3;
    c.min_lr = 3e-4;
    c.seed = 1234;
    c.eval_every = 100;
    c.eval_batches = 16;  // 32k held-out bytes for the final figure
    c.val_fraction = 0.1;

    TokenData data = load_text_file_data(shakespeare, model.vocab_size);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    Trainer trainer(model, c, std::move(loader));
    const double before = trainer.evaluate();
    MetricsLog log(c.steps, /*print_every=*/50, /*jsonl_path=*/"", /*terminal=*/false);
    const TrainSummary s = trainer.run(log);
    std::printf(
        "[convergence] tiny on tinyshakespeare, %lld steps x %lld tokens: held-out loss "
        "%.4f -> %.4f nats/byte (train %.4f -> %.4f), %.0f tokens/s\n",
        static_cast<long long>(s.steps), static_cast<long long>(c.tokens_per_step()), before,
        s.last_val_loss, s.first_loss, s.last_loss, s.tokens_per_s);
    EXPECT_GT(before, 5.0) << "an untrained model should be near ln 256";
    EXPECT_LT(s.last_val_loss, 2.5);
}

}  // namespace
}  // namespace moetron
