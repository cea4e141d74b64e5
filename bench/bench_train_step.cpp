// One full training step (forward, backward, clipping, AdamW, router bias update) of a model
// preset, by default configs/models/small.toml at its [train] batch and sequence length, on
// random tokens. Reports tokens/s, model GFLOP/s (model/flops.h, Megatron-LM's convention) and
// MFU against this machine's sgemm peak measured in the same process, then prints one JSON line
// (the format of bench/pytorch_step.py) for bench/compare_pytorch.sh.
//
//   build/bench/bench_train_step [--config PATH] [--batch-size B] [--seq-len S] [--threads T]
//                                [--steps N] [--no-mtp] [--no-balance] [--profile-ops]
//                                [--precision fp32|bf16|mxfp8|fp8-blockwise] [benchmark flags]
//
// --profile-ops runs the steps through a ProfilingBackend (kernels/profiling_backend.h) and
// prints, after them, where a step's time goes: per category and per op, ms per step, % of the
// step and calls per step.
// --precision runs the linear layers' and experts' GEMMs (and under bf16 the output head's) in
// that format, as `moetron train --precision` does (model/compute.h; bf16 is native on CPUs with
// AVX512_BF16). MFU counts a bf16 GEMM's FLOPs as model FLOPs against the
// float32 sgemm peak, so it can pass 1.
// --no-mtp drops the MTP module and --no-balance the balance loss and the router bias update, to
// match Hugging Face's DeepseekV3ForCausalLM, which has neither.
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "moetron/checkpoint/train_config.h"
#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/core/timer.h"
#include "moetron/kernels/profiling_backend.h"
#include "moetron/model/config.h"
#include "moetron/train/compute_stack.h"
#include "moetron/train/data_loader.h"
#include "moetron/train/metrics.h"
#include "moetron/train/preset_path.h"
#include "moetron/train/run_plan.h"
#include "moetron/train/trainer.h"

namespace moetron {
namespace {

struct BenchOptions {
    std::string config_path;
    int64_t batch_size = 0;  // 0: the preset's
    int64_t seq_len = 0;
    int threads = 0;  // 0: OMP_NUM_THREADS or all cores
    int64_t steps = 5;
    bool mtp = true;
    bool balance = true;
    bool profile_ops = false;
    std::string precision = "fp32";
};

// Our flags; everything else is left for Google Benchmark.
BenchOptions parse_options(int& argc, char** argv) {
    BenchOptions o;
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            MT_CHECK(i + 1 < argc, "[bench] {} needs a value", arg);
            return argv[++i];
        };
        if (arg == "--config") {
            o.config_path = value();
        } else if (arg == "--batch-size") {
            o.batch_size = std::stoll(value());
        } else if (arg == "--seq-len") {
            o.seq_len = std::stoll(value());
        } else if (arg == "--threads") {
            o.threads = std::stoi(value());
        } else if (arg == "--steps") {
            o.steps = std::stoll(value());
        } else if (arg == "--no-mtp") {
            o.mtp = false;
        } else if (arg == "--no-balance") {
            o.balance = false;
        } else if (arg == "--profile-ops") {
            o.profile_ops = true;
        } else if (arg == "--precision") {
            o.precision = value();
        } else {
            argv[kept++] = argv[i];
        }
    }
    argc = kept;
    return o;
}

struct Result {
    std::vector<double> step_s;
};

int run(int argc, char** argv) {
    const BenchOptions o = parse_options(argc, argv);
    if (o.threads > 0) {
        omp_set_num_threads(o.threads);
    }
    const std::string config_path = o.config_path.empty() ? find_preset("small") : o.config_path;
    ModelConfig model = load_model_config(config_path);
    TrainConfig c = load_train_config(config_path);
    if (o.batch_size > 0) c.batch_size = o.batch_size;
    if (o.seq_len > 0) c.seq_len = o.seq_len;
    if (!o.mtp) model.num_nextn_predict_layers = 0;
    if (!o.balance) {
        c.balance_loss_alpha = 0;
        c.bias_update_speed = 0;
    }
    c.grad_accum = 1;
    c.steps = 1 << 30;  // the schedule never reaches its end here
    c.eval_batches = 1;

    // Random tokens, as bench/pytorch_step.py uses: throughput does not depend on the text.
    const int64_t num_tokens = std::max<int64_t>(8 * c.batch_size * (c.seq_len + 1), 1 << 16);
    std::vector<int32_t> tokens(static_cast<size_t>(num_tokens));
    RngStream rng(c.seed, /*stream_id=*/0xBE7C);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.next_below(model.vocab_size));
    DataLoader loader(std::move(tokens), "random", model.vocab_size, c.seq_len, 0.1, c.seed);
    // The same plan and compute stack as `moetron train` (train/run_plan.h,
    // train/compute_stack.h): one process, the recipe on each GEMM call, the tokens dispatched
    // in the recipe's format, the profiler over the run's backend.
    RunSettings settings;
    settings.precision = parse_precision(o.precision);
    const RunPlan plan = plan_run(model, c, settings, /*world_size=*/1);
    ComputeStack compute(o.profile_ops);
    Trainer trainer(model, c, std::move(loader), plan, /*world=*/nullptr, compute.ops());
    const double peak_gflops = measure_gemm_peak_gflops();
    trainer.set_gemm_peak_gflops(peak_gflops);
    const int threads = omp_get_max_threads();
    std::printf(
        "bench_train_step: %s\n  %s\n  batch %lld x seq %lld = %lld tokens/step, %d "
        "thread(s), %.3f model GFLOP/step, sgemm peak %.1f GFLOP/s, %.2fM params\n",
        config_path.c_str(), describe_model_config(model).c_str(),
        static_cast<long long>(c.batch_size), static_cast<long long>(c.seq_len),
        static_cast<long long>(c.tokens_per_step()), threads, trainer.model_flops_per_step() / 1e9,
        peak_gflops, static_cast<double>(trainer.model().num_params()) / 1e6);
    std::printf("  backend %s\n", compute.describe(plan.precision).c_str());
    std::fflush(stdout);

    trainer.step();  // warm-up: first touch of activations, thread pools
    if (compute.profiler() != nullptr) compute.profiler()->reset();
    Result result;
    result.step_s.reserve(static_cast<size_t>(o.steps) + 64);
    const double tokens_per_step = static_cast<double>(c.tokens_per_step());
    const double flops_per_step = trainer.model_flops_per_step();
    benchmark::RegisterBenchmark(
        "TrainStep",
        [&](benchmark::State& state) {
            for (auto _ : state) {
                const Timer t;
                benchmark::DoNotOptimize(trainer.step());
                result.step_s.push_back(t.elapsed_s());
            }
            state.counters["tokens/s"] =
                benchmark::Counter(tokens_per_step, benchmark::Counter::kIsIterationInvariantRate);
            state.counters["GFLOP/s"] = benchmark::Counter(
                flops_per_step * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
        })
        ->Iterations(o.steps)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();

    MT_CHECK(!result.step_s.empty(), "[bench] no step ran (filtered out?)");
    double total_s = 0;
    for (double s : result.step_s) total_s += s;
    std::vector<double> sorted = result.step_s;
    std::sort(sorted.begin(), sorted.end());
    const auto n = static_cast<double>(result.step_s.size());
    const double gflops = n * flops_per_step / total_s / 1e9;
    std::printf(
        "%s\n",
        fmt::format("{{\"impl\": \"moetron\", \"tokens_per_s\": {:.1f}, \"model_gflops_per_s\": "
                    "{:.2f}, \"mfu\": {:.4f}, \"gemm_peak_gflops\": {:.1f}, \"batch\": {}, "
                    "\"seq\": {}, \"threads\": {}, \"model\": \"{}\", \"params\": {}, "
                    "\"step_ms_median\": {:.2f}, \"steps\": {}, \"mtp\": {}, "
                    "\"balance\": {}, \"precision\": \"{}\"}}",
                    n * tokens_per_step / total_s, gflops, gflops / peak_gflops, peak_gflops,
                    c.batch_size, c.seq_len, threads, model.name, trainer.model().num_params(),
                    1e3 * sorted[sorted.size() / 2], result.step_s.size(), o.mtp, o.balance,
                    o.precision)
            .c_str());
    if (compute.profiler() != nullptr) {
        std::printf("%s", format_op_profile(*compute.profiler(),
                                            static_cast<int64_t>(result.step_s.size()), total_s)
                              .c_str());
    }
    return 0;
}

}  // namespace
}  // namespace moetron

int main(int argc, char** argv) {
    try {
        return moetron::run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_train_step: error: %s\n", e.what());
        return 1;
    }
}
