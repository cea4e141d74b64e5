// moetron calibrate: the fits recover known curves, and a file it writes parses back through the
// sim's catalog loader and simulates to a finite, positive step time.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "moetron/calibrate/calibrate.h"
#include "moetron/model/config.h"
#include "moetron/sim/costs.h"
#include "moetron/sim/hardware.h"
#include "moetron/sim/layout.h"
#include "moetron/sim/step.h"

namespace moetron {
namespace {

using calibrate::CollectiveMeasurements;
using calibrate::ComputeMeasurements;

double s(double x, double h) {
    return x / (x + h);
}

// Synthetic measurements from known curves: peak 80 GFLOP/s, half dim 40; grouped ratio 0.7,
// half 30 tokens per expert; a ring all_reduce, an all_to_all, and the gradient sync's ring
// reduce-scatter and all-gather (each at its own rate) over 4 ranks.
ComputeMeasurements synthetic_compute() {
    ComputeMeasurements c;
    c.threads = 1;
    for (int64_t m : {64, 256, 1024}) {
        for (int64_t n : {32, 128, 512}) {
            for (int64_t k : {32, 256}) {
                c.gemm.push_back({m, n, k, 80.0 * s(m, 40) * s(n, 40) * s(k, 40)});
            }
        }
    }
    for (int64_t t : {8, 32, 128, 512}) {
        c.grouped.push_back({t, 8, 128, 512, 80.0 * 0.7 * s(t, 30) * s(128, 40) * s(512, 40)});
    }
    c.attention.push_back({2, 128, 4, 32, 32, 20.0, 16.0});
    c.stream_gbytes_per_s = 20;
    c.memory_kernels = {{64, 32, 32, 10}, {4096, 512, 1024, 5}};  // in cache: twice as fast
    c.exp_per_s = 1e9;
    c.call_overhead_s = 1e-6;
    return c;
}

CollectiveMeasurements synthetic_collectives(int n) {
    CollectiveMeasurements r;
    r.ranks = n;
    if (n > 1) r.slowest_rank = {{0.004, 40, 0.06}, {0.064, 8, 0.015}};  // exponent 1/2
    const double alpha = 5e-6, ar_bw = 4e9, a2a_bw = 2e9, rs_bw = 3e9, ag_bw = 8e9;
    for (double bytes : {16384.0, 262144.0, 2097152.0, 16777216.0}) {
        r.all_reduce.push_back({bytes, 2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * bytes / ar_bw});
        r.all_to_all.push_back(
            {bytes, 3 * alpha + static_cast<double>(n - 1) / n * bytes / a2a_bw});
    }
    for (double bytes : {16384.0, 262144.0, 1048576.0, 4194304.0}) {
        const double pass = static_cast<double>(n - 1) / n * bytes;
        r.reduce_scatter.push_back({bytes, (n - 1) * alpha + pass / rs_bw});
        r.all_gather.push_back({bytes, (n - 1) * alpha + pass / ag_bw});
    }
    return r;
}

TEST(Calibrate, FitsRecoverKnownCurves) {
    const auto fit = calibrate::fit_calibration(synthetic_compute(), synthetic_collectives(4));
    EXPECT_NEAR(fit.peak_gflops, 80.0, 80.0 * 0.03);
    EXPECT_NEAR(fit.gemm_half_dim, 40.0, 40.0 * 0.05);
    EXPECT_NEAR(fit.grouped_ratio, 0.7, 0.7 * 0.05);
    EXPECT_NEAR(fit.grouped_half_tokens, 30.0, 30.0 * 0.05);
    EXPECT_LT(fit.gemm_fit_rms_rel_error, 0.02);
    EXPECT_TRUE(fit.collectives_measured);
    EXPECT_NEAR(fit.all_reduce_gbytes_per_s, 4.0, 0.04);
    EXPECT_NEAR(fit.all_to_all_gbytes_per_s, 2.0, 0.02);
    EXPECT_NEAR(fit.latency_us, 5.0, 0.05);
    EXPECT_NEAR(fit.all_to_all_latency_us, 15.0, 0.15);
    EXPECT_NEAR(fit.reduce_scatter_gbytes_per_s, 3.0, 0.03);
    EXPECT_NEAR(fit.all_gather_gbytes_per_s, 8.0, 0.08);
    EXPECT_NEAR(fit.link_gbytes_per_s, 8.0, 0.08);  // the fastest fit: the others relative to it
    EXPECT_NEAR(fit.attention_fwd, 20.0 / fit.peak_gflops, 1e-9);
}

// Two threads (issue 17: one rank with two threads was over-predicted by ~30%). The engine
// splits a GEMM over its threads only from 4 MFLOP on (kernels/cpu/matmul.cpp); smaller ones run
// on one thread at half the rank's rate. Measurements made that way, with the per-thread curve
// of the test above (half dim 40) and an all-threads asymptote of 160 GFLOP/s: the fit recovers
// the curve and the split, the written file carries both, and the sim prices a small GEMM at
// one thread's rate and a large one at all threads'. A single curve over both regimes (the fit
// before) lands far from half dim 40 and under-rates the mid-sized GEMMs.
TEST(Calibrate, TwoThreadsFitTheSerialSmallGemms) {
    ComputeMeasurements c = synthetic_compute();
    c.threads = 2;
    c.gemm.clear();
    for (int64_t m : {64, 256, 1024}) {
        for (int64_t n : {32, 128, 512}) {
            for (int64_t k : {32, 256}) {
                const double flops = 2.0 * static_cast<double>(m * n * k);
                const double share = flops < 4e6 ? 0.5 : 1.0;
                c.gemm.push_back({m, n, k, 160.0 * s(m, 40) * s(n, 40) * s(k, 40) * share});
            }
        }
    }
    const auto fit = calibrate::fit_calibration(c, calibrate::measure_self_copies({0.001, true}));
    EXPECT_NEAR(fit.peak_gflops, 160.0, 160.0 * 0.03);
    EXPECT_NEAR(fit.gemm_half_dim, 40.0, 40.0 * 0.05);
    // The largest serial shape measured has 2.1 MFLOP (1024 x 32 x 32), the smallest split one
    // 4.2 MFLOP (64 x 128 x 256).
    EXPECT_GT(fit.serial_gemm_below_flops, 2.0 * 1024 * 32 * 32);
    EXPECT_LE(fit.serial_gemm_below_flops, 2.0 * 64 * 128 * 256);
    EXPECT_LT(fit.gemm_fit_rms_rel_error, 0.02);

    const auto machine = calibrate::detect_machine(1, "test_calibrate");
    const std::string text = calibrate::format_cluster_toml(
        "local", machine, c, calibrate::measure_self_copies({0.001, true}), fit);
    const sim::ClusterSpec cluster = sim::parse_cluster_spec(text, "local.toml", "/nonexistent");
    EXPECT_EQ(cluster.efficiency.threads, 2);
    const auto& e = cluster.efficiency;
    const double small = sim::gemm_efficiency(e, sim::MathRate::fp32, 64, 128, 32);
    const double large = sim::gemm_efficiency(e, sim::MathRate::fp32, 1024, 512, 256);
    EXPECT_NEAR(small,
                0.5 * s(64, e.gemm_half_dim) * s(128, e.gemm_half_dim) * s(32, e.gemm_half_dim),
                1e-9);
    EXPECT_NEAR(large, s(1024, e.gemm_half_dim) * s(512, e.gemm_half_dim) * s(256, e.gemm_half_dim),
                1e-9);
}

sim::SimOptions fp32_options(int64_t batch, int64_t micro_batch, int64_t seq) {
    sim::SimOptions o;
    o.precision = Precision::fp32;
    o.global_batch = batch;
    o.micro_batch = micro_batch;
    o.seq_len = seq;
    return o;
}

// Issue 17: tiny's step was under-predicted by 27%, and nearly all of it was the attention
// backward: the fit priced attention at the mean of the measured shapes' efficiencies, five times
// what the tiny-like shape reached. Now each measured shape keeps its own efficiency, by work per
// query S (Dqk + Dv), and the sim interpolates between them: a tiny-like attention costs what its
// measurement says, a small-like one likewise.
TEST(Calibrate, AttentionKeepsEachMeasuredShape) {
    ComputeMeasurements c = synthetic_compute();
    c.attention.clear();
    c.attention.push_back({2, 256, 8, 96, 64, 48.0, 52.0});  // small-like: ~0.6 of peak
    c.attention.push_back({4, 64, 4, 24, 16, 16.0, 6.0});    // tiny-like: 0.2 / 0.075 of peak
    const auto fit = calibrate::fit_calibration(c, synthetic_collectives(4));
    ASSERT_EQ(fit.attention_by_work.size(), 2u);
    EXPECT_DOUBLE_EQ(fit.attention_by_work[0].work_per_query, 64.0 * 40);
    EXPECT_DOUBLE_EQ(fit.attention_by_work[1].work_per_query, 256.0 * 160);
    EXPECT_NEAR(fit.attention_bwd, 52.0 / fit.peak_gflops, 1e-9);  // the largest shape's

    const auto machine = calibrate::detect_machine(4, "test_calibrate");
    const std::string text =
        calibrate::format_cluster_toml("local", machine, c, synthetic_collectives(4), fit);
    const sim::ClusterSpec cluster = sim::parse_cluster_spec(text, "local.toml", "/nonexistent");
    const auto& e = cluster.efficiency;
    const double peak = fit.peak_gflops;
    EXPECT_NEAR(sim::attention_efficiency(e, true, 64.0 * 40), 6.0 / peak, 1e-5);
    EXPECT_NEAR(sim::attention_efficiency(e, false, 64.0 * 40), 16.0 / peak, 1e-5);
    EXPECT_NEAR(sim::attention_efficiency(e, true, 256.0 * 160), 52.0 / peak, 1e-5);

    // tiny's attention core (S 64, Dqk 24, Dv 16) is the tiny-like shape: its backward runs at
    // 6 GFLOP/s in the simulated step.
    const ModelConfig tiny = load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
    const sim::StepResult r =
        sim::simulate_step(tiny, cluster, parallel::parse_layout("tp1", 1), fp32_options(8, 8, 64));
    const double fwd_flops = 2.0 * 8 * 64 * 64 / 2 * 4 * (24 + 16);
    const int attention_layers = 3 + 1;  // and the MTP block's
    const double expected_s =
        attention_layers * (fwd_flops / (16.0 * 1e9) + 2.5 * fwd_flops / (6.0 * 1e9));
    EXPECT_NEAR(r.breakdown.attention_s, expected_s, 0.01 * expected_s);
}

// The GEMM fit counts every measured shape the same. Weighting by time per call (before issue
// 17) let the large shapes decide alone, and a CPU whose small GEMMs beat the s(m) s(n) s(k)
// curve (here: the n = k = 32 shapes run 1.6x faster than it) got them priced 1.5x too slow,
// which is what tiny, made of such GEMMs, is. No measured shape may be off by 35% or more.
TEST(Calibrate, GemmFitCountsTheSmallShapes) {
    ComputeMeasurements c = synthetic_compute();
    for (auto& p : c.gemm) {
        if (p.n == 32 && p.k == 32) p.gflops *= 1.6;
    }
    const auto fit = calibrate::fit_calibration(c, synthetic_collectives(4));
    for (const auto& p : c.gemm) {
        const double h = fit.gemm_half_dim;
        const double curve = fit.peak_gflops * s(static_cast<double>(p.m), h) *
                             s(static_cast<double>(p.n), h) * s(static_cast<double>(p.k), h);
        EXPECT_LT(std::abs(std::log(p.gflops / curve)), std::log(1.35))
            << p.m << "x" << p.n << "x" << p.k << ": measured " << p.gflops << ", fit " << curve;
    }
}

// On a CPU the ranks' own cores move a collective's bytes, and they are all computing: the
// gradient sync the engine posts during the backward does not hide behind it (measured on
// the 2-core machine: small's sync 100-215 ms exposed per step, the overlapped sim's 23 ms). The
// written file says so (comm_sm_fraction 1), and the sim then prices a data-parallel step as
// if the sync were not overlapped.
TEST(Calibrate, CollectivesDoNotHideBehindCpuCompute) {
    const ComputeMeasurements compute = synthetic_compute();
    const CollectiveMeasurements coll = synthetic_collectives(2);
    const auto fit = calibrate::fit_calibration(compute, coll);
    const auto machine = calibrate::detect_machine(2, "mpirun -np 2 test_calibrate");
    const sim::ClusterSpec cluster = sim::parse_cluster_spec(
        calibrate::format_cluster_toml("local-np2", machine, compute, coll, fit), "local-np2.toml",
        "/nonexistent");
    EXPECT_EQ(cluster.efficiency.comm_sm_fraction, 1);
    const ModelConfig small = load_model_config(MOETRON_SOURCE_DIR "/configs/models/small.toml");
    sim::SimOptions overlapped = fp32_options(8, 4, 256), serial = overlapped;
    serial.overlap_dp_grad = false;
    const auto dp2 = parallel::parse_layout("tp1", 2);
    const double overlapped_s = sim::simulate_step(small, cluster, dp2, overlapped).step_time_s;
    const double serial_s = sim::simulate_step(small, cluster, dp2, serial).step_time_s;
    EXPECT_NEAR(overlapped_s, serial_s, 1e-3 * serial_s);
}

// Issue 17: tiny on two ranks of one thread was under-predicted by 13%. The layers' memory-bound
// ops (norms, SwiGLU, RoPE, permutes) were priced at the stream rate, but the engine's kernels are
// bound by their arithmetic: on one thread they ran at half the stream rate (9.0 against
// 18.4 GB/s on the 2-core machine). They are now priced at the engine's measured rmsnorm + SwiGLU
// rate; the GEMMs' byte side and the optimizer keep the stream rate. That rate is measured at
// several sizes, since tiny's calls, in cache, ran twice as fast as calls streaming from memory
// (tiny on one rank of two threads was over-predicted by 7-12% in every batch).
TEST(Calibrate, MemoryOpsRunAtTheEngineKernelsRateForTheirSize) {
    // kernels 10 GB/s at tiny's size (213 KB a call), 5 at 44 MB; stream 20
    ComputeMeasurements by_size = synthetic_compute();
    by_size.memory_kernels = {{256, 64, 64, 10}, {4096, 512, 1024, 5}};
    ComputeMeasurements at_stream_rate = by_size, at_large_rate = by_size;
    for (auto& p : at_stream_rate.memory_kernels) p.gbytes_per_s = 20;
    at_large_rate.memory_kernels.front().gbytes_per_s = 5;
    const CollectiveMeasurements copies = calibrate::measure_self_copies({0.001, true});
    const auto machine = calibrate::detect_machine(1, "test_calibrate");
    auto cluster_of = [&](const ComputeMeasurements& c) {
        const auto fit = calibrate::fit_calibration(c, copies);
        return sim::parse_cluster_spec(
            calibrate::format_cluster_toml("local", machine, c, copies, fit), "local.toml",
            "/nonexistent");
    };
    const sim::ClusterSpec measured = cluster_of(by_size), slow = cluster_of(at_large_rate),
                           fast = cluster_of(at_stream_rate);
    EXPECT_NEAR(measured.efficiency.memory_ops_bw, 5.0 / 20, 1e-3);  // the largest size's
    EXPECT_NEAR(measured.efficiency.memory_bw, 1, 1e-9);
    ASSERT_EQ(measured.efficiency.memory_ops_by_bytes.size(), 2u);
    EXPECT_NEAR(measured.efficiency.memory_ops_by_bytes.front().bytes,
                by_size.memory_kernels.front().bytes_per_call(), 1);
    // Net of each call's fixed cost (1 us), which the sim adds back per call.
    auto net_rate = [&](const calibrate::MemoryKernelsPoint& p) {
        const double call_s = p.bytes_per_call() / (p.gbytes_per_s * 1e9);
        return p.bytes_per_call() / (call_s - by_size.call_overhead_s) / 1e9;
    };
    EXPECT_GT(net_rate(by_size.memory_kernels.front()), 10.4);
    EXPECT_NEAR(sim::memory_ops_efficiency(measured.efficiency, 1e3),
                net_rate(by_size.memory_kernels.front()) / 20, 1e-3);
    EXPECT_NEAR(sim::memory_ops_efficiency(measured.efficiency, 1e9),
                net_rate(by_size.memory_kernels.back()) / 20, 1e-3);

    const ModelConfig tiny = load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
    const auto one = parallel::parse_layout("tp1", 1);
    const auto options = fp32_options(8, 8, 64);
    const sim::StepResult slow_step = sim::simulate_step(tiny, slow, one, options);
    const sim::StepResult measured_step = sim::simulate_step(tiny, measured, one, options);
    const sim::StepResult fast_step = sim::simulate_step(tiny, fast, one, options);
    // Four times the time per byte at the large size's rate, less each op's fixed cost (the same
    // in all); tiny's calls lie near the small size, at nearly twice that rate.
    EXPECT_GT(slow_step.breakdown.memory_bound_s, 3.5 * fast_step.breakdown.memory_bound_s);
    EXPECT_LT(measured_step.breakdown.memory_bound_s, 0.65 * slow_step.breakdown.memory_bound_s);
    EXPECT_GT(measured_step.breakdown.memory_bound_s, 1.5 * fast_step.breakdown.memory_bound_s);
    EXPECT_DOUBLE_EQ(slow_step.breakdown.gemm_s, fast_step.breakdown.gemm_s);
    EXPECT_DOUBLE_EQ(slow_step.breakdown.optimizer_s, fast_step.breakdown.optimizer_s);
}

// Issue 17: small on one rank of two threads was over-predicted by 13% because another process's
// burst, partway through one calibration, halved every 2048-row GEMM and the kernels measured
// after them (2048x512x512: 95 GFLOP/s against 185 in an undisturbed calibration of the same
// machine). Each figure is now the median of several rounds, every shape measured once per
// round: a burst that spoils one round of a shape leaves the file as if it had not happened.
TEST(Calibrate, MedianOfRoundsIgnoresOneDisturbedRound) {
    const ComputeMeasurements quiet = synthetic_compute();
    ComputeMeasurements disturbed = quiet;
    for (size_t i = disturbed.gemm.size() / 2; i < disturbed.gemm.size(); ++i) {
        disturbed.gemm[i].gflops /= 2;  // the burst starts halfway through the GEMMs
    }
    for (auto& p : disturbed.grouped) p.gflops /= 2;
    for (auto& p : disturbed.attention) p.bwd_gflops /= 2;
    disturbed.stream_gbytes_per_s /= 2;
    for (auto& p : disturbed.memory_kernels) p.gbytes_per_s /= 2;
    ComputeMeasurements noisy = quiet;  // an undisturbed round measures a little differently
    for (auto& p : noisy.gemm) p.gflops *= 1.01;
    noisy.stream_gbytes_per_s *= 1.01;

    const ComputeMeasurements m = calibrate::median_of_rounds({disturbed, quiet, noisy});
    EXPECT_EQ(m.rounds, 3);
    ASSERT_EQ(m.gemm.size(), quiet.gemm.size());
    for (size_t i = 0; i < m.gemm.size(); ++i) {
        EXPECT_DOUBLE_EQ(m.gemm[i].gflops, quiet.gemm[i].gflops) << i;
    }
    EXPECT_DOUBLE_EQ(m.grouped.back().gflops, quiet.grouped.back().gflops);
    EXPECT_DOUBLE_EQ(m.attention.front().bwd_gflops, quiet.attention.front().bwd_gflops);
    EXPECT_DOUBLE_EQ(m.stream_gbytes_per_s, quiet.stream_gbytes_per_s);
    EXPECT_DOUBLE_EQ(m.memory_kernels.front().gbytes_per_s,
                     quiet.memory_kernels.front().gbytes_per_s);
    const auto fit = calibrate::fit_calibration(m, calibrate::measure_self_copies({0.001, true}));
    const auto quiet_fit =
        calibrate::fit_calibration(quiet, calibrate::measure_self_copies({0.001, true}));
    EXPECT_DOUBLE_EQ(fit.peak_gflops, quiet_fit.peak_gflops);
}

// A one-thread rank's GEMM reads what the op before it just wrote, still in the core's L2 when
// it fits: tiny's GEMM shapes ran 1.2-1.4x faster from there than calibrate's cold copies
// measured them (min of 400 interleaved calls, one thread), which over-priced tiny on 2 ranks.
// calibrate now measures such a GEMM in place; larger sets, ranks of several threads (each
// wrote part of the input in its own core's cache) and an unknown L2 keep the cold copies.
TEST(Calibrate, OneThreadRanksMeasureL2SizedGemmsInPlace) {
    const int64_t l2 = int64_t{1} << 20;
    const double tiny_set = 4.0 * (2 * 512 * 64 + 2 * 32 * 64 + 2 * 512 * 32);  // 400 KiB
    EXPECT_EQ(calibrate::gemm_operand_copies(tiny_set, 1, l2, false), 1);
    EXPECT_EQ(calibrate::gemm_operand_copies(tiny_set, 2, l2, false), 64);
    EXPECT_EQ(calibrate::gemm_operand_copies(tiny_set, 1, 0, false), 64);
    EXPECT_EQ(calibrate::gemm_operand_copies(4.0 * 1024 * 1024, 1, l2, false), 16);
    EXPECT_EQ(calibrate::gemm_operand_copies(4.0 * 1024 * 1024, 1, l2, true), 1);
}

TEST(Calibrate, WrittenFileParsesAndSimulates) {
    // A real (quick) measurement of this machine on one rank: memcpy self copies for the links.
    calibrate::CalibrateOptions options;
    options.quick = true;
    options.seconds_per_point = 0.002;
    const ComputeMeasurements compute = calibrate::measure_compute(options);
    const CollectiveMeasurements copies = calibrate::measure_self_copies(options);
    ASSERT_FALSE(compute.gemm.empty());
    for (const auto& p : compute.gemm) EXPECT_GT(p.gflops, 0) << p.m << "x" << p.n << "x" << p.k;
    EXPECT_GT(compute.stream_gbytes_per_s, 0);
    const auto fit = calibrate::fit_calibration(compute, copies);
    EXPECT_FALSE(fit.collectives_measured);
    const auto machine = calibrate::detect_machine(1, "test_calibrate");
    const std::string text = calibrate::format_cluster_toml("local", machine, compute, copies, fit);

    const sim::ClusterSpec cluster = sim::parse_cluster_spec(text, "local.toml", "/nonexistent");
    EXPECT_EQ(cluster.name, "local");
    EXPECT_EQ(cluster.efficiency.arch, "calibrated-cpu");
    EXPECT_EQ(cluster.scale_up.domain_gpus, 1);
    EXPECT_NEAR(cluster.peak_flops(sim::MathRate::fp32), fit.peak_gflops * 1e9,
                fit.peak_gflops * 1e9 * 1e-5);
    EXPECT_EQ(cluster.efficiency.kernel_host_overhead_s, 0);

    const ModelConfig tiny = load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
    const sim::StepResult r =
        sim::simulate_step(tiny, cluster, parallel::parse_layout("tp1", 1), fp32_options(8, 8, 64));
    EXPECT_TRUE(std::isfinite(r.step_time_s));
    EXPECT_GT(r.step_time_s, 0);
}

TEST(Calibrate, MultiRankFileSimulatesDataParallel) {
    const ComputeMeasurements compute = synthetic_compute();
    const CollectiveMeasurements coll = synthetic_collectives(4);
    const auto fit = calibrate::fit_calibration(compute, coll);
    const auto machine = calibrate::detect_machine(4, "mpirun -np 4 test_calibrate");
    const std::string text =
        calibrate::format_cluster_toml("local-np4", machine, compute, coll, fit);
    const sim::ClusterSpec cluster =
        sim::parse_cluster_spec(text, "local-np4.toml", "/nonexistent");
    EXPECT_EQ(cluster.scale_up.domain_gpus, 4);
    EXPECT_NEAR(cluster.scale_up.bytes_per_s * cluster.efficiency.scale_up_bw, 4e9, 4e7);
    EXPECT_NEAR(cluster.scale_up.bytes_per_s * cluster.efficiency.all_to_all_bw, 2e9, 2e7);
    // The gradient sync's collectives at their own measured rates.
    EXPECT_NEAR(cluster.scale_up.bytes_per_s * cluster.efficiency.reduce_scatter_bw, 3e9, 3e7);
    EXPECT_NEAR(cluster.scale_up.bytes_per_s * cluster.efficiency.all_gather_bw, 8e9, 8e7);

    // The measured spread of the ranks: the model's slowest of 4 lands where it was measured,
    // over each block's duration.
    EXPECT_NEAR(sim::slowest_of_n(cluster.efficiency.variability, 4, 1, 0.004).total(), 0.06, 1e-9);
    EXPECT_NEAR(sim::slowest_of_n(cluster.efficiency.variability, 4, 1, 0.064).total(), 0.015,
                1e-9);

    const ModelConfig tiny = load_model_config(MOETRON_SOURCE_DIR "/configs/models/tiny.toml");
    const sim::StepResult one =
        sim::simulate_step(tiny, cluster, parallel::parse_layout("tp1", 1), fp32_options(8, 8, 64));
    const sim::StepResult four =
        sim::simulate_step(tiny, cluster, parallel::parse_layout("tp1", 4), fp32_options(8, 2, 64));
    EXPECT_TRUE(std::isfinite(four.step_time_s));
    EXPECT_GT(four.step_time_s, 0);
    // A quarter of the batch per rank, plus a gradient all-reduce: faster than one rank.
    EXPECT_LT(four.step_time_s, one.step_time_s);
    EXPECT_GT(four.breakdown.dp_jitter_s, 0);  // waiting for the slowest of the four
}

std::pair<int, std::string> run(const std::string& args) {
    const std::string cmd = std::string(MOETRON_BINARY) + " " + args + " 2>&1";
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
    std::string out;
    std::array<char, 4096> buf{};
    while (fgets(buf.data(), buf.size(), pipe.get()) != nullptr) out += buf.data();
    const int status = pclose(pipe.release());
    return {WEXITSTATUS(status), out};
}

TEST(Calibrate, CommandWritesAFileSimulateReads) {
    const auto dir = std::filesystem::temp_directory_path() / "moetron_test_calibrate";
    std::filesystem::remove_all(dir);
    const std::string file = (dir / "local.toml").string();
    auto [rc, out] = run("calibrate --quick --seconds-per-point 0.002 --threads 1 --out " + file);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("wrote " + file), std::string::npos) << out;
    std::tie(rc, out) = run("simulate --cluster " + file +
                            " --config " MOETRON_SOURCE_DIR
                            "/configs/models/tiny.toml --gpus 1 --layout tp1 --gbs 8 --mbs 8 "
                            "--seq-len 64 --precision fp32");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("step time"), std::string::npos) << out;
    std::filesystem::remove_all(dir);
}

TEST(Calibrate, Fp32IsASimRecipe) {
    EXPECT_EQ(sim::math_rate_from_key("fp32"), sim::MathRate::fp32);
    EXPECT_EQ(sim::math_rate_of(Precision::fp32), sim::MathRate::fp32);
    EXPECT_EQ(sim::operand_bytes(sim::MathRate::fp32), 4);
    EXPECT_FALSE(sim::is_low_precision(Precision::fp32));
}

}  // namespace
}  // namespace moetron
