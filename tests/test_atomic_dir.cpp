// checkpoint/atomic_dir, checkpoint/atomic_file and the checkpoint index (checkpoint/checksum):
// atomic directory commit, atomic file writes, the `latest` pointer, stale-entry cleanup (one
// writer's leftovers only), index round trip and verification, and crash safety: a child writing
// checkpoints in a loop is killed with SIGKILL at random moments, and every time the checkpoint
// `latest` names (and every committed one) is complete.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "expect_contains.h"
#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/atomic_file.h"
#include "moetron/checkpoint/checkpoint_root.h"
#include "moetron/checkpoint/checksum.h"
#include "moetron/checkpoint/safetensors.h"
#include "moetron/core/error.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::error_of;
using moetron::testing::TempDir;

namespace fs = std::filesystem;

// The writer of the checkpoints these tests save: a run id, as the trainer's.
constexpr std::string_view kRun = "0123456789abcdef";

void write_text(const fs::path& path, std::string_view text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good()) << path;
}

std::vector<std::string> names_in(const fs::path& dir) {
    std::vector<std::string> names;
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
        names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

// Runs body in a forked child that then ends with _exit (no destructors, no flush: a crash as
// far as the file system can tell). Returns the child's wait status.
int run_in_child(const auto& body) {
    const pid_t pid = ::fork();
    if (pid == 0) {
        try {
            body();
        } catch (...) {
            ::_exit(3);
        }
        ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
}

// ---- a small checkpoint: two safetensors files and an index, contents a function of step ----

float value_at(uint64_t step, int tensor, size_t i) {
    return static_cast<float>((step * 131 + static_cast<uint64_t>(tensor) * 7 + i) % 10007);
}

const char* const kFileNames[2] = {"model.safetensors", "optimizer.safetensors"};

// Writes one checkpoint's files into dir, and a state.json that names the run (for retention).
void write_checkpoint_files(const fs::path& dir, uint64_t step, size_t floats_per_tensor) {
    write_text(dir / "state.json", "{\"run_id\": \"" + std::string(kRun) + "\"}");
    CheckpointIndex index;
    for (int f = 0; f < 2; ++f) {
        std::vector<float> a(floats_per_tensor), b(floats_per_tensor);
        for (size_t i = 0; i < floats_per_tensor; ++i) {
            a[i] = value_at(step, 2 * f, i);
            b[i] = value_at(step, 2 * f + 1, i);
        }
        SafetensorsWriter writer;
        writer.add("a", DType::f32, {static_cast<int64_t>(floats_per_tensor)}, a.data());
        writer.add("b", DType::f32, {static_cast<int64_t>(floats_per_tensor)}, b.data());
        writer.set_metadata("step", std::to_string(step));
        index.add(kFileNames[f], writer.write((dir / kFileNames[f]).string()));
    }
    index.write((dir / kCheckpointIndexName).string());
}

// The trainer's sequence: stage, commit, point latest at it, apply retention.
void save_checkpoint(const fs::path& root, uint64_t step, size_t floats_per_tensor) {
    StagedDir staged(root / checkpoint_dir_name(step), kRun);
    write_checkpoint_files(staged.path(), step, floats_per_tensor);
    staged.commit();
    write_latest_pointer(root, checkpoint_dir_name(step), kRun);
    remove_old_checkpoints(root, 2, kRun, static_cast<int64_t>(step));
}

// Checks a checkpoint byte for byte: index, checksums, then every value.
void expect_complete(const fs::path& root, const std::string& name, size_t floats_per_tensor) {
    SCOPED_TRACE(name);
    const fs::path dir = root / name;
    const CheckpointIndex index = CheckpointIndex::read((dir / kCheckpointIndexName).string());
    ASSERT_EQ(index.files.size(), 2u);
    ASSERT_NO_THROW(index.verify(dir.string()));
    const uint64_t step = parse_checkpoint_dir_name(name).value();
    std::vector<float> values(floats_per_tensor);
    for (int f = 0; f < 2; ++f) {
        const SafetensorsFile file = SafetensorsFile::open((dir / kFileNames[f]).string());
        EXPECT_EQ(file.metadata().at("step"), std::to_string(step));
        for (int t = 0; t < 2; ++t) {
            file.read(
                t == 0 ? "a" : "b",
                TensorView(values.data(), {static_cast<int64_t>(floats_per_tensor)}, DType::f32));
            for (size_t i = 0; i < floats_per_tensor; i += 997)
                ASSERT_EQ(values[i], value_at(step, 2 * f + t, i)) << kFileNames[f] << " " << i;
        }
    }
}

class AtomicDir : public ::testing::Test {
  protected:
    void SetUp() override {
        root_ = fs::temp_directory_path() /
                ("moetron_atomic_" + std::to_string(::getpid()) + "_" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(root_);
        fs::create_directories(root_);
    }
    void TearDown() override { fs::remove_all(root_); }

    fs::path root_;
};

TEST_F(AtomicDir, CommitRenamesTheStagingDirectory) {
    const fs::path final_dir = root_ / "step-00000001";
    {
        StagedDir staged(final_dir, kRun);
        EXPECT_EQ(staged.path(), root_ / "step-00000001.moetron-tmp-0123456789abcdef");
        EXPECT_TRUE(fs::is_directory(staged.path()));
        EXPECT_FALSE(fs::exists(final_dir));
        write_text(staged.path() / "a.txt", "hello");
        fs::create_directory(staged.path() / "sub");
        write_text(staged.path() / "sub" / "b.txt", "world");
        staged.commit();
        EXPECT_TRUE(staged.committed());
        EXPECT_CONTAINS(error_of([&] { staged.commit(); }), "already committed");
    }
    EXPECT_EQ(names_in(root_), std::vector<std::string>{"step-00000001"});
    EXPECT_EQ(names_in(final_dir), (std::vector<std::string>{"a.txt", "sub"}));
    EXPECT_TRUE(fs::exists(final_dir / "sub" / "b.txt"));
}

TEST_F(AtomicDir, UncommittedStagingIsRemovedAndExistingTargetsRefused) {
    {
        StagedDir staged(root_ / "step-00000002/",
                         kRun);  // a trailing separator names the same dir
        write_text(staged.path() / "a.txt", "partial");
        EXPECT_EQ(staged.final_path(), root_ / "step-00000002");
    }
    EXPECT_TRUE(names_in(root_).empty());
    fs::create_directory(root_ / "step-00000003");
    EXPECT_CONTAINS(error_of([&] { StagedDir staged(root_ / "step-00000003", kRun); }),
                    "already exists; a checkpoint directory is never overwritten");
    StagedDir late(root_ / "step-00000004", kRun);
    fs::create_directory(root_ / "step-00000004");  // appears while `late` is being written
    EXPECT_CONTAINS(error_of([&] { late.commit(); }), "appeared while it was being written");
}

TEST_F(AtomicDir, CreatesAMissingParent) {
    StagedDir staged(root_ / "run" / "checkpoints" / "step-00000001", kRun);
    staged.commit();
    EXPECT_TRUE(fs::is_directory(root_ / "run" / "checkpoints" / "step-00000001"));
}

TEST_F(AtomicDir, CheckpointNames) {
    EXPECT_EQ(checkpoint_dir_name(1200), "step-00001200");
    EXPECT_EQ(checkpoint_dir_name(123456789012), "step-123456789012");
    EXPECT_EQ(parse_checkpoint_dir_name("step-00001200"), 1200u);
    EXPECT_EQ(parse_checkpoint_dir_name("step-7"), 7u);
    EXPECT_EQ(parse_checkpoint_dir_name("step-"), std::nullopt);
    EXPECT_EQ(parse_checkpoint_dir_name("step-12.tmp-99"), std::nullopt);
    EXPECT_EQ(parse_checkpoint_dir_name("step--1"), std::nullopt);
    EXPECT_EQ(parse_checkpoint_dir_name("step-99999999999999999999999"), std::nullopt);
    EXPECT_EQ(parse_checkpoint_dir_name("latest"), std::nullopt);

    for (const char* name : {"step-00000010", "step-00000002", "step-00000100", "step-7.tmp-5",
                             "notes", "step-00000003.deleting-9"})
        fs::create_directory(root_ / name);
    write_text(root_ / "step-00000050", "a file, not a directory");
    std::vector<std::string> listed;
    for (const CheckpointDir& d : list_checkpoint_dirs(root_)) listed.push_back(d.name);
    EXPECT_EQ(listed,
              (std::vector<std::string>{"step-00000002", "step-00000010", "step-00000100"}));
    EXPECT_TRUE(list_checkpoint_dirs(root_ / "missing").empty());
}

TEST_F(AtomicDir, LatestPointer) {
    EXPECT_EQ(read_latest_pointer(root_), std::nullopt);
    EXPECT_CONTAINS(error_of([&] { write_latest_pointer(root_, "step-00000001", kRun); }),
                    "no such checkpoint directory");
    EXPECT_CONTAINS(error_of([&] { write_latest_pointer(root_, "../elsewhere", kRun); }),
                    "is not a checkpoint directory name");
    fs::create_directory(root_ / "step-00000001");
    fs::create_directory(root_ / "step-00000002");
    write_latest_pointer(root_, "step-00000001", kRun);
    EXPECT_EQ(read_latest_pointer(root_), "step-00000001");
    write_latest_pointer(root_, "step-00000002", kRun);
    EXPECT_EQ(read_latest_pointer(root_), "step-00000002");
    EXPECT_EQ(names_in(root_),
              (std::vector<std::string>{"latest", "step-00000001", "step-00000002"}));

    write_text(root_ / "latest", "../../etc\n");
    EXPECT_CONTAINS(error_of([&] { read_latest_pointer(root_); }), "latest' is corrupt");
    write_text(root_ / "latest", std::string(1000, 'x'));
    EXPECT_CONTAINS(error_of([&] { read_latest_pointer(root_); }), "is 1000 bytes");
    write_text(root_ / "latest", "step-00000009\n");
    EXPECT_CONTAINS(error_of([&] { read_latest_pointer(root_); }),
                    "names checkpoint 'step-00000009', which does not exist");
}

// Only the writer's own leftovers go: not another run's staging (two runs may share a root), not
// a user's files that merely look like leftovers (the names an older build removed).
TEST_F(AtomicDir, RemovesOnlyTheWritersStaleEntries) {
    for (const char* name : {"step-00000001", "step-00000002.moetron-tmp-0123456789abcdef",
                             "step-00000003.moetron-deleting-0123456789abcdef",
                             "step-00000004.tmp-123", "step-00000005.moetron-tmp-fedcba9876543210",
                             "notes.deleting-1", ".moetron-tmp-0123456789abcdef"})
        fs::create_directory(root_ / name);
    write_text(root_ / "step-00000002.moetron-tmp-0123456789abcdef" / "model.safetensors", "half");
    write_text(root_ / "latest.moetron-tmp-0123456789abcdef", "step-0000");
    write_text(root_ / "report.tmp-2024", "a user's report");
    write_text(root_ / "keep.txt", "x");
    EXPECT_EQ(remove_stale_entries(root_, kRun),
              (std::vector<std::string>{"latest.moetron-tmp-0123456789abcdef",
                                        "step-00000002.moetron-tmp-0123456789abcdef",
                                        "step-00000003.moetron-deleting-0123456789abcdef"}));
    EXPECT_EQ(names_in(root_), (std::vector<std::string>{
                                   ".moetron-tmp-0123456789abcdef", "keep.txt", "notes.deleting-1",
                                   "report.tmp-2024", "step-00000001", "step-00000004.tmp-123",
                                   "step-00000005.moetron-tmp-fedcba9876543210"}));
    EXPECT_TRUE(remove_stale_entries(root_, kRun).empty());
    EXPECT_TRUE(remove_stale_entries(root_ / "missing", kRun).empty());
    EXPECT_CONTAINS(error_of([&] { remove_stale_entries(root_, "../x"); }), "not a writer name");
}

// ---- atomic files ----

TEST_F(AtomicDir, WriteFileAtomicallyReplacesTheWholeFile) {
    const fs::path path = root_ / "export.bin";
    write_text(path, "old content");
    write_file_atomically(path, [](const std::string& staging) {
        EXPECT_NE(staging.find("export.bin.moetron-tmp-pid"), std::string::npos) << staging;
        write_text(staging, "new content");
    });
    EXPECT_EQ(moetron::testing::read_file(path), "new content");
    EXPECT_EQ(names_in(root_), std::vector<std::string>{"export.bin"});
}

// A write that fails half-way (a full disk, as far as the caller can tell) leaves the previous
// file whole and no staging file behind.
TEST_F(AtomicDir, FailedWriteLeavesThePreviousFile) {
    const fs::path path = root_ / "export.bin";
    write_text(path, "the previous export");
    const std::string error = error_of([&] {
        write_file_atomically(path, [](const std::string& staging) {
            write_text(staging, "half of the");
            MT_THROW("[io] writing '{}' failed: No space left on device", staging);
        });
    });
    EXPECT_CONTAINS(error, "No space left on device");
    EXPECT_EQ(moetron::testing::read_file(path), "the previous export");
    EXPECT_EQ(names_in(root_), std::vector<std::string>{"export.bin"});
}

// The final rename is impossible (a directory holds the name): the error says so, and the
// staging file is gone.
TEST_F(AtomicDir, FailedRenameLeavesNoStagingFile) {
    fs::create_directory(root_ / "taken");
    write_text(root_ / "taken" / "inside", "x");
    EXPECT_CONTAINS(error_of([&] {
                        write_file_atomically(root_ / "taken", [](const std::string& staging) {
                            write_text(staging, "content");
                        });
                    }),
                    "renaming");
    EXPECT_EQ(names_in(root_), std::vector<std::string>{"taken"});
    EXPECT_EQ(moetron::testing::read_file(root_ / "taken" / "inside"), "x");
}

// ---- the checkpoint index ----

TEST_F(AtomicDir, IndexRoundTripsAndVerifies) {
    write_checkpoint_files(root_, 7, 1000);
    const CheckpointIndex index = CheckpointIndex::read((root_ / kCheckpointIndexName).string());
    ASSERT_EQ(index.files.size(), 2u);
    EXPECT_EQ(index.files[0].name, "model.safetensors");
    EXPECT_EQ(index.files[0].num_bytes, fs::file_size(root_ / "model.safetensors"));
    EXPECT_EQ(index.files[0].xxh3, digest_file((root_ / "model.safetensors").string()).xxh3);
    EXPECT_EQ(CheckpointIndex::from_json(index.to_json(), "copy").files, index.files);
    EXPECT_NO_THROW(index.verify(root_.string()));
    CheckpointIndex by_name;
    by_name.add_file(root_.string(), "optimizer.safetensors");
    EXPECT_EQ(by_name.files[0], index.files[1]);
}

TEST_F(AtomicDir, IndexVerifyNamesTheFirstBadFile) {
    write_checkpoint_files(root_, 7, 1000);
    const CheckpointIndex index = CheckpointIndex::read((root_ / kCheckpointIndexName).string());
    const fs::path optimizer = root_ / "optimizer.safetensors";
    {
        std::fstream f(optimizer, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(-100, std::ios::end);
        f.put('\x5a');
    }
    std::string e = error_of([&] { index.verify(root_.string()); });
    EXPECT_CONTAINS(e, "optimizer.safetensors' is corrupt: its xxh3 checksum is");
    fs::resize_file(optimizer, fs::file_size(optimizer) - 1);
    e = error_of([&] { index.verify(root_.string()); });
    EXPECT_CONTAINS(e, "optimizer.safetensors' is corrupt: it is");
    EXPECT_CONTAINS(e, "bytes, the index records");
    fs::remove(root_ / "model.safetensors");
    e = error_of([&] { index.verify(root_.string()); });
    EXPECT_CONTAINS(e, "model.safetensors' is listed in the checkpoint's index but missing");
}

TEST_F(AtomicDir, HostileIndexes) {
    using nlohmann::json;
    const json good = {{"format", "moetron-checkpoint-index"},
                       {"version", 1},
                       {"files", {{{"name", "a"}, {"bytes", 3}, {"xxh3", "0123456789abcdef"}}}}};
    EXPECT_NO_THROW(CheckpointIndex::from_json(good, "i"));
    auto with = [&](const char* pointer, json value) {
        json j = good;
        j[json::json_pointer(pointer)] = std::move(value);
        return error_of([&] { CheckpointIndex::from_json(j, "idx.json"); });
    };
    EXPECT_CONTAINS(with("/files/0/name", "../../etc/passwd"), "not a plain file name");
    EXPECT_CONTAINS(with("/files/0/name", ".."), "not a plain file name");
    EXPECT_CONTAINS(with("/files/0/name", ""), "not a plain file name");
    EXPECT_CONTAINS(with("/files/0/xxh3", "0123"), "is not 16 hex digits");
    EXPECT_CONTAINS(with("/files/0/bytes", -1), "'bytes' is not a non-negative integer");
    EXPECT_CONTAINS(with("/files/0/extra", 1), "unexpected key 'extra'");
    EXPECT_CONTAINS(with("/version", 2), "version 2 is not one this build reads");
    EXPECT_CONTAINS(with("/format", "other"), "format is \"other\"");
    EXPECT_CONTAINS(with("/files", json::object()), "'files' is not an array");
    EXPECT_CONTAINS(with("/files/1", good["files"][0]), "already in the index");
    EXPECT_CONTAINS(error_of([&] { CheckpointIndex::from_json(json::array(), "idx.json"); }),
                    "index 'idx.json': not a JSON object");

    write_text(root_ / "index.json", "{\"format\": ");
    EXPECT_CONTAINS(error_of([&] { CheckpointIndex::read((root_ / "index.json").string()); }),
                    "is not valid JSON");
    EXPECT_CONTAINS(error_of([&] { CheckpointIndex::read((root_ / "none.json").string()); }),
                    "does not exist");
}

// ---- crashes ----

constexpr size_t kFloatsPerTensor = size_t{1} << 19;  // 2 MiB per tensor, 8 MiB per checkpoint

TEST_F(AtomicDir, CrashBeforeCommitLeavesThePreviousCheckpoint) {
    save_checkpoint(root_, 1, 4096);
    const int status = run_in_child([&] {
        StagedDir staged(root_ / checkpoint_dir_name(2), kRun);
        write_checkpoint_files(staged.path(), 2, 4096);
        ::_exit(0);  // dies before commit
    });
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_EQ(read_latest_pointer(root_), "step-00000001");
    expect_complete(root_, "step-00000001", 4096);
    EXPECT_EQ(list_checkpoint_dirs(root_).size(), 1u);
    EXPECT_EQ(remove_stale_entries(root_, kRun).size(), 1u);
}

TEST_F(AtomicDir, CrashBetweenCommitAndPointerLeavesTwoCompleteCheckpoints) {
    save_checkpoint(root_, 1, 4096);
    const int status = run_in_child([&] {
        StagedDir staged(root_ / checkpoint_dir_name(2), kRun);
        write_checkpoint_files(staged.path(), 2, 4096);
        staged.commit();
        ::_exit(0);  // dies before `latest` moves
    });
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_EQ(read_latest_pointer(root_), "step-00000001");
    for (const CheckpointDir& d : list_checkpoint_dirs(root_)) expect_complete(root_, d.name, 4096);
    EXPECT_TRUE(remove_stale_entries(root_, kRun).empty());
}

// A child saves checkpoints in a loop until SIGKILL lands at a random moment (staging, fsync,
// rename, pointer update or retention). Every time: `latest` names a complete checkpoint and
// every committed directory is complete. Repeats until several kills landed mid-write.
TEST_F(AtomicDir, SigkillAtRandomMomentsNeverLeavesAPartialCheckpoint) {
    const auto start = std::chrono::steady_clock::now();
    save_checkpoint(root_, 1, kFloatsPerTensor);
    const auto one_save_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::steady_clock::now() - start)
                                 .count();
    std::mt19937_64 rng(20240611);
    std::uniform_int_distribution<int64_t> delay_us(0, 3 * one_save_us + 1000);
    int num_kills = 0, num_mid_write = 0;
    while (num_kills < 30 && (num_kills < 8 || num_mid_write < 3)) {
        const uint64_t next_step = list_checkpoint_dirs(root_).back().step + 1;
        const pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            try {
                for (uint64_t step = next_step;; ++step)
                    save_checkpoint(root_, step, kFloatsPerTensor);
            } catch (...) {
                ::_exit(3);
            }
        }
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
        ASSERT_EQ(::kill(pid, SIGKILL), 0);
        int status = 0;
        ASSERT_EQ(::waitpid(pid, &status, 0), pid);
        ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
            << "the child failed on its own, status " << status;
        ++num_kills;

        const std::optional<std::string> latest = read_latest_pointer(root_);
        ASSERT_TRUE(latest.has_value());
        expect_complete(root_, *latest, kFloatsPerTensor);
        for (const CheckpointDir& d : list_checkpoint_dirs(root_))
            expect_complete(root_, d.name, kFloatsPerTensor);
        if (HasFatalFailure()) return;
        if (!remove_stale_entries(root_, kRun).empty()) ++num_mid_write;
    }
    std::printf("[crash] one save %.1f ms; %d kills, %d mid-write, reached %s\n",
                static_cast<double>(one_save_us) / 1000, num_kills, num_mid_write,
                read_latest_pointer(root_).value_or("?").c_str());
    EXPECT_GE(num_mid_write, 1);
}

}  // namespace
}  // namespace moetron
