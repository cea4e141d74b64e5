// checkpoint/checkpoint_root: which run may save into a checkpoint root, and what retention may
// delete there. Checkpoints here are directories with only a state.json naming their run: the
// rules read nothing else.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "expect_contains.h"
#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/checkpoint_root.h"
#include "moetron/core/error.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::error_of;
using moetron::testing::read_file;
using moetron::testing::TempDir;

namespace fs = std::filesystem;

constexpr const char* kRunA = "aaaaaaaaaaaaaaaa";
constexpr const char* kRunB = "bbbbbbbbbbbbbbbb";

void write_text(const fs::path& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good()) << path;
}

// A checkpoint of run_id at step (run_id "": one written before run ids, no "run_id" key).
void make_checkpoint(const fs::path& root, uint64_t step, const std::string& run_id) {
    const fs::path dir = root / checkpoint_dir_name(step);
    fs::create_directories(dir);
    write_text(dir / "state.json",
               run_id.empty() ? std::string("{\"step\": 1}") : "{\"run_id\": \"" + run_id + "\"}");
}

std::vector<std::string> names_in(const fs::path& dir) {
    std::vector<std::string> names;
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
        names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

SaveRootRequest request_of(const std::string& run_id, int64_t start_step, bool share = false) {
    SaveRootRequest r;
    r.run_id = run_id;
    r.start_step = start_step;
    r.share = share;
    r.override_flag = "--share-save-root";
    return r;
}

TEST(CheckpointRoot, RunIds) {
    const std::string a = new_run_id(), b = new_run_id();
    EXPECT_TRUE(is_run_id(a)) << a;
    EXPECT_NE(a, b);
    EXPECT_FALSE(is_run_id("0123456789ABCDEF"));
    EXPECT_FALSE(is_run_id("0123456789abcde"));
    EXPECT_FALSE(is_run_id("../../etc/passwd"));
}

TEST(CheckpointRoot, RetentionDeletesOnlyThisRunsOlderCheckpoints) {
    TempDir dir;
    const fs::path root = dir.path();
    for (uint64_t step : {100, 200, 300, 400, 500}) make_checkpoint(root, step, kRunA);
    make_checkpoint(root, 250, kRunB);  // another run's, saved beside (--share-save-root)
    make_checkpoint(root, 50, "");      // written before run ids
    write_latest_pointer(root, checkpoint_dir_name(500), kRunA);
    EXPECT_EQ(remove_old_checkpoints(root, 3, kRunA, 500),
              (std::vector<std::string>{"step-00000100", "step-00000200"}));
    EXPECT_EQ(names_in(root),
              (std::vector<std::string>{"latest", "step-00000050", "step-00000250", "step-00000300",
                                        "step-00000400", "step-00000500"}));
    EXPECT_CONTAINS(error_of([&] { remove_old_checkpoints(root, 0, kRunA, 500); }), "keeping 0");
    write_text(root / "latest", "garbage");
    EXPECT_CONTAINS(error_of([&] { remove_old_checkpoints(root, 1, kRunA, 500); }), "corrupt");
    EXPECT_EQ(list_checkpoint_dirs(root).size(), 5u);
}

// The bug of issue 16: a run resumed from step 300 deleted the newer 400 and 500 with --keep 1.
TEST(CheckpointRoot, RetentionNeverDeletesANewerCheckpoint) {
    TempDir dir;
    const fs::path root = dir.path();
    for (uint64_t step : {100, 200, 300, 400, 500}) make_checkpoint(root, step, kRunA);
    write_latest_pointer(root, checkpoint_dir_name(300), kRunA);
    EXPECT_EQ(remove_old_checkpoints(root, 1, kRunA, 300),
              (std::vector<std::string>{"step-00000100", "step-00000200"}));
    EXPECT_EQ(names_in(root), (std::vector<std::string>{"latest", "step-00000300", "step-00000400",
                                                        "step-00000500"}));
}

TEST(CheckpointRoot, ANewRootIsClaimed) {
    TempDir dir;
    const fs::path root = dir.path() / "runs" / "ck";
    claim_save_root(root, request_of(kRunA, 0));
    EXPECT_EQ(read_root_run_id(root), kRunA);
    EXPECT_EQ(read_file(root / kRunIdFileName), std::string(kRunA) + "\n");
    // Claiming again (a resumed run) changes nothing.
    make_checkpoint(root, 10, kRunA);
    claim_save_root(root, request_of(kRunA, 10));
    EXPECT_EQ(read_root_run_id(root), kRunA);
}

TEST(CheckpointRoot, AnotherRunsRootIsRefusedUnlessShared) {
    TempDir dir;
    const fs::path root = dir.path();
    claim_save_root(root, request_of(kRunA, 0));
    make_checkpoint(root, 10, kRunA);
    const std::string e = error_of([&] { claim_save_root(root, request_of(kRunB, 0)); });
    EXPECT_CONTAINS(e, "belongs to another run (run id aaaaaaaaaaaaaaaa");
    EXPECT_CONTAINS(e, "--share-save-root");
    EXPECT_EQ(e.find(".cpp"), std::string::npos) << "a user's mistake, not a bug: " << e;
    claim_save_root(root, request_of(kRunB, 10, /*share=*/true));
    EXPECT_EQ(read_root_run_id(root), kRunA) << "sharing does not take the root over";
}

TEST(CheckpointRoot, CheckpointsOfUnknownOriginAreProtected) {
    TempDir dir;
    make_checkpoint(dir.path(), 10, "");
    EXPECT_CONTAINS(error_of([&] { claim_save_root(dir.path(), request_of(kRunA, 0)); }),
                    "already holds checkpoints of another run (step-00000010");
    claim_save_root(dir.path(), request_of(kRunA, 10, /*share=*/true));
    EXPECT_EQ(read_root_run_id(dir.path()), std::nullopt);
}

TEST(CheckpointRoot, ARootWithoutCheckpointsIsTakenOver) {
    TempDir dir;
    claim_save_root(dir.path(), request_of(kRunA, 0));  // run A failed before its first save
    claim_save_root(dir.path(), request_of(kRunB, 0));
    EXPECT_EQ(read_root_run_id(dir.path()), kRunB);
}

TEST(CheckpointRoot, ANewerCheckpointIsRefusedBeforeAnyWork) {
    TempDir dir;
    claim_save_root(dir.path(), request_of(kRunA, 0));
    make_checkpoint(dir.path(), 10, kRunA);
    make_checkpoint(dir.path(), 20, kRunA);
    const std::string e = error_of([&] { claim_save_root(dir.path(), request_of(kRunA, 10)); });
    EXPECT_CONTAINS(e, "holds step-00000020, newer than step 10 where this run starts");
    EXPECT_CONTAINS(e, "--resume " + (dir.path() / "step-00000020").string());
    EXPECT_NO_THROW(claim_save_root(dir.path(), request_of(kRunA, 20)));
}

TEST(CheckpointRoot, BadRootsAreNamed) {
    TempDir dir;
    write_text(dir.path() / "file", "x");
    EXPECT_CONTAINS(error_of([&] { claim_save_root(dir.path() / "file", request_of(kRunA, 0)); }),
                    "--save '" + (dir.path() / "file").string() + "' is a file");
    EXPECT_CONTAINS(
        error_of([&] { claim_save_root(dir.path() / "file" / "ck", request_of(kRunA, 0)); }),
        "cannot create the directory");
    write_text(dir.path() / kRunIdFileName, "not an id\n");
    EXPECT_CONTAINS(error_of([&] { claim_save_root(dir.path(), request_of(kRunA, 0)); }),
                    "is damaged");
}

// Claiming removes the run's own crash leftovers, and nothing that only looks like one.
TEST(CheckpointRoot, ClaimRemovesOnlyThisRunsLeftovers) {
    TempDir dir;
    const fs::path root = dir.path();
    fs::create_directory(root / (std::string("step-00000003.moetron-tmp-") + kRunA));
    fs::create_directory(root / (std::string("step-00000003.moetron-tmp-") + kRunB));
    fs::create_directory(root / "notes.deleting-1");
    write_text(root / "report.tmp-2024", "a user's report");
    claim_save_root(root, request_of(kRunA, 0));
    EXPECT_EQ(names_in(root),
              (std::vector<std::string>{"notes.deleting-1", "report.tmp-2024", "run-id",
                                        std::string("step-00000003.moetron-tmp-") + kRunB}));
}

}  // namespace
}  // namespace moetron
