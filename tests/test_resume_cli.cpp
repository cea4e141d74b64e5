// Doing what the user means, through the binary: `train --resume` continues the checkpoint's run
// as it was configured (steps, schedule, batch, data) unless a flag overrides a setting, and says
// which; resuming a finished run says so; `sample` and `export` take any checkpoint (a --save
// root, a step directory, a file in it, the --save-final root) and refuse the weights files of
// older versions with the commands that convert them; the Hugging Face export can leave MTP out
// and brings a byte-level tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.h"
#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/checkpoint_sharded.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::read_file;
using moetron::testing::run_cli;
using moetron::testing::TempDir;

namespace fs = std::filesystem;

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good()) << path;
}

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
    // The first run: 6 steps on the text file, checkpoints at 3 and 6, and its final state.
    void train_first_run() {
        const auto out = run_cli(kRun + " --text " + path("corpus.txt") + " --save " + path("a") +
                                 " --save-every 3 --save-final " + path("final"));
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

// Before --save-final wrote checkpoints, sample refused a checkpoint's safetensors ("not a moetron
// weights file"); every path to the trained state now samples the same greedy text.
TEST_F(ResumeCli, SampleTakesAnyCheckpoint) {
    train_first_run();
    const std::string args = " --prompt 'a line' --new-tokens 12 --temperature 0 --threads 1";
    const auto from_final = run_cli("sample --weights " + path("final") + args);
    ASSERT_EQ(from_final.exit_code, 0) << from_final.text;
    for (const std::string& weights :
         {path("a"), checkpoint("a", 6),
          checkpoint("a", 6) + "/" + checkpoint_shard_file_name(0, 1)}) {
        SCOPED_TRACE(weights);
        const auto out = run_cli("sample --weights " + weights + args);
        ASSERT_EQ(out.exit_code, 0) << out.text;
        EXPECT_EQ(out.text, from_final.text);  // the same weights: the same greedy text
    }
    const auto missing = run_cli("sample --weights " + path("none") + args);
    EXPECT_EQ(missing.exit_code, 1);
    EXPECT_CONTAINS(missing.text, "does not exist (expected a checkpoint directory");
    write_text(path("notes.txt"), "not a checkpoint");
    const auto stray = run_cli("sample --weights " + path("notes.txt") + args);
    EXPECT_EQ(stray.exit_code, 1);
    EXPECT_CONTAINS(stray.text, "is neither a checkpoint nor a file of one");
}

TEST_F(ResumeCli, ExportTakesTheFinalStateOrACheckpoint) {
    train_first_run();
    const auto from_final =
        run_cli("export --weights " + path("final") + " --out " + path("hf1") + " --dtype fp32");
    ASSERT_EQ(from_final.exit_code, 0) << from_final.text;
    const auto from_ckpt = run_cli("export --weights " + checkpoint("a", 6) + " --out " +
                                   path("hf2") + " --dtype fp32");
    ASSERT_EQ(from_ckpt.exit_code, 0) << from_ckpt.text;
    const std::string weights = read_file(path("hf1") + "/model.safetensors");
    ASSERT_FALSE(weights.empty());
    EXPECT_TRUE(weights == read_file(path("hf2") + "/model.safetensors"));
}

// The weights file --save-final wrote before it wrote checkpoints (magic "MTWEIGHT") is refused,
// by sample and export alike, with the two commands that convert it.
TEST_F(ResumeCli, AnOldWeightsFileIsRefusedWithHowToConvertIt) {
    write_text(path("w.bin"), std::string("MTWEIGHT\x01\0\0\0", 12) + "rest of an old file");
    for (const std::string& command :
         {"sample --weights " + path("w.bin") + " --prompt x",
          "export --weights " + path("w.bin") + " --out " + path("hf")}) {
        SCOPED_TRACE(command);
        const auto out = run_cli(command);
        EXPECT_EQ(out.exit_code, 1) << out.text;
        EXPECT_CONTAINS(out.text, "is a weights file of an older moetron");
        EXPECT_CONTAINS(out.text, "moetron export --weights " + path("w.bin"));
        EXPECT_CONTAINS(out.text, "moetron import --hf HF_DIR --out CHECKPOINT_ROOT");
        EXPECT_NOT_CONTAINS(out.text, ".cpp:");
    }
}

// --save-final into the --save root keeps the checkpoint the run saved there at its last step.
TEST_F(ResumeCli, SaveFinalIntoTheSaveRootKeepsTheLastCheckpoint) {
    const auto out = run_cli(kRun + " --text " + path("corpus.txt") + " --save " + path("a") +
                             " --save-final " + path("a"));
    ASSERT_EQ(out.exit_code, 0) << out.text;
    EXPECT_CONTAINS(out.text, "saved   weights to " + checkpoint("a", 6));
    EXPECT_EQ(read_latest_pointer(path("a")), checkpoint_dir_name(6));
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
