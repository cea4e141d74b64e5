// Doing what the user means, through the binary: `train --resume` continues the checkpoint's run
// as it was configured (steps, schedule, batch, data) unless a flag overrides a setting, and says
// which; resuming a finished run says so; `sample` and `export` take a checkpoint or a weights
// file alike; the Hugging Face export can leave MTP out and brings a byte-level tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.h"
#include "moetron/train/atomic_dir.h"
#include "moetron/train/checkpoint.h"
#include "moetron/train/checkpoint_sharded.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::read_file;
using moetron::testing::run_cli;
using moetron::testing::TempDir;

namespace fs = std::filesystem;

// A run unlike the tiny preset's [train] table in every setting a resume must keep.
const std::string kRun =
    "train --config " MOETRON_SOURCE_DIR
    "/configs/models/tiny.toml --steps 6 --batch-size 2 --seq-len 16 --eval-every 3 --lr 0.002 "
    "--seed 7 --threads 1";

class ResumeCli : public ::testing::Test {
  protected:
    void SetUp() override {
        std::ofstream text(path("corpus.txt"));
        for (int i = 0; i < 300; ++i) text << "a line of text number " << i << " to learn\n";
    }
    std::string path(const std::string& name) const { return (dir_.path() / name).string(); }
    // The first run: 6 steps on the text file, checkpoints at 3 and 6, and a weights file.
    void train_first_run() {
        const auto out = run_cli(kRun + " --text " + path("corpus.txt") + " --save " + path("a") +
                                 " --save-every 3 --save-final " + path("w.bin"));
        ASSERT_EQ(out.exit_code, 0) << out.text;
    }
    std::string checkpoint(const std::string& root, int step) const {
        return path(root) + "/" + checkpoint_dir_name(step);
    }

    TempDir dir_;
};

TEST_F(ResumeCli, ContinuesTheCheckpointsRunAsConfigured) {
    train_first_run();
    // No --config, --steps, --text, ...: everything comes from the checkpoint.
    const auto out =
        run_cli("train --threads 1 --resume " + checkpoint("a", 3) + " --save " + path("b"));
    ASSERT_EQ(out.exit_code, 0) << out.text;
    EXPECT_CONTAINS(out.text, "resumed from");
    EXPECT_CONTAINS(out.text, "step 6/6");
    EXPECT_CONTAINS(out.text, "corpus.txt (text, byte-level");
    EXPECT_NOT_CONTAINS(out.text, "overridden");
    // The same run: the final checkpoints are byte for byte the same.
    const std::string straight =
        read_file(fs::path(checkpoint("a", 6)) / checkpoint_shard_file_name(0, 1));
    ASSERT_FALSE(straight.empty());
    EXPECT_TRUE(straight ==
                read_file(fs::path(checkpoint("b", 6)) / checkpoint_shard_file_name(0, 1)))
        << "the resumed run ended with other parameters than the straight one";
}

TEST_F(ResumeCli, SaysWhichSettingsTheCommandLineOverrides) {
    train_first_run();
    const auto out = run_cli("train --threads 1 --resume " + checkpoint("a", 3) + " --steps 7");
    ASSERT_EQ(out.exit_code, 0) << out.text;
    EXPECT_CONTAINS(out.text, "note    overridden on the command line: steps: 6 -> 7");
    EXPECT_CONTAINS(out.text, "step 7/7");
    EXPECT_NOT_CONTAINS(out.text, "overridden on the command line: lr");
}

TEST_F(ResumeCli, AnotherDataFileIsNamedWithTheCheckpoints) {
    train_first_run();
    {
        std::ofstream other(path("other.txt"));
        for (int i = 0; i < 300; ++i) other << "other words, line " << i << "\n";
    }
    const auto out = run_cli("train --threads 1 --resume " + path("a") + " --steps 8 --text " +
                             path("other.txt"));
    ASSERT_EQ(out.exit_code, 0) << out.text;
    EXPECT_CONTAINS(out.text, "the checkpoint's run trained on '" + path("corpus.txt") +
                                  "'; this run continues on '" + path("other.txt") + "'");
}

TEST_F(ResumeCli, AFinishedRunSaysSo) {
    train_first_run();
    const auto out = run_cli("train --threads 1 --resume " + path("a"));
    ASSERT_EQ(out.exit_code, 0) << out.text;
    EXPECT_CONTAINS(out.text, "nothing to train: the checkpoint's run is finished (step 6 of 6)");
    EXPECT_NOT_CONTAINS(out.text, "0.0000 -> 0.0000");
    EXPECT_NOT_CONTAINS(out.text, "done    0 steps");
}

// An imported checkpoint has weights but no run of its own: --config's [train] table applies.
TEST_F(ResumeCli, AnImportTakesItsSettingsFromConfig) {
    train_first_run();
    ASSERT_EQ(run_cli("export --weights " + path("a") + " --out " + path("hf")).exit_code, 0);
    const auto imported = run_cli("import --hf " + path("hf") + " --out " + path("imported"));
    ASSERT_EQ(imported.exit_code, 0) << imported.text;
    const auto out = run_cli("train --threads 1 --resume " + path("imported") +
                             " --config tiny --steps 2 --eval-every 0");
    ASSERT_EQ(out.exit_code, 0) << out.text;
    EXPECT_CONTAINS(out.text, "(warmup 20)");  // tiny.toml's, not the struct's default 30
    EXPECT_NOT_CONTAINS(out.text, "overridden on the command line");
}

TEST_F(ResumeCli, SampleTakesACheckpointOrAWeightsFile) {
    train_first_run();
    const std::string args = " --prompt 'a line' --new-tokens 12 --temperature 0 --threads 1";
    const auto from_file = run_cli("sample --weights " + path("w.bin") + args);
    ASSERT_EQ(from_file.exit_code, 0) << from_file.text;
    const auto from_root = run_cli("sample --weights " + path("a") + args);
    ASSERT_EQ(from_root.exit_code, 0) << from_root.text;
    EXPECT_EQ(from_file.text, from_root.text);  // the same weights: the same greedy text
    const auto missing = run_cli("sample --weights " + path("none") + args);
    EXPECT_EQ(missing.exit_code, 1);
    EXPECT_CONTAINS(missing.text, "does not exist (expected a checkpoint directory");
}

TEST_F(ResumeCli, ExportTakesACheckpointOrAWeightsFile) {
    train_first_run();
    const auto from_file =
        run_cli("export --weights " + path("w.bin") + " --out " + path("hf1") + " --dtype fp32");
    ASSERT_EQ(from_file.exit_code, 0) << from_file.text;
    const auto from_ckpt = run_cli("export --weights " + checkpoint("a", 6) + " --out " +
                                   path("hf2") + " --dtype fp32");
    ASSERT_EQ(from_ckpt.exit_code, 0) << from_ckpt.text;
    const std::string weights = read_file(path("hf1") + "/model.safetensors");
    ASSERT_FALSE(weights.empty());
    EXPECT_TRUE(weights == read_file(path("hf2") + "/model.safetensors"));
}

TEST_F(ResumeCli, ExportWithoutMtpAndWithAByteTokenizer) {
    train_first_run();
    const auto out =
        run_cli("export --weights " + path("a") + " --out " + path("hf") + " --no-mtp");
    ASSERT_EQ(out.exit_code, 0) << out.text;
    const auto config = nlohmann::json::parse(read_file(path("hf") + "/config.json"));
    EXPECT_EQ(config.at("num_nextn_predict_layers"), 0);
    const int layers = config.at("num_hidden_layers").get<int>();
    const auto index =
        nlohmann::json::parse(read_file(path("hf") + "/model.safetensors.index.json"));
    for (const auto& [name, file] : index.at("weight_map").items())
        EXPECT_EQ(name.find("model.layers." + std::to_string(layers) + "."), std::string::npos)
            << name << " is an MTP tensor";
    // Token id = byte: 256 tokens, GPT-2's byte-to-character table ('A' is itself, ' ' is 'Ġ').
    const auto tokenizer = nlohmann::json::parse(read_file(path("hf") + "/tokenizer.json"));
    const auto& vocab = tokenizer.at("model").at("vocab");
    EXPECT_EQ(vocab.size(), 256u);
    EXPECT_EQ(vocab.at("A"), 65);
    EXPECT_EQ(vocab.at("\xC4\xA0"), 32);  // U+0120
    EXPECT_EQ(vocab.at("\xC4\x80"), 0);   // U+0100
    EXPECT_TRUE(fs::exists(path("hf") + "/tokenizer_config.json"));
}

}  // namespace
}  // namespace moetron
