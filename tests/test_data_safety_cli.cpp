// Nothing a user has is lost (issue 16), through the moetron binary: a checkpoint root belongs
// to one run (newer checkpoints and other runs' checkpoints are never deleted or shadowed), names
// that only look like moetron's leftovers survive, an output never replaces an input, a failed
// export leaves the previous one whole, and a bad output path fails before any compute.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

// A tiny run: a few milliseconds per step.
const std::string kTiny = "--batch-size 2 --seq-len 16 --threads 1 --eval-every 0 ";

// What a run prints once it computes: a refusal must come before it.
constexpr const char* kComputed = "step 0 | val";

void write_text(const fs::path& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good()) << path;
}

// p quoted for the shell (appended piece by piece: GCC 12 warns wrongly on "'" + s + "'").
std::string q(const fs::path& p) {
    std::string quoted(1, '\'');
    quoted.append(p.string());
    quoted.push_back('\'');
    return quoted;
}

std::vector<std::string> checkpoints_in(const fs::path& root) {
    std::vector<std::string> names;
    for (const CheckpointDir& d : list_checkpoint_dirs(root)) names.push_back(d.name);
    return names;
}

// Saves steps 10 and 20 of one run into root.
void train_twenty_steps(const fs::path& root) {
    const auto r = run_cli("train --steps 20 " + kTiny + "--save " + q(root) + " --save-every 10");
    ASSERT_EQ(r.exit_code, 0) << r.text;
    ASSERT_EQ(checkpoints_in(root), (std::vector<std::string>{"step-00000010", "step-00000020"}));
}

// Resuming an older checkpoint into its own root once deleted the newer one with --keep 1 (and
// without --keep moved `latest` back, then failed at step 20 after all the compute).
TEST(DataSafetyCli, ResumingAnOlderCheckpointNeverDeletesNewerOnes) {
    TempDir dir;
    const fs::path ck = dir.path() / "ck";
    train_twenty_steps(ck);
    for (const std::string keep : {" --keep 1", ""}) {
        SCOPED_TRACE(keep);
        const auto r = run_cli("train --steps 20 " + kTiny + "--resume " + q(ck / "step-00000010") +
                               " --save " + q(ck) + " --save-every 5" + keep);
        EXPECT_EQ(r.exit_code, 1) << r.text;
        EXPECT_CONTAINS(r.text, "holds step-00000020, newer than step 10 where this run starts");
        EXPECT_NOT_CONTAINS(r.text, kComputed);
        EXPECT_EQ(checkpoints_in(ck), (std::vector<std::string>{"step-00000010", "step-00000020"}));
        EXPECT_EQ(read_latest_pointer(ck), "step-00000020");
    }
    // Into a new root it is a fork of the run, and fine.
    const auto r = run_cli("train --steps 20 " + kTiny + "--resume " + q(ck / "step-00000010") +
                           " --save " + q(dir.path() / "fork") + " --save-every 5 --keep 1");
    EXPECT_EQ(r.exit_code, 0) << r.text;
    EXPECT_EQ(checkpoints_in(dir.path() / "fork"), std::vector<std::string>{"step-00000020"});
    // Continuing from the newest, with --keep 1, deletes the run's own older checkpoints.
    const auto more = run_cli("train --steps 30 " + kTiny + "--resume " + q(ck) + " --save " +
                              q(ck) + " --keep 1");
    EXPECT_EQ(more.exit_code, 0) << more.text;
    EXPECT_EQ(checkpoints_in(ck), std::vector<std::string>{"step-00000030"});
}

// Resuming run B and saving into run A's root with --keep 1 once deleted A's checkpoints.
TEST(DataSafetyCli, AnotherRunsRootIsRefusedAndItsCheckpointsNeverDeleted) {
    TempDir dir;
    const fs::path a = dir.path() / "a", b = dir.path() / "b";
    ASSERT_EQ(run_cli("train --steps 5 " + kTiny + "--save " + q(a)).exit_code, 0);
    ASSERT_EQ(run_cli("train --steps 5 " + kTiny + "--save " + q(b)).exit_code, 0);
    const std::string resume_b =
        "train --steps 10 " + kTiny + "--resume " + q(b) + " --save " + q(a) + " --keep 1";
    const auto refused = run_cli(resume_b);
    EXPECT_EQ(refused.exit_code, 1) << refused.text;
    EXPECT_CONTAINS(refused.text, "belongs to another run");
    EXPECT_CONTAINS(refused.text, "--share-save-root");
    EXPECT_NOT_CONTAINS(refused.text, kComputed);
    EXPECT_NOT_CONTAINS(refused.text, ".cpp:");  // a user's mistake, not a bug report
    EXPECT_EQ(checkpoints_in(a), std::vector<std::string>{"step-00000005"});

    const auto shared = run_cli(resume_b + " --share-save-root");
    EXPECT_EQ(shared.exit_code, 0) << shared.text;
    EXPECT_EQ(checkpoints_in(a), (std::vector<std::string>{"step-00000005", "step-00000010"}));
    // A fresh run into a root with checkpoints is refused the same way.
    const auto fresh = run_cli("train --steps 5 " + kTiny + "--save " + q(a));
    EXPECT_EQ(fresh.exit_code, 1) << fresh.text;
    EXPECT_CONTAINS(fresh.text, "belongs to another run");
}

// `import --out` into a run's root once moved `latest` to step 0, and a later --keep deleted
// the run's real steps.
TEST(DataSafetyCli, ImportIntoAnExistingRootIsRefused) {
    TempDir dir;
    const fs::path ck = dir.path() / "ck", hf = dir.path() / "hf";
    train_twenty_steps(ck);
    const auto exported = run_cli("export --weights " + q(ck) + " --out " + q(hf));
    ASSERT_EQ(exported.exit_code, 0) << exported.text;
    const auto r = run_cli("import --hf " + q(hf) + " --out " + q(ck));
    EXPECT_EQ(r.exit_code, 1) << r.text;
    EXPECT_CONTAINS(r.text, "belongs to another run");
    EXPECT_EQ(read_latest_pointer(ck), "step-00000020");
    EXPECT_EQ(checkpoints_in(ck), (std::vector<std::string>{"step-00000010", "step-00000020"}));
    // Into a new root it works, and a run continues the import's identity there.
    const fs::path imported = dir.path() / "imported";
    ASSERT_EQ(run_cli("import --hf " + q(hf) + " --out " + q(imported)).exit_code, 0);
    const auto resumed = run_cli("train --steps 3 " + kTiny + "--resume " + q(imported) +
                                 " --save " + q(imported) + " --keep 1");
    EXPECT_EQ(resumed.exit_code, 0) << resumed.text;
    EXPECT_EQ(checkpoints_in(imported), std::vector<std::string>{"step-00000003"});
}

// Names that merely look like staging leftovers were deleted by the first save.
TEST(DataSafetyCli, FilesThatLookLikeLeftoversSurvive) {
    TempDir dir;
    const fs::path root = dir.path() / "run";
    fs::create_directories(root / "notes.deleting-1");
    write_text(root / "notes.deleting-1" / "notes.txt", "mine");
    write_text(root / "report.tmp-2024", "my report");
    const auto r = run_cli("train --steps 3 " + kTiny + "--save " + q(root));
    EXPECT_EQ(r.exit_code, 0) << r.text;
    EXPECT_EQ(read_file(root / "report.tmp-2024"), "my report");
    EXPECT_EQ(read_file(root / "notes.deleting-1" / "notes.txt"), "mine");
}

TEST(DataSafetyCli, PrepareRefusesToOverwriteItsInput) {
    TempDir dir;
    const fs::path text = dir.path() / "a.txt";
    write_text(text, "hello, shards");
    fs::create_symlink(text, dir.path() / "link.txt");
    for (const std::string out : {"./a.txt", "a.txt", "link.txt"}) {
        SCOPED_TRACE(out);
        const auto r = run_cli("prepare --text a.txt --out " + out, "cd " + q(dir.path()) + ";");
        EXPECT_EQ(r.exit_code, 1) << r.text;
        EXPECT_CONTAINS(r.text, "is the same file as --text");
        EXPECT_EQ(read_file(text), "hello, shards");
    }
    const auto ok = run_cli("prepare --text a.txt --out a.bin", "cd " + q(dir.path()) + ";");
    EXPECT_EQ(ok.exit_code, 0) << ok.text;
    EXPECT_TRUE(fs::exists(dir.path() / "a.bin"));
}

// An export into a checkpoint's own directory overwrote its model.safetensors.
TEST(DataSafetyCli, ExportRefusesACheckpointDirectory) {
    TempDir dir;
    const fs::path ck = dir.path() / "ck";
    train_twenty_steps(ck);
    const fs::path step = ck / "step-00000020";
    const std::string before = read_file(step / "model.safetensors");
    const auto r = run_cli("export --weights " + q(ck) + " --out " + q(step));
    EXPECT_EQ(r.exit_code, 1) << r.text;
    EXPECT_CONTAINS(r.text, "is a moetron checkpoint directory");
    EXPECT_TRUE(read_file(step / "model.safetensors") == before);
    const auto other = run_cli("export --weights " + q(ck) + " --out " + q(ck / "step-00000010"));
    EXPECT_EQ(other.exit_code, 1) << other.text;
}

// An export that fails half-way (the file size limit stands in for a full disk) leaves the
// previous export whole: exports are written to a temporary name and renamed into place.
TEST(DataSafetyCli, FailedExportLeavesThePreviousExportWhole) {
    TempDir dir;
    const fs::path ck = dir.path() / "ck", hf = dir.path() / "hf";
    train_twenty_steps(ck);
    ASSERT_EQ(run_cli("export --weights " + q(ck / "step-00000010") + " --out " + q(hf)).exit_code,
              0);
    const std::string before = read_file(hf / "model.safetensors");
    ASSERT_GT(before.size(), 200000u);
    // SIGXFSZ ignored: the write fails with EFBIG instead of killing the process.
    const auto r =
        run_cli("export --weights " + q(ck) + " --out " + q(hf), "trap '' XFSZ; ulimit -f 100;");
    EXPECT_EQ(r.exit_code, 1) << r.text;
    EXPECT_CONTAINS(r.text, "File too large");
    EXPECT_TRUE(read_file(hf / "model.safetensors") == before) << "the previous export was damaged";
    std::vector<std::string> names;
    for (const fs::directory_entry& e : fs::directory_iterator(hf))
        names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    // No staging file is left: only the previous export's files (with the byte-level tokenizer
    // that export writes for a 256-token vocabulary).
    EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model.safetensors",
                                               "model.safetensors.index.json", "tokenizer.json",
                                               "tokenizer_config.json"}));
}

// Every output path is checked before any compute: --save-final into a missing directory once
// failed after training and discarded the weights. --save and --save-final are checkpoint roots.
TEST(DataSafetyCli, OutputPathsAreCheckedBeforeTheFirstStep) {
    TempDir dir;
    write_text(dir.path() / "file", "x");
    const fs::path config = dir.path() / "tiny.toml";
    fs::copy_file(fs::path(MOETRON_SOURCE_DIR) / "configs/models/tiny.toml", config);
    const std::string train = "train --steps 3 " + kTiny;
    struct Case {
        std::string args, message;
    };
    const Case cases[] = {
        {"--save-final " + q(dir.path() / "file"), "is a file"},
        // /proc takes no new files, even for root: a read-only directory.
        {"--save-final /proc/moetron-final", "cannot create the directory"},
        {"--save /proc/moetron-ck", "cannot create the directory"},
        {"--save " + q(dir.path() / "file" / "ck"), "cannot create the directory"},
        {"--save " + q(dir.path() / "file"), "is a file"},
        {"--save /proc", "cannot create files in '/proc'"},  // an existing read-only directory
        {"--log-jsonl " + q(dir.path() / "missing" / "log.jsonl"), "does not exist"},
        {"--trace /proc/moetron-trace.json", "cannot create files in '/proc'"},
        {"--log-jsonl " + q(dir.path() / "x.json") + " --trace " + q(dir.path() / "x.json"),
         "is the same file as --trace"},
        // A copy of the preset: a binary with the bug would overwrite the file given.
        {"--config " + q(config) + " --log-jsonl " + q(config), "is the same file as --config"},
        {"--config " + q(config) + " --save-final " + q(config), "is a file"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.args);
        const auto r = run_cli(train + c.args);
        EXPECT_EQ(r.exit_code, 1) << r.text;
        EXPECT_CONTAINS(r.text, c.message);
        EXPECT_NOT_CONTAINS(r.text, kComputed);
        EXPECT_NOT_CONTAINS(r.text, ".cpp:");
    }
}

// A file written into a checkpoint directory breaks its index; one named like a root's `latest`
// breaks the root.
TEST(DataSafetyCli, OutputsNeverLandInACheckpoint) {
    TempDir dir;
    const fs::path ck = dir.path() / "ck";
    train_twenty_steps(ck);
    const fs::path step = ck / "step-00000020";
    const std::string shard = checkpoint_shard_file_name(0, 1);
    const std::string model = read_file(step / shard);
    const std::string train = "train --steps 3 " + kTiny;
    const auto weights = run_cli(train + "--log-jsonl " + q(step / shard));
    EXPECT_EQ(weights.exit_code, 1) << weights.text;
    EXPECT_CONTAINS(weights.text, "lies in the checkpoint directory");
    const auto log = run_cli(train + "--log-jsonl " + q(ck / "latest"));
    EXPECT_EQ(log.exit_code, 1) << log.text;
    EXPECT_CONTAINS(log.text, "would replace the `latest` file of the checkpoint root");
    write_text(dir.path() / "a.txt", "text");
    const auto prepared =
        run_cli("prepare --text " + q(dir.path() / "a.txt") + " --out " + q(step / "state.json"));
    EXPECT_EQ(prepared.exit_code, 1) << prepared.text;
    EXPECT_CONTAINS(prepared.text, "lies in the checkpoint directory");
    EXPECT_TRUE(read_file(step / shard) == model);
    EXPECT_EQ(read_latest_pointer(ck), "step-00000020");
    const auto resumed = run_cli("train --steps 21 " + kTiny + "--resume " + q(ck));
    EXPECT_EQ(resumed.exit_code, 0) << resumed.text;
}

// calibrate measures for minutes before it writes: a bad --out once cost the measurements.
TEST(DataSafetyCli, CalibrateChecksItsOutputBeforeMeasuring) {
    const auto r = run_cli("calibrate --quick --out /proc/moetron-cluster.toml");
    EXPECT_EQ(r.exit_code, 1) << r.text;
    EXPECT_CONTAINS(r.text, "cannot create files in '/proc'");
    EXPECT_NOT_CONTAINS(r.text, "measuring");
}

TEST(DataSafetyCli, CheckpointOptionsWithoutSaveAreAnError) {
    for (const std::string option : {"--save-every 5", "--keep 2", "--share-save-root"}) {
        SCOPED_TRACE(option);
        const auto r = run_cli("train --steps 3 " + kTiny + option);
        EXPECT_NE(r.exit_code, 0) << r.text;
        EXPECT_CONTAINS(r.text, "requires --save");
        EXPECT_NOT_CONTAINS(r.text, kComputed);
    }
}

}  // namespace
}  // namespace moetron
