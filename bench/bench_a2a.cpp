// Communication benchmarks under mpirun (bench/run_a2a.sh), in nccl-tests' language:
//   size  = bytes each rank sends in one all_to_all_v (split evenly over the ranks)
//   algbw = size / time,  busbw = algbw * (n - 1) / n
// time is the slowest rank's time of one call, after a barrier.
//  - A2A/moetron: Communicator::all_to_all_v (MPI_Ialltoallv + polled wait, with timeout).
//  - A2A/moetron_no_progress_thread: the same without the progress thread.
//  - A2A/mpi:     a plain MPI_Alltoallv on the same bytes: the baseline.
//  - Progress/thread:{0,1}: a 16 MiB all_reduce posted before 50 ms of computation without MPI
//    calls; the time wait() takes afterwards, without and with the progress thread.
// Iteration counts are fixed so that every rank runs the same collectives; only rank 0 reports.
// The MoE dispatch itself (flat against two-tier, bytes per tier) is `moetron bench a2a`.
#include <benchmark/benchmark.h>

#include <cstdio>

#if MOETRON_HAVE_MPI

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moetron/core/timer.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/mpi_check.h"

namespace {

using moetron::DType;
using moetron::kHostStream;
using moetron::Timer;
using moetron::parallel::Communicator;

// Even split of `bytes` floats over the ranks: counts and displacements in floats.
struct EvenExchange {
    std::vector<int> counts, displs;
    std::vector<float> send, recv;
    EvenExchange(size_t bytes, int ranks) : counts(ranks), displs(ranks) {
        const int per_rank = static_cast<int>(bytes / sizeof(float) / static_cast<size_t>(ranks));
        for (int p = 0; p < ranks; ++p) {
            counts[p] = per_rank;
            displs[p] = p * per_rank;
        }
        send.assign(static_cast<size_t>(per_rank) * ranks, 1.0f);
        recv.assign(send.size(), 0.0f);
    }
    size_t bytes() const { return send.size() * sizeof(float); }
};

double slowest(double seconds, MPI_Comm comm) {
    double max_s = 0;
    MPI_CHECK(MPI_Allreduce(&seconds, &max_s, 1, MPI_DOUBLE, MPI_MAX, comm));
    return max_s;
}

struct Figures {
    double busbw_gbps = 0;
};

void report_bandwidth(benchmark::State& state, size_t bytes, double total_s, int ranks,
                      Figures& figures) {
    const double algbw =
        static_cast<double>(bytes) * static_cast<double>(state.iterations()) / total_s / 1e9;
    const double busbw = algbw * (ranks - 1) / ranks;
    state.counters["size_bytes"] = static_cast<double>(bytes);
    state.counters["algbw_GBps"] = algbw;
    state.counters["busbw_GBps"] = busbw;
    figures.busbw_gbps = busbw;
}

void a2a_moetron(benchmark::State& state, Communicator& comm, MPI_Comm timing, size_t bytes,
                 Figures& figures) {
    EvenExchange x(bytes, comm.size());
    double total_s = 0;
    for (auto _ : state) {
        MPI_CHECK(MPI_Barrier(timing));
        const Timer t;
        comm.all_to_all_v(x.recv.data(), x.counts, x.displs, x.send.data(), x.counts, x.displs,
                          kHostStream);
        const double s = slowest(t.elapsed_s(), timing);
        state.SetIterationTime(s);
        total_s += s;
    }
    report_bandwidth(state, x.bytes(), total_s, comm.size(), figures);
}

void a2a_mpi(benchmark::State& state, MPI_Comm comm, MPI_Comm timing, size_t bytes,
             Figures& figures) {
    int ranks = 1;
    MPI_CHECK(MPI_Comm_size(comm, &ranks));
    EvenExchange x(bytes, ranks);
    double total_s = 0;
    for (auto _ : state) {
        MPI_CHECK(MPI_Barrier(timing));
        const Timer t;
        MPI_CHECK(MPI_Alltoallv(x.send.data(), x.counts.data(), x.displs.data(), MPI_FLOAT,
                                x.recv.data(), x.counts.data(), x.displs.data(), MPI_FLOAT, comm));
        const double s = slowest(t.elapsed_s(), timing);
        state.SetIterationTime(s);
        total_s += s;
    }
    report_bandwidth(state, x.bytes(), total_s, ranks, figures);
}

// Busy arithmetic for `seconds`, no MPI calls.
void compute_for(double seconds) {
    const Timer t;
    double acc = 0;
    while (t.elapsed_s() < seconds)
        for (int i = 0; i < 10000; ++i) acc += std::sqrt(static_cast<double>(i));
    benchmark::DoNotOptimize(acc);
}

void progress(benchmark::State& state, Communicator& comm, MPI_Comm timing, double& wait_ms) {
    constexpr size_t kCount = size_t{4} << 20;  // 16 MiB of floats
    constexpr double kComputeS = 0.05;
    std::vector<float> data(kCount, 1.0f);
    double total_wait_s = 0;
    for (auto _ : state) {
        MPI_CHECK(MPI_Barrier(timing));
        const Timer t;
        moetron::parallel::CollectiveHandle h =
            comm.all_reduce_sum_async(data.data(), kCount, DType::f32, kHostStream);
        compute_for(kComputeS);
        const Timer w;
        h.wait();
        total_wait_s += slowest(w.elapsed_s(), timing);
        state.SetIterationTime(slowest(t.elapsed_s(), timing));
    }
    wait_ms = total_wait_s / static_cast<double>(state.iterations()) * 1e3;
    state.counters["compute_ms"] = kComputeS * 1e3;
    state.counters["wait_after_compute_ms"] = wait_ms;
}

class NullReporter : public benchmark::BenchmarkReporter {
  public:
    bool ReportContext(const Context&) override { return true; }
    void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
    using namespace moetron::parallel;
    MpiSession session(&argc, &argv);
    try {
        benchmark::Initialize(&argc, argv);
        CommunicatorOptions with_thread, without_thread;
        without_thread.progress_thread = false;
        std::unique_ptr<Communicator> world = make_mpi_world(session, with_thread);
        std::unique_ptr<Communicator> world_no_thread = make_mpi_world(session, without_thread);
        MPI_Comm plain = MPI_COMM_NULL, timing = MPI_COMM_NULL;
        MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &plain));
        MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &timing));
        const int ranks = world->size();

        const std::vector<size_t> sizes = {size_t{64} << 10, size_t{1} << 20, size_t{8} << 20,
                                           size_t{32} << 20};
        std::map<size_t, Figures> ours, ours_no_thread, baseline;
        for (size_t bytes : sizes) {
            const int64_t iterations =
                std::clamp<int64_t>(static_cast<int64_t>((size_t{256} << 20) / bytes), 10, 400);
            const std::string mpi_name = fmt::format("A2A/mpi/{}KiB", bytes >> 10);
            const std::string ours_name = fmt::format("A2A/moetron/{}KiB", bytes >> 10);
            const std::string ours_name_no_thread =
                fmt::format("A2A/moetron_no_progress_thread/{}KiB", bytes >> 10);
            benchmark::RegisterBenchmark(mpi_name.c_str(),
                                         [&, bytes](benchmark::State& s) {
                                             a2a_mpi(s, plain, timing, bytes, baseline[bytes]);
                                         })
                ->Iterations(iterations)
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
            benchmark::RegisterBenchmark(ours_name.c_str(),
                                         [&, bytes](benchmark::State& s) {
                                             a2a_moetron(s, *world, timing, bytes, ours[bytes]);
                                         })
                ->Iterations(iterations)
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
            benchmark::RegisterBenchmark(ours_name_no_thread.c_str(),
                                         [&, bytes](benchmark::State& s) {
                                             a2a_moetron(s, *world_no_thread, timing, bytes,
                                                         ours_no_thread[bytes]);
                                         })
                ->Iterations(iterations)
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
        }
        double wait_without_ms = 0, wait_with_ms = 0;
        benchmark::RegisterBenchmark(
            "Progress/thread:0",
            [&](benchmark::State& s) { progress(s, *world_no_thread, timing, wait_without_ms); })
            ->Iterations(10)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark(
            "Progress/thread:1",
            [&](benchmark::State& s) { progress(s, *world, timing, wait_with_ms); })
            ->Iterations(10)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);

        if (world->rank() == 0) {
            benchmark::RunSpecifiedBenchmarks();
            std::printf(
                "\nall_to_all_v on %d ranks, busbw (GB/s): moetron (with / without the progress "
                "thread) vs plain MPI_Alltoallv\n",
                ranks);
            for (size_t bytes : sizes) {
                if (!ours.count(bytes) || !baseline.count(bytes)) continue;
                const double a = ours[bytes].busbw_gbps, b = baseline[bytes].busbw_gbps;
                const double c = ours_no_thread[bytes].busbw_gbps;
                std::printf("  %8zu KiB  moetron %7.3f / %7.3f  mpi %7.3f  ratio %.2f / %.2f\n",
                            bytes >> 10, a, c, b, b > 0 ? a / b : 0.0, b > 0 ? c / b : 0.0);
            }
            std::printf(
                "progress: wait after 50 ms of compute: %.2f ms without the thread, %.2f "
                "ms with it\n",
                wait_without_ms, wait_with_ms);
        } else {
            NullReporter quiet;
            benchmark::RunSpecifiedBenchmarks(&quiet);
        }
        benchmark::Shutdown();
        MPI_CHECK(MPI_Comm_free(&plain));
        MPI_CHECK(MPI_Comm_free(&timing));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_a2a: %s\n", e.what());
        MpiSession::abort_job(1);
    }
    return 0;
}

#else  // built without MPI

int main() {
    std::printf("bench_a2a: moetron was built without MPI; nothing to measure\n");
    return 0;
}

#endif
