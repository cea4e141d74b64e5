// A rank stopped (SIGSTOP) in the middle of a distributed `moetron train` (3 ranks, dp3, gradient
// sync overlapped with the backward): the other ranks give up after one --comm-timeout-s, name
// the stopped rank, and the job ends once through MPI_Abort with exit code 1. Before, the
// survivors waited a second timeout while unwinding past the other pending gradient buckets, and
// ended in "collective handle was dropped unfinished", std::terminate and SIGABRT, naming no
// rank. Skipped when mpirun is not on the PATH.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "expect_contains.h"
#include "mpi_job.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using moetron::testing::mpirun_available;
using moetron::testing::rank_process;
using moetron::testing::read_file;
using moetron::testing::TempDir;

namespace fs = std::filesystem;
using moetron::testing::start_mpirun;

constexpr const char* kTimeoutS = "3";

pid_t start_job(const fs::path& log, const fs::path& steps_jsonl) {
    return start_mpirun(log, {"-np",
                              "3",
                              MOETRON_BINARY,
                              "train",
                              "--layout",
                              "dp3",
                              "--steps",
                              "1000000",
                              "--batch-size",
                              "6",
                              "--seq-len",
                              "16",
                              "--eval-every",
                              "0",
                              "--threads",
                              "1",
                              "--comm-timeout-s",
                              kTimeoutS,
                              "--log-jsonl",
                              steps_jsonl.string()});
}

// Training has started once rank 0 logged its first step.
bool wait_for_steps(const fs::path& steps_jsonl) {
    for (int i = 0; i < 1200; ++i) {
        std::error_code ec;
        if (fs::file_size(steps_jsonl, ec) > 0 && !ec) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
}

// waitpid with a bound (the job must end; how fast is not asserted beyond "it ended").
bool wait_for_exit(pid_t job, int& status, std::chrono::seconds bound) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    while (std::chrono::steady_clock::now() < deadline) {
        if (::waitpid(job, &status, WNOHANG) == job) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
}

TEST(StoppedRankMpiCli, SurvivorsNameTheStoppedRankAndTheJobAbortsOnce) {
    if (!mpirun_available()) GTEST_SKIP() << "mpirun is not on the PATH";
    TempDir dir;
    const fs::path log = dir.path() / "out.txt", steps = dir.path() / "steps.jsonl";
    const pid_t job = start_job(log, steps);
    ASSERT_GT(job, 0);
    const bool started = wait_for_steps(steps);
    const pid_t rank1 = started ? rank_process(job, 1) : 0;
    if (rank1 == 0) ::kill(job, SIGKILL);
    ASSERT_TRUE(started) << read_file(log);
    ASSERT_NE(rank1, 0) << "no process of rank 1 under mpirun " << job;
    ASSERT_EQ(::kill(rank1, SIGSTOP), 0);

    int status = 0;
    const bool ended = wait_for_exit(job, status, std::chrono::seconds(120));
    ::kill(rank1, SIGKILL);  // a no-op when mpirun already ended it
    if (!ended) {
        ::kill(job, SIGKILL);
        ::waitpid(job, &status, 0);
    }
    const std::string out = read_file(log);
    ASSERT_TRUE(ended) << "the job did not end within 120 s of the stop\n" << out;
    ASSERT_TRUE(WIFEXITED(status)) << out;
    EXPECT_EQ(WEXITSTATUS(status), 1) << out;  // MPI_Abort(1), not SIGABRT's 134
    EXPECT_CONTAINS(out, std::string("did not finish within ") + kTimeoutS + " s");
    EXPECT_CONTAINS(out, "world rank 1 did not answer a liveness probe");
    // Rank 2 is as alive as rank 0: only rank 1 is named.
    EXPECT_NOT_CONTAINS(out, "world rank 2 did not answer");
    EXPECT_NOT_CONTAINS(out, "world ranks");
    EXPECT_NOT_CONTAINS(out, "dropped unfinished");
    EXPECT_NOT_CONTAINS(out, "terminate");
    EXPECT_NOT_CONTAINS(out, "Aborted");
}

}  // namespace
}  // namespace moetron
