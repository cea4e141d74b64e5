// CPU kernel throughput at training shapes: the linear layer (one GEMM), the grouped linear of the
// routed experts, and causal attention. Each reports GFLOP/s; the grouped and attention benchmarks
// also report ratio_vs_plain: their GFLOP/s over that of a plain GEMM (for the grouped one with the
// same total FLOPs: all tokens, one weight; for attention the wide MLP's up projection), timed in
// the same iterations, interleaved, so that both see the same machine load: the median of the
// per-pair ratios and their spread (ratio_min..ratio_max), over 9 pairs.
//
// BM_Bf16Gemm times the bf16 recipe's GEMMs on the native AVX512_BF16 kernel against the emulated
// recipe and float32, interleaved likewise (its comment says how).
//
// The norm kernels' AVX-512 build is timed against their AVX2 build the same way (ratio_vs_plain:
// AVX-512 GFLOP/s over AVX2 GFLOP/s, the speedup of the run-time choice), on CPUs with AVX-512.
//
// Run: build/bench/bench_kernels [--benchmark_filter=Grouped|Attention|Bf16|Norm]
//
// Shapes: `small` is configs/models/small.toml (hidden 512, dense F 1536, expert F 256, 8 heads of
// Dqk 96 / Dv 64, seq 512, 4096 tokens in a micro-batch of 8 sequences); `wide` is the larger
// style of the GEMM issue (hidden 1024, dense F 2816, expert F 704) and MLA's DeepSeek-V3 head
// dims (Dqk 192 = 128 + 64, Dv 128).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "moetron/core/arena.h"
#include "moetron/core/timer.h"
#include "moetron/kernels/backend.h"
#include "moetron/kernels/cpu/attention.h"
#include "moetron/kernels/cpu/bf16_gemm.h"
#include "moetron/kernels/cpu/blas_info.h"
#include "moetron/kernels/cpu/cpu_backend.h"
#include "moetron/kernels/cpu/matmul.h"
#include "moetron/kernels/cpu/norm_kernels_isa.h"
#include "ratio_spread.h"

namespace moetron {
namespace {

// Buffers aligned as the training arenas align every tensor (core/arena.h, kHostAlignmentBytes).
// A std::vector's large block starts 16 bytes into a cache line, which splits every 64-byte row
// load of the kernels that read rows in place (attention's backward ran 13% slower on such
// buffers) but not BLAS's, which packs its operands first: the ratios would understate the
// kernels as training runs them.
template <class T>
struct ArenaAligned {
    using value_type = T;
    ArenaAligned() = default;
    template <class U>
    explicit ArenaAligned(const ArenaAligned<U>&) {}
    T* allocate(size_t count) {
        return static_cast<T*>(
            ::operator new (count * sizeof(T), std::align_val_t{kHostAlignmentBytes}));
    }
    void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{kHostAlignmentBytes}); }
    bool operator==(const ArenaAligned&) const = default;
};
using Floats = std::vector<float, ArenaAligned<float>>;

// Deterministic values in [-0.5, 0.5), cheap enough for the ~100M-element expert weights.
Floats filled(int64_t count, uint64_t seed) {
    Floats v(static_cast<size_t>(count));
    for (size_t i = 0; i < v.size(); ++i) {
        v[i] = static_cast<float>(((i + seed) * 2654435761u) % 1024) / 1024.0f - 0.5f;
    }
    return v;
}

void set_gflops(benchmark::State& state, double flops_per_iteration) {
    state.counters["GFLOP/s"] = benchmark::Counter(flops_per_iteration * 1e-9,
                                                   benchmark::Counter::kIsIterationInvariantRate);
}

// ---- linear: y = x W^T, args (rows, in_dim, out_dim) ----

void BM_LinearForward(benchmark::State& state) {
    const int64_t rows = state.range(0), in_dim = state.range(1), out_dim = state.range(2);
    const auto inp = filled(rows * in_dim, 1), weight = filled(out_dim * in_dim, 2);
    Floats out(static_cast<size_t>(rows * out_dim));
    for (auto _ : state) {
        cpu::linear_forward(out.data(), inp.data(), weight.data(), rows, in_dim, out_dim);
        benchmark::DoNotOptimize(out.data());
    }
    set_gflops(state, 2.0 * rows * in_dim * out_dim);
}

// dinp = dout W and dW += dout^T x: twice the forward's FLOPs.
void BM_LinearBackward(benchmark::State& state) {
    const int64_t rows = state.range(0), in_dim = state.range(1), out_dim = state.range(2);
    const auto inp = filled(rows * in_dim, 1), weight = filled(out_dim * in_dim, 2),
               dout = filled(rows * out_dim, 3);
    Floats dinp(static_cast<size_t>(rows * in_dim)), dweight(weight.size(), 0.0f);
    for (auto _ : state) {
        cpu::linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                             rows, in_dim, out_dim);
        benchmark::DoNotOptimize(dweight.data());
    }
    set_gflops(state, 4.0 * rows * in_dim * out_dim);
}

// ---- grouped linear: args (tokens per expert, in_dim, out_dim) over kGroupedRows tokens ----

// Total routed rows of one grouped call; the number of experts is kGroupedRows / tokens per
// expert, so every tokens-per-expert point does the same FLOPs as one plain GEMM of these rows.
constexpr int64_t kGroupedRows = 2048;

struct GroupedProblem {
    int64_t rows_per_expert, num_experts, in_dim, out_dim;
    Floats inp, weight, dout, out, dinp, dweight;
    std::vector<int64_t> offsets;

    explicit GroupedProblem(const benchmark::State& state)
        : rows_per_expert(state.range(0)),
          num_experts(kGroupedRows / rows_per_expert),
          in_dim(state.range(1)),
          out_dim(state.range(2)),
          inp(filled(kGroupedRows * in_dim, 1)),
          weight(filled(num_experts * out_dim * in_dim, 2)),
          dout(filled(kGroupedRows * out_dim, 3)),
          out(static_cast<size_t>(kGroupedRows * out_dim)),
          dinp(static_cast<size_t>(kGroupedRows * in_dim)),
          dweight(weight.size(), 0.0f) {
        for (int64_t e = 0; e <= num_experts; ++e) offsets.push_back(e * rows_per_expert);
    }
};

// Times kernel() in the benchmark loop and plain() right after it with the clock paused: one
// interleaved pair per iteration, so that both see the same machine load. Reports the median of
// the per-pair ratios kernel GFLOP/s / plain GFLOP/s and their spread (ratio_min..ratio_max),
// and prints the same as one line after the benchmark (bench/ratio_spread.h).
template <class Kernel, class Plain>
void run_interleaved_vs_plain(benchmark::State& state, const std::string& label, double flops,
                              double plain_flops, Kernel kernel, Plain plain) {
    std::vector<double> ratios;
    ratios.reserve(static_cast<size_t>(state.max_iterations));
    double plain_total_s = 0;
    for (auto _ : state) {
        Timer timer;
        kernel();
        const double kernel_s = timer.elapsed_s();
        state.PauseTiming();
        timer.reset();
        plain();
        const double plain_s = timer.elapsed_s();
        plain_total_s += plain_s;
        ratios.push_back((flops / kernel_s) / (plain_flops / plain_s));
        state.ResumeTiming();
    }
    const bench::RatioSpread spread = bench::ratio_spread(ratios);
    set_gflops(state, flops);
    state.counters["plain_GFLOP/s"] =
        plain_flops * 1e-9 * static_cast<double>(ratios.size()) / plain_total_s;
    state.counters["ratio_vs_plain"] = spread.median;
    state.counters["ratio_min"] = spread.min;
    state.counters["ratio_max"] = spread.max;
    std::printf("%s\n", bench::format_ratio_spread(label, spread).c_str());
}

// The grouped linear against one plain GEMM of the same FLOPs (all tokens, one weight).
template <class Grouped, class Plain>
void run_grouped_vs_plain(benchmark::State& state, const char* direction, double flops,
                          Grouped grouped, Plain plain) {
    const std::string label =
        fmt::format("grouped / plain GFLOP/s, {}, {} tokens/expert, {} -> {}", direction,
                    state.range(0), state.range(1), state.range(2));
    run_interleaved_vs_plain(state, label, flops, flops, grouped, plain);
}

void BM_GroupedLinearForward(benchmark::State& state) {
    GroupedProblem p(state);
    run_grouped_vs_plain(
        state, "forward", 2.0 * kGroupedRows * p.in_dim * p.out_dim,
        [&] {
            cpu::grouped_linear_forward(p.out.data(), p.inp.data(), p.weight.data(),
                                        p.offsets.data(), p.num_experts, p.in_dim, p.out_dim);
        },
        [&] {
            cpu::linear_forward(p.out.data(), p.inp.data(), p.weight.data(), kGroupedRows, p.in_dim,
                                p.out_dim);
        });
}

void BM_GroupedLinearBackward(benchmark::State& state) {
    GroupedProblem p(state);
    run_grouped_vs_plain(
        state, "backward", 4.0 * kGroupedRows * p.in_dim * p.out_dim,
        [&] {
            cpu::grouped_linear_backward(p.dinp.data(), p.dweight.data(), p.dout.data(),
                                         p.inp.data(), p.weight.data(), p.offsets.data(),
                                         p.num_experts, p.in_dim, p.out_dim);
        },
        [&] {
            cpu::linear_backward(p.dinp.data(), p.dweight.data(), p.dout.data(), p.inp.data(),
                                 p.weight.data(), kGroupedRows, p.in_dim, p.out_dim);
        });
}

// ---- causal attention: args (batch, seq_len, heads, Dqk, Dv) ----

// Causal FLOPs: each query attends to (s + 1) keys, about S^2 / 2 pairs per (batch, head), each
// with a Dqk dot product and a Dv-wide accumulation. The backward is counted as twice the
// forward (the usual model-FLOPs convention; its recomputation of the scores is not counted).
double attention_forward_flops(const benchmark::State& state) {
    const double batch = state.range(0), seq = state.range(1), heads = state.range(2),
                 qk_dim = state.range(3), v_dim = state.range(4);
    return 2.0 * batch * heads * (seq * (seq + 1) / 2) * (qk_dim + v_dim);
}

struct AttentionProblem {
    int64_t batch, seq_len, heads, qk_dim, v_dim;
    float scale;
    Floats q, k, v, out, lse, dout, dq, dk, dv;

    explicit AttentionProblem(const benchmark::State& state)
        : batch(state.range(0)),
          seq_len(state.range(1)),
          heads(state.range(2)),
          qk_dim(state.range(3)),
          v_dim(state.range(4)),
          scale(1.0f / std::sqrt(static_cast<float>(qk_dim))),
          q(filled(batch * seq_len * heads * qk_dim, 1)),
          k(filled(batch * seq_len * heads * qk_dim, 2)),
          v(filled(batch * seq_len * heads * v_dim, 3)),
          out(static_cast<size_t>(batch * seq_len * heads * v_dim)),
          lse(static_cast<size_t>(batch * heads * seq_len)),
          dout(filled(batch * seq_len * heads * v_dim, 4)),
          dq(q.size()),
          dk(k.size()),
          dv(v.size()) {}

    void forward() {
        cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), batch, seq_len,
                               heads, qk_dim, v_dim, scale);
    }
};

// Attention's rate is compared with the plain GEMM of the wide dense MLP's up projection
// (4096 x 1024 -> 2816; forward, or its backward for the backward), interleaved.
constexpr int64_t kPlainRows = 4096, kPlainIn = 1024, kPlainOut = 2816;

struct PlainGemm {
    Floats inp = filled(kPlainRows * kPlainIn, 5), weight = filled(kPlainOut * kPlainIn, 6),
           dout = filled(kPlainRows * kPlainOut, 7),
           out = Floats(static_cast<size_t>(kPlainRows * kPlainOut)),
           dinp = Floats(static_cast<size_t>(kPlainRows * kPlainIn)),
           dweight = Floats(weight.size(), 0.0f);
    static constexpr double kForwardFlops = 2.0 * kPlainRows * kPlainIn * kPlainOut;

    void forward() {
        cpu::linear_forward(out.data(), inp.data(), weight.data(), kPlainRows, kPlainIn, kPlainOut);
    }
    void backward() {
        cpu::linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                             kPlainRows, kPlainIn, kPlainOut);
    }
};

std::string attention_label(const benchmark::State& state, const char* direction) {
    return fmt::format("attention / plain GEMM GFLOP/s, {}, B={} S={} H={} Dqk={} Dv={}", direction,
                       state.range(0), state.range(1), state.range(2), state.range(3),
                       state.range(4));
}

void BM_AttentionForward(benchmark::State& state) {
    AttentionProblem p(state);
    PlainGemm plain;
    run_interleaved_vs_plain(
        state, attention_label(state, "forward"), attention_forward_flops(state),
        PlainGemm::kForwardFlops, [&] { p.forward(); }, [&] { plain.forward(); });
}

void BM_AttentionBackward(benchmark::State& state) {
    AttentionProblem p(state);
    PlainGemm plain;
    p.forward();
    run_interleaved_vs_plain(
        state, attention_label(state, "backward"), 2.0 * attention_forward_flops(state),
        2.0 * PlainGemm::kForwardFlops,
        [&] {
            cpu::attention_backward(p.dq.data(), p.dk.data(), p.dv.data(), p.dout.data(),
                                    p.q.data(), p.k.data(), p.v.data(), p.out.data(), p.lse.data(),
                                    p.batch, p.seq_len, p.heads, p.qk_dim, p.v_dim, p.scale);
        },
        [&] { plain.backward(); });
}

// ---- the norm kernels, AVX-512 build against AVX2 build: args (rows, dim) ----

// RMSNorm's FLOPs as counted here: forward 4 per element (square, add, two multiplies),
// backward 9 (the input gradient's dot product and update, the weight gradient's sum); the
// gradient norm's sum of squares 2 per element. Only their ratio between builds matters.
struct NormProblem {
    int64_t rows, dim;
    Floats inp, weight, dout, out, rstd, dinp, dweight;
    explicit NormProblem(const benchmark::State& state)
        : rows(state.range(0)),
          dim(state.range(1)),
          inp(filled(rows * dim, 1)),
          weight(filled(dim, 2)),
          dout(filled(rows * dim, 3)),
          out(static_cast<size_t>(rows * dim)),
          rstd(static_cast<size_t>(rows)),
          dinp(static_cast<size_t>(rows * dim)),
          dweight(static_cast<size_t>(dim), 0.0f) {}
};

// The kernels of one build on the problem: which = 0 forward, 1 backward, 2 sum of squares.
void run_norm(const cpu::NormKernels& kernels, NormProblem& p, int which) {
    if (which == 0) {
        kernels.rmsnorm_forward(p.out.data(), p.rstd.data(), p.inp.data(), p.weight.data(), p.rows,
                                p.dim, 1e-6f);
    } else if (which == 1) {
        kernels.rmsnorm_backward(p.dinp.data(), p.dweight.data(), p.dout.data(), p.inp.data(),
                                 p.weight.data(), p.rstd.data(), p.rows, p.dim,
                                 cpu::kMaxNormColumnBlock);
    } else {
        benchmark::DoNotOptimize(kernels.sum_squares(p.inp.data(), p.rows * p.dim));
    }
}

void run_norm_avx512_vs_avx2(benchmark::State& state, int which, const char* what,
                             double flops_per_element) {
    if (!cpu::cpu_has_avx512()) {
        state.SkipWithError("this CPU has no AVX-512");
        return;
    }
    NormProblem p(state);
    const cpu::NormKernels avx512 = cpu::norm_kernels_avx512(), avx2 = cpu::norm_kernels_avx2();
    run_norm(avx512, p, 0);  // rstd for the backward
    const double flops = flops_per_element * static_cast<double>(p.rows * p.dim);
    run_interleaved_vs_plain(
        state, fmt::format("{} avx512 / avx2 GFLOP/s, {} x {}", what, p.rows, p.dim), flops, flops,
        [&] { run_norm(avx512, p, which); }, [&] { run_norm(avx2, p, which); });
}

void BM_NormRmsForwardAvx512VsAvx2(benchmark::State& state) {
    run_norm_avx512_vs_avx2(state, 0, "rmsnorm forward", 4.0);
}
void BM_NormRmsBackwardAvx512VsAvx2(benchmark::State& state) {
    run_norm_avx512_vs_avx2(state, 1, "rmsnorm backward", 9.0);
}
void BM_NormSumSquaresAvx512VsAvx2(benchmark::State& state) {
    run_norm_avx512_vs_avx2(state, 2, "sum_squares", 2.0);
}

// Real time: the kernels use every core, so the main thread's CPU time would mislead.
#define MOETRON_BENCH(fn) BENCHMARK(fn)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.3)

// Linear: small dense MLP up (4096 x 512 -> 1536) and down, and the wide MLP up
// (4096 x 1024 -> 2816).
MOETRON_BENCH(BM_LinearForward)
    ->ArgNames({"rows", "in", "out"})
    ->Args({4096, 512, 1536})
    ->Args({4096, 1536, 512})
    ->Args({4096, 1024, 2816});
MOETRON_BENCH(BM_LinearBackward)
    ->ArgNames({"rows", "in", "out"})
    ->Args({4096, 512, 1536})
    ->Args({4096, 1024, 2816});

// Grouped: a fixed number of interleaved grouped/plain pairs (above bench::kMinRatioPairs), so
// that each ratio is a median over as many pairs whatever the shape's speed.
constexpr int kGroupedPairs = 9;
static_assert(kGroupedPairs >= static_cast<int>(bench::kMinRatioPairs));
// Grouped: 16, 64 and 256 tokens per expert (small.toml averages 4096 x top-4 / 32 = 512) for the
// wide expert projection (1024 -> 704) and the small one (512 -> 256).
BENCHMARK(BM_GroupedLinearForward)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(kGroupedPairs)
    ->ArgNames({"tokens_per_expert", "in", "out"})
    ->Args({16, 1024, 704})
    ->Args({64, 1024, 704})
    ->Args({256, 1024, 704})
    ->Args({16, 512, 256})
    ->Args({64, 512, 256})
    ->Args({256, 512, 256});
BENCHMARK(BM_GroupedLinearBackward)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(kGroupedPairs)
    ->ArgNames({"tokens_per_expert", "in", "out"})
    ->Args({16, 1024, 704})
    ->Args({64, 1024, 704})
    ->Args({256, 1024, 704})
    ->Args({64, 512, 256})
    ->Args({256, 512, 256});

// Attention: small (8 x 512 tokens, 8 heads of 96 / 64) and DeepSeek-V3 head dims (2 x 1024
// tokens, 8 heads of 192 / 128).
// Interleaved with the plain GEMM, kGroupedPairs pairs each.
BENCHMARK(BM_AttentionForward)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(kGroupedPairs)
    ->ArgNames({"B", "S", "H", "Dqk", "Dv"})
    ->Args({8, 512, 8, 96, 64})
    ->Args({2, 1024, 8, 192, 128});
BENCHMARK(BM_AttentionBackward)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(kGroupedPairs)
    ->ArgNames({"B", "S", "H", "Dqk", "Dv"})
    ->Args({8, 512, 8, 96, 64})
    ->Args({2, 1024, 8, 192, 128});

// ---- the bf16 recipe: the native AVX512_BF16 GEMM against the emulation and float32 ----

// A linear layer's forward and backward (rows, in, out), or with experts > 0 the grouped one of
// `experts` experts of `rows` tokens each, run three ways per iteration, interleaved: the bf16
// recipe on the native kernel (kernels/cpu/bf16_gemm.h), the same recipe emulated (inputs
// rounded to bfloat16, then the float32 GEMM: MOETRON_BF16_GEMM=emulated) and plain float32.
// Reports native_vs_emulated and native_vs_fp32: the medians of the per-iteration speed ratios,
// with their spreads (printed as bench/ratio_stats.py does). Skipped without AVX512_BF16.
void BM_Bf16Gemm(benchmark::State& state) {
    if (!cpu::cpu_has_avx512_bf16()) {
        state.SkipWithError("this CPU has no AVX512_BF16");
        return;
    }
    const int64_t rows = state.range(0), experts = state.range(1);
    const int64_t in_dim = state.range(2), out_dim = state.range(3);
    const int64_t total_rows = experts > 0 ? rows * experts : rows;
    const int64_t weight_count = (experts > 0 ? experts : 1) * out_dim * in_dim;
    const auto inp = filled(total_rows * in_dim, 1), weight = filled(weight_count, 2),
               dout = filled(total_rows * out_dim, 3);
    std::vector<float> out(static_cast<size_t>(total_rows * out_dim)),
        dinp(static_cast<size_t>(total_rows * in_dim)), dweight(weight.size(), 0.0f);
    std::vector<int64_t> offsets(static_cast<size_t>(experts + 1));
    for (int64_t e = 0; e <= experts; ++e) offsets[e] = e * rows;
    const std::unique_ptr<Backend> native = make_cpu_backend({cpu::Bf16Gemm::native});
    const std::unique_ptr<Backend> emulated = make_cpu_backend({cpu::Bf16Gemm::emulated});
    auto forward_backward = [&](Backend& ops, Precision format) {
        const GemmPrecision gemm{format};
        if (experts > 0) {
            ops.grouped_linear_forward(out.data(), inp.data(), weight.data(), offsets.data(),
                                       experts, in_dim, out_dim, gemm);
            ops.grouped_linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(),
                                        weight.data(), offsets.data(), experts, in_dim, out_dim,
                                        gemm);
        } else {
            ops.linear_forward(out.data(), inp.data(), weight.data(), rows, in_dim, out_dim, gemm);
            ops.linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                                rows, in_dim, out_dim, gemm);
        }
        benchmark::DoNotOptimize(dweight.data());
    };
    std::vector<double> vs_emulated, vs_fp32;
    for (auto _ : state) {
        Timer timer;
        forward_backward(*native, Precision::bf16);
        const double native_s = timer.elapsed_s();
        state.PauseTiming();
        timer.reset();
        forward_backward(*emulated, Precision::bf16);
        const double emulated_s = timer.elapsed_s();
        timer.reset();
        forward_backward(cpu_backend(), Precision::fp32);
        const double fp32_s = timer.elapsed_s();
        vs_emulated.push_back(emulated_s / native_s);
        vs_fp32.push_back(fp32_s / native_s);
        state.ResumeTiming();
    }
    set_gflops(state, 6.0 * total_rows * in_dim * out_dim);
    const bench::RatioSpread emulated_spread = bench::ratio_spread(vs_emulated);
    const bench::RatioSpread fp32_spread = bench::ratio_spread(vs_fp32);
    state.counters["native_vs_emulated"] = emulated_spread.median;
    state.counters["native_vs_fp32"] = fp32_spread.median;
    const std::string shape = experts > 0 ? fmt::format("{} experts x {} tokens, {} -> {}", experts,
                                                        rows, in_dim, out_dim)
                                          : fmt::format("{} rows, {} -> {}", rows, in_dim, out_dim);
    std::printf("%s\n", bench::format_ratio_spread("bf16 native / emulated speed, forward + "
                                                   "backward, " +
                                                       shape,
                                                   emulated_spread)
                            .c_str());
    std::printf("%s\n", bench::format_ratio_spread(
                            "bf16 native / fp32 speed, forward + backward, " + shape, fp32_spread)
                            .c_str());
}

// small.toml's GEMMs at 4096 tokens (8 sequences of 512): the dense MLP's up (512 -> 2 x 1152)
// and down projections, MLA's q_b (192 -> 8 heads x 96), and the routed experts (512 -> 2 x 128)
// at small's mean load of 4096 x top-4 / 32 = 512 tokens per expert.
BENCHMARK(BM_Bf16Gemm)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(kGroupedPairs)
    ->ArgNames({"rows", "experts", "in", "out"})
    ->Args({4096, 0, 512, 2304})
    ->Args({4096, 0, 1152, 512})
    ->Args({4096, 0, 192, 768})
    ->Args({512, 32, 512, 256});

// Norms: `small`'s hidden norm (4096 tokens x 512) and its kv_lora norm (x 128); the sum of
// squares over 4M floats (a large gradient). More pairs than the GEMMs: each takes a millisecond.
constexpr int kNormPairs = 31;
void rmsnorm_shapes(benchmark::internal::Benchmark* b) {
    b->UseRealTime()
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(kNormPairs)
        ->ArgNames({"rows", "dim"})
        ->Args({4096, 512})
        ->Args({4096, 128});
}
BENCHMARK(BM_NormRmsForwardAvx512VsAvx2)->Apply(rmsnorm_shapes);
BENCHMARK(BM_NormRmsBackwardAvx512VsAvx2)->Apply(rmsnorm_shapes);
BENCHMARK(BM_NormSumSquaresAvx512VsAvx2)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(kNormPairs)
    ->ArgNames({"rows", "dim"})
    ->Args({4096, 1024});

}  // namespace
}  // namespace moetron

BENCHMARK_MAIN();
