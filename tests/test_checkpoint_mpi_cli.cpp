// Stop signals in a distributed `moetron train --save` launched by mpirun (2 ranks, ep2): every
// rank saves the same step and stops.
//  - SIGTERM to one rank only (as a scheduler signalling its tasks, e.g. Slurm's scancel, may
//    reach them at different moments): the ranks agree on the flag after the step, all save it,
//    and the job exits 0.
//  - SIGTERM to mpirun: Open MPI 4.1's mpirun forwards it to every rank (after
//    odls_base_sigkill_timeout seconds, and kills them that long after) and then exits 1
//    whatever the ranks returned, so only the checkpoint is checked there: saved at the step the
//    run stopped after, loadable.
// And a tensor-parallel job's checkpoint (4 ranks tp2.ep2) resumed by one process ends at the
// same loss as the job. Skipped when mpirun is not on the PATH.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/core/error.h"
#include "moetron/model/config.h"
#include "moetron/train/checkpoint.h"
#include "moetron/train/data_source.h"
#include "moetron/train/trainer.h"
#include "mpi_job.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::error_of;
using moetron::testing::mpirun_available;
using moetron::testing::rank_process;
using moetron::testing::read_file;
using moetron::testing::start_mpirun;
using moetron::testing::TempDir;

namespace fs = std::filesystem;

// Starts `mpirun -np 2 moetron train --layout ep2 ... --save root` with output to log.
pid_t start_job(const fs::path& root, const fs::path& log,
                const std::vector<std::string>& mpirun_flags) {
    // --save-every 25, not smaller: once mpirun 4.1 has its SIGTERM it stops reading the ranks'
    // output, and a rank that fills the pipe (a "saved" line every few milliseconds) blocks in
    // its write and never reaches the stop: seen as a SIGKILL at step 768 on a quiet machine.
    std::vector<std::string> args = mpirun_flags;
    for (const char* a : {"-np",          "2",       MOETRON_BINARY, "train", "--layout",     "ep2",
                          "--steps",      "1000000", "--batch-size", "4",     "--seq-len",    "16",
                          "--eval-every", "0",       "--threads",    "1",     "--save-every", "25",
                          "--keep",       "2",       "--save"})
        args.emplace_back(a);
    args.push_back(root.string());
    return start_mpirun(log, args);
}

// Stepping has started once the first periodic checkpoint exists.
bool wait_for_first_checkpoint(const fs::path& root) {
    for (int i = 0; i < 1200; ++i) {
        if (fs::exists(root / "latest")) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
}

// The number that follows `marker` in the log, parsed by parse; fallback when absent. (Plain
// string search: GCC 12's <regex> trips -Wmaybe-uninitialized in the sanitizer build.)
template <class T>
T number_after(const std::string& log, size_t from, const std::string& marker, T fallback,
               T (*parse)(const std::string&, size_t*)) {
    const size_t at = log.find(marker, from);
    if (at == std::string::npos) return fallback;
    const std::string rest = log.substr(at + marker.size());
    try {
        return parse(rest, nullptr);
    } catch (const std::exception&) {
        return fallback;
    }
}

int64_t parse_int64(const std::string& s, size_t* end) {
    return std::stoll(s, end);
}
double parse_double(const std::string& s, size_t* end) {
    return std::stod(s, end);
}

// The step of "stopped by signal ... after step N" in the log; -1 when absent.
int64_t stopped_after_step(const std::string& log) {
    const size_t stopped = log.find("stopped by signal");
    if (stopped == std::string::npos) return -1;
    return number_after<int64_t>(log, stopped, "after step ", -1, parse_int64);
}

// Loads the checkpoint root into a one-process trainer (a sharded checkpoint of 2 ranks).
int64_t loaded_step(const fs::path& root) {
    const ModelConfig model = load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
    TrainConfig c;
    c.batch_size = 4;
    c.seq_len = 16;
    TokenData data = make_synthetic_data(model.vocab_size, /*seed=*/3, /*num_bytes=*/8000);
    DataLoader loader(std::move(data.tokens), data.source, model.vocab_size, c.seq_len,
                      c.val_fraction, c.seed);
    Trainer t(model, c, std::move(loader));
    load_checkpoint(t, root);
    return t.steps_done();
}

TEST(CheckpointMpiCli, SigtermToOneRankSavesTheSameStepOnEveryRankAndExitsZero) {
    if (!mpirun_available()) GTEST_SKIP() << "mpirun is not on the PATH";
    TempDir dir;
    const fs::path root = dir.path() / "ckpt", log = dir.path() / "out.txt";
    const pid_t job = start_job(root, log, {});
    ASSERT_GT(job, 0);
    const bool started = wait_for_first_checkpoint(root);
    const pid_t rank1 = started ? rank_process(job, 1) : 0;
    if (rank1 == 0) ::kill(job, SIGKILL);
    ASSERT_TRUE(started) << read_file(log);
    ASSERT_NE(rank1, 0) << "no process of rank 1 under mpirun " << job;
    ASSERT_EQ(::kill(rank1, SIGTERM), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(job, &status, 0), job);
    const std::string out = read_file(log);
    ASSERT_TRUE(WIFEXITED(status)) << out;
    EXPECT_EQ(WEXITSTATUS(status), 0) << out;
    // Rank 0 prints; the signal reached rank 1 only.
    EXPECT_NE(out.find("stopped by signal (on another rank)"), std::string::npos) << out;
    const int64_t step = stopped_after_step(out);
    ASSERT_GE(step, 3) << out;
    const fs::path saved = root / checkpoint_dir_name(static_cast<uint64_t>(step));
    EXPECT_NE(out.find("saved   checkpoint " + saved.string()), std::string::npos) << out;
    EXPECT_EQ(read_latest_pointer(root), saved.filename().string());
    EXPECT_EQ(loaded_step(root), step);
    EXPECT_LE(list_checkpoint_dirs(root).size(), 2u);
    // The sharded checkpoint exports to Hugging Face like a one-process one.
    const fs::path hf = dir.path() / "hf";
    const std::string export_cmd = std::string(MOETRON_BINARY) + " export --weights " +
                                   root.string() + " --dtype fp32 --out " + hf.string() + " > " +
                                   (dir.path() / "export.txt").string() + " 2>&1";
    EXPECT_EQ(std::system(export_cmd.c_str()), 0) << read_file(dir.path() / "export.txt");
    EXPECT_TRUE(fs::exists(hf / "config.json")) << read_file(dir.path() / "export.txt");
}

TEST(CheckpointMpiCli, SigtermToMpirunSavesTheStepTheRunStoppedAfter) {
    if (!mpirun_available()) GTEST_SKIP() << "mpirun is not on the PATH";
    TempDir dir;
    const fs::path root = dir.path() / "ckpt", log = dir.path() / "out.txt";
    // The ranks get the forwarded SIGTERM 3 s after mpirun and have 3 s more before SIGKILL.
    const pid_t job = start_job(root, log, {"--mca", "odls_base_sigkill_timeout", "3"});
    ASSERT_GT(job, 0);
    const bool started = wait_for_first_checkpoint(root);
    if (!started) ::kill(job, SIGKILL);
    ASSERT_TRUE(started) << read_file(log);
    // Signalled within a second or so of the launch, mpirun 4.1 was seen to kill the ranks
    // without forwarding SIGTERM to them.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    ASSERT_EQ(::kill(job, SIGTERM), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(job, &status, 0), job);
    const std::string out = read_file(log);
    EXPECT_NE(out.find("stopped by signal 15"), std::string::npos) << out;
    const int64_t step = stopped_after_step(out);
    ASSERT_GE(step, 3) << out;
    EXPECT_EQ(read_latest_pointer(root), checkpoint_dir_name(static_cast<uint64_t>(step)));
    EXPECT_EQ(loaded_step(root), step);
    std::printf("mpirun exit status %d (Open MPI exits 1 after forwarding SIGTERM)\n",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

// The loss printed for step `step` ("step 8/8 | loss 5.0082 | ..."); -1 when absent.
double printed_loss(const std::string& log, int step) {
    // Lines start with the step; the total after the slash may be padded differently.
    for (size_t at = log.find("step " + std::to_string(step) + "/"); at != std::string::npos;
         at = log.find("step " + std::to_string(step) + "/", at + 1)) {
        if (at != 0 && log[at - 1] != '\n') continue;
        const size_t line_end = log.find('\n', at);
        const std::string line = log.substr(at, line_end - at);
        return number_after<double>(line, 0, "| loss ", -1.0, parse_double);
    }
    return -1.0;
}

TEST(CheckpointMpiCli, TensorParallelCheckpointResumesOnOneProcess) {
    if (!mpirun_available()) GTEST_SKIP() << "mpirun is not on the PATH";
    TempDir dir;
    const fs::path root = dir.path() / "ckpt";
    const std::string common = " --steps 8 --batch-size 4 --seq-len 16 --eval-every 0 --threads 1";
    const std::string job =
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun "
        "--oversubscribe -np 4 -x OMP_NUM_THREADS=1 " +
        std::string(MOETRON_BINARY) + " train --layout tp2.ep2" + common +
        " --save-every 4 --save " + root.string() + " > " + (dir.path() / "job.txt").string() +
        " 2>&1";
    ASSERT_EQ(std::system(job.c_str()), 0) << read_file(dir.path() / "job.txt");
    const std::string resume = std::string(MOETRON_BINARY) + " train" + common + " --resume " +
                               (root / checkpoint_dir_name(4)).string() + " > " +
                               (dir.path() / "resume.txt").string() + " 2>&1";
    ASSERT_EQ(std::system(resume.c_str()), 0) << read_file(dir.path() / "resume.txt");
    const double want = printed_loss(read_file(dir.path() / "job.txt"), 8);
    const double got = printed_loss(read_file(dir.path() / "resume.txt"), 8);
    ASSERT_GT(want, 0) << read_file(dir.path() / "job.txt");
    EXPECT_NEAR(got, want, 1e-4) << read_file(dir.path() / "resume.txt");
}

// --save-final under expert parallelism (once refused: "each rank holds only its experts"): the
// 2 ranks write their shards of the final state, and one process samples from it the same text
// as from the job's last --save checkpoint.
TEST(CheckpointMpiCli, SaveFinalOfAnExpertParallelJobSamplesOnOneProcess) {
    if (!mpirun_available()) GTEST_SKIP() << "mpirun is not on the PATH";
    TempDir dir;
    const fs::path root = dir.path() / "ckpt", final_root = dir.path() / "final";
    const std::string job =
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun "
        "--oversubscribe -np 2 -x OMP_NUM_THREADS=1 " +
        std::string(MOETRON_BINARY) +
        " train --layout ep2 --steps 3 --batch-size 2 --seq-len 16 --eval-every 0 --threads 1 "
        "--save " +
        root.string() + " --save-final " + final_root.string() + " > " +
        (dir.path() / "job.txt").string() + " 2>&1";
    ASSERT_EQ(std::system(job.c_str()), 0) << read_file(dir.path() / "job.txt");
    auto sample = [&](const fs::path& weights, const std::string& name) {
        const fs::path out = dir.path() / name;
        const std::string command =
            std::string(MOETRON_BINARY) + " sample --weights " + weights.string() +
            " --prompt ab --new-tokens 8 --temperature 0 --threads 1 > " + out.string() + " 2>&1";
        EXPECT_EQ(std::system(command.c_str()), 0) << read_file(out);
        return read_file(out);
    };
    const std::string from_final = sample(final_root, "final.txt");
    EXPECT_EQ(from_final.size(), 2u + 8u + 1u) << from_final;
    EXPECT_EQ(from_final, sample(root, "save.txt"));
}

}  // namespace
}  // namespace moetron
