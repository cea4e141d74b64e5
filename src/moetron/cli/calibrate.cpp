// moetron calibrate: measures this machine's kernels (and, under an MPI launcher with more than
// one rank, its all_reduce and all_to_all_v) and writes a cluster file that `moetron simulate`
// reads, so that the cluster model predicts this machine's `moetron train` steps:
//   moetron calibrate --out configs/clusters/local.toml [--threads N]
//   mpirun -np 4 moetron calibrate --out local-np4.toml --threads 1
// Under MPI every rank measures the compute kernels at the same time (the contention of a real
// multi-rank run), rank 0's figures are written, and the collectives are fitted over all ranks.
// On one rank no collective is measured: the link figures are memcpy self copies (unused by a
// 1-GPU simulation). See calibrate/calibrate.h.
#include <fmt/format.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "moetron/calibrate/calibrate.h"
#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/checkpoint/output_paths.h"
#include "moetron/cli/commands.h"
#include "moetron/cli/number_options.h"
#include "moetron/core/error.h"
#include "moetron/core/user_error.h"
#include "moetron/parallel/communicator.h"
#include "moetron/train/threads.h"

namespace moetron::cli {

namespace {

struct CalibrateFlags {
    std::string out_path = "configs/clusters/local.toml";
    std::string name;
    int threads = 0;
    double seconds_per_point = 0.05;
    bool quick = false;
    int rounds = 3;
    std::string command;
};

// Ranks on this node: Open MPI's local size, else all of them.
int ranks_on_node(int world_size) {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    return local != nullptr && std::atoi(local) > 0 ? std::atoi(local) : world_size;
}

// The cluster file can be written (its directory created if needed): checked before the
// measurements, so that a bad --out does not cost them.
void check_out_path(const std::string& path) {
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) prepare_output_dir({"--out", parent});
    check_output_file({"--out", path});
}

void run_calibrate(const CalibrateFlags& f, parallel::Communicator* world) {
    if (f.threads > 0) {
        check_thread_count(f.threads, "--threads");
        omp_set_num_threads(f.threads);
    }
    const bool root = world == nullptr || world->rank() == 0;
    const int size = world == nullptr ? 1 : world->size();
    if (root) check_out_path(f.out_path);
    calibrate::CalibrateOptions o;
    o.seconds_per_point = f.seconds_per_point;
    o.quick = f.quick;
    o.rounds = f.rounds;
    if (root) {
        std::printf("moetron calibrate: %d rank(s), %d thread(s) per rank; measuring kernels\n",
                    size, omp_get_max_threads());
        std::fflush(stdout);
    }
    if (world != nullptr) world->barrier();
    const calibrate::ComputeMeasurements compute = calibrate::measure_compute(o);
    if (world != nullptr) world->barrier();
    if (root) {
        std::printf("  %s\n", size > 1 ? "measuring all_reduce and all_to_all_v"
                                       : "one rank: memcpy self copies for the link figures");
        std::fflush(stdout);
    }
    const calibrate::CollectiveMeasurements coll =
        size > 1 ? calibrate::measure_collectives(*world, o) : calibrate::measure_self_copies(o);
    if (!root) return;
    const calibrate::CalibrationFit fit = calibrate::fit_calibration(compute, coll);
    const std::string name =
        f.name.empty() ? std::filesystem::path(f.out_path).stem().string() : f.name;
    const calibrate::MachineInfo machine =
        calibrate::detect_machine(size > 1 ? ranks_on_node(size) : 1, f.command);
    replace_file_durably(f.out_path,
                         calibrate::format_cluster_toml(name, machine, compute, coll, fit),
                         this_process_writer());
    std::printf(
        "  sgemm asymptote %.1f GFLOP/s (half-saturation dim %.0f), grouped ratio %.2f "
        "(half %.0f tokens/expert), attention fwd %.2f-%.2f bwd %.2f-%.2f of peak (smallest to "
        "largest shape), stream %.1f GB/s\n",
        fit.peak_gflops, fit.gemm_half_dim, fit.grouped_ratio, fit.grouped_half_tokens,
        fit.attention_by_work.front().fwd, fit.attention_fwd, fit.attention_by_work.front().bwd,
        fit.attention_bwd, compute.stream_gbytes_per_s);
    std::printf("  rmsnorm + SwiGLU, bytes per call: rate over the stream rate:");
    for (const auto& p : fit.memory_ops_by_bytes) {
        std::printf(" %.0f KB: %.2f", p.bytes_per_call / 1e3, p.efficiency);
    }
    std::printf("\n");
    if (fit.collectives_measured) {
        std::printf(
            "  all_reduce %.2f GB/s, %.1f us/step; all_to_all %.2f GB/s, %.1f us; the "
            "slowest of %d ranks behind their mean:",
            fit.all_reduce_gbytes_per_s, fit.latency_us, fit.all_to_all_gbytes_per_s,
            fit.all_to_all_latency_us, coll.ranks);
        for (const auto& p : coll.slowest_rank) {
            std::printf(" %.1f%% over %.0f ms", 100 * p.excess, 1e3 * p.block_s);
        }
        std::printf("\n");
    }
    std::printf("  wrote %s\n", f.out_path.c_str());
}

void run_calibrate_mpi(const CalibrateFlags& f) {
    parallel::MpiSession session(nullptr, nullptr);
    try {
        std::unique_ptr<parallel::Communicator> world = parallel::make_mpi_world(session);
        run_calibrate(f, world.get());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "moetron calibrate: error: %s\n", e.what());
        parallel::MpiSession::abort_job(1);
    }
}

}  // namespace

void register_calibrate(CLI::App& app) {
    auto f = std::make_shared<CalibrateFlags>();
    CLI::App* cmd = app.add_subcommand(
        "calibrate",
        "Measure this machine's kernels (and MPI collectives under mpirun) and write a cluster "
        "file for moetron simulate");
    cmd->add_option("--out", f->out_path, "cluster file to write")->capture_default_str();
    cmd->add_option("--name", f->name, "cluster name in the file (default: the file's stem)");
    cmd->add_option("--threads", f->threads,
                    "OpenMP threads per rank (default: OMP_NUM_THREADS, else all cores); use the "
                    "same number as the runs it should predict")
        ->check(whole_number(1, kMaxThreads));
    cmd->add_option("--seconds-per-point", f->seconds_per_point,
                    "minimum timed seconds per measured shape")
        ->check(positive_number(3600))
        ->capture_default_str();
    cmd->add_option("--rounds", f->rounds,
                    "measure every compute kernel this many times, in rounds, and keep each one's "
                    "median (robust to another process's burst on a shared machine)")
        ->check(whole_number(1, 1000))
        ->capture_default_str();
    cmd->add_flag("--quick", f->quick,
                  "fewer, smaller shapes (a rough file in about a second per round)");
    cmd->callback([f, cmd] {
        f->command = "moetron calibrate";
        for (const auto* opt : cmd->get_options()) {
            if (opt->count() == 0 || opt->get_name() == "--help") continue;
            f->command += " " + opt->get_name();
            for (const auto& r : opt->results()) f->command += " " + r;
        }
        if (parallel::launched_as_mpi_job()) {
            f->command =
                fmt::format("mpirun -np {} {}", parallel::launched_process_count(), f->command);
            run_calibrate_mpi(*f);
        } else {
            run_calibrate(*f, nullptr);
        }
    });
}

}  // namespace moetron::cli
