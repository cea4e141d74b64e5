// The measurements of calibrate.h: each shape is warmed up once, then repeated for at least
// options.seconds_per_point (and three times); the mean time per call is kept (see mean_time_s).
// The compute kernels are measured in options.rounds rounds and each keeps its median.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "moetron/calibrate/calibrate.h"
#include "moetron/core/error.h"
#include "moetron/core/timer.h"
#include "moetron/kernels/backend.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/grad_sync.h"

namespace moetron::calibrate {

namespace {

// Mean seconds of one call of fn over a window of at least `seconds` (and three calls). The
// mean, not the median or the best: a training step is a sum of many calls, and on a shared or
// oversubscribed machine (more ranks than cores) the calls a rank loses to time-slicing belong
// in its rate; a median of short calls would skip them.
double mean_time_s(const std::function<void()>& fn, double seconds) {
    fn();  // warm-up: first touch, thread pool
    int64_t calls = 0;
    const Timer total;
    while (calls < 3 || total.elapsed_s() < seconds) {
        fn();
        ++calls;
    }
    return total.elapsed_s() / static_cast<double>(calls);
}

std::vector<float> filled(int64_t count, float value) {
    return std::vector<float>(static_cast<size_t>(count), value);
}

// Deterministic values in [-1, 1): keeps exp and the GEMMs away from denormals.
std::vector<float> pattern(int64_t count, float scale) {
    std::vector<float> v(static_cast<size_t>(count));
    for (size_t i = 0; i < v.size(); ++i) {
        v[i] = scale * (static_cast<float>((i * 2654435761u) % 2048u) / 1024.0f - 1.0f);
    }
    return v;
}

// Operands cycled through cold copies whatever their size (gemm_operand_copies without L2).
int64_t cold_copies(double bytes, bool quick) {
    return gemm_operand_copies(bytes, /*threads=*/1, /*l2_bytes=*/0, quick);
}

// forward + backward (dgrad, wgrad) of a linear layer: 6 m n k FLOPs, the three GEMMs the sim
// prices with this shape's curve. Operands are where a training step finds them
// (gemm_operand_copies).
GemmPoint measure_gemm(int64_t m, int64_t n, int64_t k, int threads, int64_t l2_bytes,
                       double seconds, bool quick) {
    const int64_t per_set = 2 * m * k + 2 * n * k + 2 * m * n;
    const int64_t copies =
        gemm_operand_copies(4.0 * static_cast<double>(per_set), threads, l2_bytes, quick);
    auto inp = pattern(copies * m * k, 0.5f), w = pattern(copies * n * k, 0.05f);
    auto out = filled(copies * m * n, 0), dout = pattern(copies * m * n, 0.1f);
    auto dinp = filled(copies * m * k, 0), dw = filled(copies * n * k, 0);
    int64_t c = 0;
    const double s = mean_time_s(
        [&] {
            c = (c + 1) % copies;
            cpu_backend().linear_forward(out.data() + c * m * n, inp.data() + c * m * k,
                                         w.data() + c * n * k, m, k, n, kFp32Gemm);
            cpu_backend().linear_backward(dinp.data() + c * m * k, dw.data() + c * n * k,
                                          dout.data() + c * m * n, inp.data() + c * m * k,
                                          w.data() + c * n * k, m, k, n, kFp32Gemm);
        },
        seconds);
    const double flops =
        6.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    return {m, n, k, flops / s / 1e9};
}

GroupedPoint measure_grouped(int64_t tokens_per_expert, int64_t experts, int64_t n, int64_t k,
                             double seconds, bool quick) {
    const int64_t rows = tokens_per_expert * experts;
    std::vector<int64_t> offsets(static_cast<size_t>(experts) + 1);
    for (int64_t e = 0; e <= experts; ++e) offsets[static_cast<size_t>(e)] = e * tokens_per_expert;
    const int64_t per_set = 2 * rows * k + 2 * experts * n * k + 2 * rows * n;
    const int64_t copies = cold_copies(4.0 * static_cast<double>(per_set), quick);
    auto inp = pattern(copies * rows * k, 0.5f), w = pattern(copies * experts * n * k, 0.05f);
    auto out = filled(copies * rows * n, 0), dout = pattern(copies * rows * n, 0.1f);
    auto dinp = filled(copies * rows * k, 0), dw = filled(copies * experts * n * k, 0);
    int64_t c = 0;
    const double s = mean_time_s(
        [&] {
            c = (c + 1) % copies;
            const int64_t a = c * rows * k, o = c * rows * n, wo = c * experts * n * k;
            cpu_backend().grouped_linear_forward(out.data() + o, inp.data() + a, w.data() + wo,
                                                 offsets.data(), experts, k, n, kFp32Gemm);
            cpu_backend().grouped_linear_backward(dinp.data() + a, dw.data() + wo, dout.data() + o,
                                                  inp.data() + a, w.data() + wo, offsets.data(),
                                                  experts, k, n, kFp32Gemm);
        },
        seconds);
    const double flops =
        6.0 * static_cast<double>(rows) * static_cast<double>(n) * static_cast<double>(k);
    return {tokens_per_expert, experts, n, k, flops / s / 1e9};
}

AttentionPoint measure_attention(int64_t b, int64_t s, int64_t h, int64_t dq, int64_t dv,
                                 double seconds) {
    auto q = pattern(b * s * h * dq, 0.5f), kk = pattern(b * s * h * dq, 0.5f);
    auto v = pattern(b * s * h * dv, 0.5f), dout = pattern(b * s * h * dv, 0.1f);
    auto out = filled(b * s * h * dv, 0), lse = filled(b * h * s, 0);
    auto dq_ = filled(b * s * h * dq, 0), dk = filled(b * s * h * dq, 0);
    auto dv_ = filled(b * s * h * dv, 0);
    const float scale = 1.0f / std::sqrt(static_cast<float>(dq));
    const double fwd_s = mean_time_s(
        [&] {
            cpu_backend().attention_forward(out.data(), lse.data(), q.data(), kk.data(), v.data(),
                                            b, s, h, dq, dv, scale);
        },
        seconds);
    const double bwd_s = mean_time_s(
        [&] {
            cpu_backend().attention_backward(dq_.data(), dk.data(), dv_.data(), dout.data(),
                                             q.data(), kk.data(), v.data(), out.data(), lse.data(),
                                             b, s, h, dq, dv, scale);
        },
        seconds);
    // The sim's convention (sim/ops.cpp attn.core): causal pairs B S^2 / 2 per head, 2 FLOPs per
    // multiply-add over Dqk + Dv; the backward executes 2.5x the forward.
    const double fwd_flops = 2.0 * static_cast<double>(b) * static_cast<double>(s * s) / 2 *
                             static_cast<double>(h) * static_cast<double>(dq + dv);
    return {b, s, h, dq, dv, fwd_flops / fwd_s / 1e9, 2.5 * fwd_flops / bwd_s / 1e9};
}

double measure_stream_gbytes_per_s(int64_t count, double seconds) {
    auto a = filled(count, 0), b = pattern(count, 1.0f), c = pattern(count, 0.5f);
    const double s = mean_time_s(
        [&] { cpu_backend().stream_triad(a.data(), b.data(), c.data(), 0.5f, count); }, seconds);
    return 12.0 * static_cast<double>(count) / s / 1e9;
}

// The engine's own memory-bound kernels, forward + backward, at one size (MemoryKernelsPoint).
MemoryKernelsPoint measure_memory_kernels(int64_t rows, int64_t dim, int64_t ffn, double seconds) {
    auto x = pattern(rows * dim, 1.0f), w = pattern(dim, 1.0f), y = filled(rows * dim, 0);
    auto rstd = filled(rows, 0), dy = pattern(rows * dim, 0.1f), dx = filled(rows * dim, 0);
    auto dw = filled(dim, 0);
    auto h = pattern(rows * 2 * ffn, 1.0f), a = filled(rows * ffn, 0);
    auto da = pattern(rows * ffn, 0.1f), dh = filled(rows * 2 * ffn, 0);
    const double s = mean_time_s(
        [&] {
            cpu_backend().rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, dim,
                                          1e-6f);
            cpu_backend().rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(),
                                           rstd.data(), rows, dim);
            cpu_backend().swiglu_forward(a.data(), h.data(), rows, ffn);
            cpu_backend().swiglu_backward(dh.data(), da.data(), h.data(), rows, ffn);
        },
        seconds);
    MemoryKernelsPoint p{rows, dim, ffn, 0};
    p.gbytes_per_s = p.bytes() / s / 1e9;
    return p;
}

double measure_exp_per_s(int64_t count, double seconds) {
    auto in = pattern(count, 4.0f), out = filled(count, 0);
    const double s =
        mean_time_s([&] { cpu_backend().exp_elementwise(out.data(), in.data(), count); }, seconds);
    return static_cast<double>(count) / s;
}

double measure_call_overhead_s() {
    constexpr int kCalls = 2000;
    const double s = mean_time_s(
        [&] {
            for (int i = 0; i < kCalls; ++i) cpu_backend().empty_launch();
        },
        0.02);
    return s / kCalls;
}

}  // namespace

double MemoryKernelsPoint::bytes() const {
    // rmsnorm: forward reads x, writes y (2 dim a row); backward reads x and dy, writes dx (3).
    // SwiGLU: forward reads h (2 ffn), writes a (1); backward reads h and da (3), writes dh (2).
    return 4.0 * static_cast<double>(rows) *
           (5.0 * static_cast<double>(dim) + 8.0 * static_cast<double>(ffn));
}

int64_t gemm_operand_copies(double bytes, int threads, int64_t l2_bytes, bool quick) {
    if (threads == 1 && bytes <= static_cast<double>(l2_bytes)) return 1;
    const double total = (quick ? 1.0 : 64.0) * 1024 * 1024;
    return std::clamp<int64_t>(static_cast<int64_t>(total / std::max(bytes, 1.0)), 1, 64);
}

namespace {

ComputeMeasurements measure_compute_round(const CalibrateOptions& o) {
    ComputeMeasurements r;
    r.threads = omp_get_max_threads();
    r.l2_bytes = std::max<int64_t>(0, sysconf(_SC_LEVEL2_CACHE_SIZE));
    const double t = o.seconds_per_point;
    const std::vector<int64_t> ms =
        o.quick ? std::vector<int64_t>{32, 256} : std::vector<int64_t>{128, 512, 2048};
    const std::vector<int64_t> ns =
        o.quick ? std::vector<int64_t>{32, 128} : std::vector<int64_t>{32, 128, 512, 2048};
    const std::vector<int64_t> ks =
        o.quick ? std::vector<int64_t>{32, 128} : std::vector<int64_t>{32, 128, 512};
    for (int64_t m : ms) {
        for (int64_t n : ns) {
            for (int64_t k : ks) {
                r.gemm.push_back(measure_gemm(m, n, k, r.threads, r.l2_bytes, t, o.quick));
            }
        }
    }
    // A vocabulary-sized output head (n = 8192).
    if (!o.quick) r.gemm.push_back(measure_gemm(512, 8192, 512, r.threads, r.l2_bytes, t, o.quick));
    const std::vector<int64_t> tpe =
        o.quick ? std::vector<int64_t>{4, 64} : std::vector<int64_t>{8, 32, 128, 512};
    for (int64_t tokens : tpe) {
        r.grouped.push_back(
            measure_grouped(tokens, 8, o.quick ? 32 : 128, o.quick ? 64 : 512, t, o.quick));
    }
    // MLA shapes (QK head dim = nope + rope, V head dim) from tiny's to DeepSeek-V3's head dims:
    // the kernel's efficiency grows ~10x over this range of work per query (S (Dqk + Dv) from
    // 2,560 to 327,680), so one shape cannot stand for all (issue 17: tiny's backward ran at a
    // fifth of the rate a mean over two shapes gave it).
    r.attention.push_back(measure_attention(4, 64, 4, 24, 16, t));
    if (o.quick) {
        r.attention.push_back(measure_attention(2, 128, 4, 48, 32, t));
    } else {
        r.attention.push_back(measure_attention(2, 256, 8, 96, 64, t));
        r.attention.push_back(measure_attention(1, 1024, 4, 192, 128, t));
    }
    const int64_t stream_count = o.quick ? (1 << 18) : (1 << 23);
    r.stream_gbytes_per_s = measure_stream_gbytes_per_s(stream_count, t);
    // From below tiny's calls (53 KB) and at them (213 KB: in a core's L2) through one in L3
    // (2.75 MB) to one that streams from memory (44 MB); the engine's in-cache calls ran twice as
    // fast.
    const std::vector<std::array<int64_t, 3>> memory_shapes =
        o.quick ? std::vector<std::array<int64_t, 3>>{{64, 32, 32}, {256, 64, 128}}
                : std::vector<std::array<int64_t, 3>>{
                      {64, 64, 64}, {256, 64, 64}, {1024, 128, 256}, {4096, 512, 1024}};
    for (const auto& [rows, dim, ffn] : memory_shapes) {
        r.memory_kernels.push_back(measure_memory_kernels(rows, dim, ffn, t));
    }
    r.exp_per_s = measure_exp_per_s(o.quick ? (1 << 16) : (1 << 20), t);
    r.call_overhead_s = measure_call_overhead_s();
    return r;
}

}  // namespace

ComputeMeasurements measure_compute(const CalibrateOptions& o) {
    MT_CHECK(o.seconds_per_point > 0, "[calibrate] seconds per point must be positive, got {}",
             o.seconds_per_point);
    MT_CHECK(o.rounds >= 1, "[calibrate] rounds must be at least 1, got {}", o.rounds);
    std::vector<ComputeMeasurements> rounds;
    for (int i = 0; i < o.rounds; ++i) rounds.push_back(measure_compute_round(o));
    return median_of_rounds(rounds);
}

ComputeMeasurements median_of_rounds(const std::vector<ComputeMeasurements>& rounds) {
    MT_CHECK(!rounds.empty(), "[calibrate] no round measured");
    auto median = [&](const auto& field) {
        std::vector<double> v;
        for (const auto& r : rounds) v.push_back(field(r));
        std::sort(v.begin(), v.end());
        const size_t n = v.size();
        return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    };
    ComputeMeasurements m = rounds.front();
    m.rounds = static_cast<int>(rounds.size());
    for (const auto& r : rounds) {
        MT_CHECK(r.gemm.size() == m.gemm.size() && r.grouped.size() == m.grouped.size() &&
                     r.attention.size() == m.attention.size() &&
                     r.memory_kernels.size() == m.memory_kernels.size(),
                 "[calibrate] rounds measured different shapes");
    }
    for (size_t i = 0; i < m.gemm.size(); ++i) {
        m.gemm[i].gflops = median([i](const ComputeMeasurements& r) { return r.gemm[i].gflops; });
    }
    for (size_t i = 0; i < m.grouped.size(); ++i) {
        m.grouped[i].gflops =
            median([i](const ComputeMeasurements& r) { return r.grouped[i].gflops; });
    }
    for (size_t i = 0; i < m.attention.size(); ++i) {
        m.attention[i].fwd_gflops =
            median([i](const ComputeMeasurements& r) { return r.attention[i].fwd_gflops; });
        m.attention[i].bwd_gflops =
            median([i](const ComputeMeasurements& r) { return r.attention[i].bwd_gflops; });
    }
    m.stream_gbytes_per_s =
        median([](const ComputeMeasurements& r) { return r.stream_gbytes_per_s; });
    for (size_t i = 0; i < m.memory_kernels.size(); ++i) {
        m.memory_kernels[i].gbytes_per_s =
            median([i](const ComputeMeasurements& r) { return r.memory_kernels[i].gbytes_per_s; });
    }
    m.exp_per_s = median([](const ComputeMeasurements& r) { return r.exp_per_s; });
    m.call_overhead_s = median([](const ComputeMeasurements& r) { return r.call_overhead_s; });
    return m;
}

namespace {

// How far the slowest rank runs behind the others: each repetition, every rank times the same
// block of `layers` linear layers (forward and backward) after a barrier; the slowest's excess
// over the ranks' mean, as a fraction of the mean, averaged over the repetitions (a mean, since a
// step waits for every rare late rank too). The block's duration is its fastest run on any rank:
// the undisturbed compute between two synchronizations, as the sim prices it. A mean would let
// one preemption in a short block's few runs make it look longer than the next, longer block
// (seen in CI: 1.2 ms for 2 layers against 0.14 ms for 8), and the cluster file's reader refuses
// durations that do not increase.
CollectiveMeasurements::SlowestRankPoint measure_slowest_rank(parallel::Communicator& world,
                                                              const CalibrateOptions& o,
                                                              int64_t layers, int repetitions) {
    const int64_t dim = o.quick ? 64 : 256;
    auto inp = pattern(dim * dim, 0.5f), w = pattern(dim * dim, 0.05f);
    auto out = filled(dim * dim, 0), dinp = filled(dim * dim, 0), dw = filled(dim * dim, 0);
    auto block = [&] {
        for (int64_t l = 0; l < layers; ++l) {
            cpu_backend().linear_forward(out.data(), inp.data(), w.data(), dim, dim, dim,
                                         kFp32Gemm);
            cpu_backend().linear_backward(dinp.data(), dw.data(), out.data(), inp.data(), w.data(),
                                          dim, dim, dim, kFp32Gemm);
        }
    };
    block();  // warm-up
    std::vector<double> times(static_cast<size_t>(repetitions));
    for (double& t : times) {
        world.barrier();
        const Timer timer;
        block();
        t = timer.elapsed_s();
    }
    const int n = world.size();
    std::vector<double> all(times.size() * static_cast<size_t>(n));
    world.all_gather(all.data(), times.data(), times.size(), DType::f64, kHostStream);
    double excess = 0;
    for (size_t i = 0; i < times.size(); ++i) {
        double slowest = 0, sum = 0;
        for (int r = 0; r < n; ++r) {
            const double t = all[static_cast<size_t>(r) * times.size() + i];
            slowest = std::max(slowest, t);
            sum += t;
        }
        const double mean = sum / n;
        excess += mean > 0 ? (slowest - mean) / mean : 0;
    }
    const double fastest_s = *std::min_element(all.begin(), all.end());
    return {fastest_s, repetitions, excess / static_cast<double>(repetitions)};
}

}  // namespace

CollectiveMeasurements measure_collectives(parallel::Communicator& world,
                                           const CalibrateOptions& o) {
    const int n = world.size();
    MT_CHECK(n > 1, "[calibrate] collectives need more than one rank (got {})", n);
    CollectiveMeasurements r;
    r.ranks = n;
    const std::vector<int64_t> sizes = o.quick
                                           ? std::vector<int64_t>{4096, 65536}
                                           : std::vector<int64_t>{16384, 262144, 2097152, 16777216};
    auto timed = [&](const std::function<void()>& fn) {
        // Every rank runs the same number of repetitions (decided on rank 0's clock) so that
        // no rank waits in a collective the others never post.
        fn();
        world.barrier();
        int reps = 3;
        {
            const Timer t;
            fn();
            double probe = t.elapsed_s();
            world.all_reduce_sum(&probe, 1, DType::f64, kHostStream);
            reps = static_cast<int>(
                std::clamp(o.seconds_per_point / std::max(probe / n, 1e-7), 3.0, 200.0));
        }
        std::vector<double> times;
        for (int i = 0; i < reps; ++i) {
            world.barrier();
            const Timer t;
            fn();
            times.push_back(t.elapsed_s());
        }
        std::sort(times.begin(), times.end());
        double median = times[times.size() / 2];
        world.all_reduce_sum(&median, 1, DType::f64,
                             kHostStream);  // the mean of the ranks' medians
        return median / n;
    };
    for (int64_t bytes : sizes) {
        const int64_t count = bytes / 4;
        std::vector<float> buf(static_cast<size_t>(count), 1.0f);
        const double s =
            timed([&] { world.all_reduce_sum(buf.data(), buf.size(), DType::f32, kHostStream); });
        r.all_reduce.push_back({static_cast<double>(bytes), s});
    }
    // The gradient sync's own collectives (ZeRO-1: reduce-scatter, then all-gather), at the
    // sizes of its buckets, up to the engine's bucket (GradSyncOptions::bucket_bytes): bytes are
    // the reduce-scatter's input and the all-gather's output, the whole bucket.
    const int64_t bucket_bytes = parallel::GradSyncOptions{}.bucket_bytes;
    const std::vector<int64_t> bucket_sizes =
        o.quick ? std::vector<int64_t>{4096, 65536}
                : std::vector<int64_t>{16384, 262144, bucket_bytes / 4, bucket_bytes};
    for (int64_t bytes : bucket_sizes) {
        const size_t shard = static_cast<size_t>(std::max<int64_t>(1, bytes / 4 / n));
        std::vector<float> whole(shard * static_cast<size_t>(n), 1.0f), part(shard, 1.0f);
        r.reduce_scatter.push_back({static_cast<double>(whole.size() * 4), timed([&] {
                                        world.reduce_scatter_sum(part.data(), whole.data(), shard,
                                                                 DType::f32, kHostStream);
                                    })});
        r.all_gather.push_back({static_cast<double>(whole.size() * 4), timed([&] {
                                    world.all_gather(whole.data(), part.data(), shard, DType::f32,
                                                     kHostStream);
                                })});
    }
    for (int64_t bytes : sizes) {
        const int per_peer = static_cast<int>(std::max<int64_t>(1, bytes / 4 / n));
        std::vector<int> counts(static_cast<size_t>(n), per_peer), displs(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) displs[static_cast<size_t>(i)] = i * per_peer;
        std::vector<float> send(static_cast<size_t>(per_peer) * n, 1.0f), recv(send.size());
        const double s = timed([&] {
            world.all_to_all_v(recv.data(), counts, displs, send.data(), counts, displs, DType::f32,
                               kHostStream);
        });
        r.all_to_all.push_back({static_cast<double>(per_peer) * n * 4, s});
    }
    // Blocks of about 4, 16, 64 and 260 ms on a one-thread rank of the 2-core machine (2 s in
    // all); quick: two short ones.
    const std::vector<std::pair<int64_t, int>> blocks =
        o.quick ? std::vector<std::pair<int64_t, int>>{{2, 5}, {8, 3}}
                : std::vector<std::pair<int64_t, int>>{{4, 40}, {16, 16}, {64, 8}, {256, 4}};
    for (auto [layers, repetitions] : blocks) {
        r.slowest_rank.push_back(measure_slowest_rank(world, o, layers, repetitions));
    }
    return r;
}

CollectiveMeasurements measure_self_copies(const CalibrateOptions& o) {
    CollectiveMeasurements r;
    r.ranks = 1;
    const std::vector<int64_t> sizes = o.quick
                                           ? std::vector<int64_t>{4096, 65536}
                                           : std::vector<int64_t>{16384, 262144, 2097152, 16777216};
    for (int64_t bytes : sizes) {
        std::vector<char> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes));
        const double s =
            mean_time_s([&] { std::memcpy(b.data(), a.data(), a.size()); }, o.seconds_per_point);
        r.all_reduce.push_back({static_cast<double>(bytes), s});
        r.all_to_all.push_back({static_cast<double>(bytes), s});
    }
    return r;
}

}  // namespace moetron::calibrate
