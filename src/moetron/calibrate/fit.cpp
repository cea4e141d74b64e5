// Fits the sim's curves to the measurements and writes the cluster file (calibrate.h).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <string>

#include "moetron/calibrate/calibrate.h"
#include "moetron/core/error.h"
#include "moetron/core/least_squares.h"

namespace moetron::calibrate {

namespace {

double saturation(double x, double half) {
    return x / (x + half);
}

// Half-saturation points tried by the fits: 1 to 8192, log-spaced.
std::vector<double> half_candidates() {
    std::vector<double> out;
    for (int i = 0; i <= 260; ++i) out.push_back(std::pow(10.0, i / 65.0));
    return out;
}

// Least squares of t = a + b x in relative error (weights 1 / t^2), so that the small sizes
// (latency) count as much as the large ones (bandwidth). Returns {a, b}.
std::pair<double, double> linear_fit(const std::vector<CollectivePoint>& pts, double bytes_factor) {
    MT_CHECK(pts.size() >= 2, "[calibrate] collective fit needs two distinct sizes");
    std::vector<double> x, time_s, weight;
    for (const auto& p : pts) {
        MT_CHECK(p.time_s > 0, "[calibrate] a collective took no time ({} bytes)", p.bytes);
        x.push_back(p.bytes * bytes_factor);
        time_s.push_back(p.time_s);
        weight.push_back(1.0 / (p.time_s * p.time_s));
    }
    const LineFit line = fit_line(x, time_s, weight);
    return {line.intercept, line.slope};
}

double clamp_fraction(double f) {
    return std::clamp(f, 1e-3, 1.0);
}

// GEMM: log y = log peak + sum log s(dim; h) + log share, least squares in log rate over the
// measured shapes, each counted once. (Weighting each shape by its time per call, before issue
// 17, let the largest shapes decide alone, and the curve priced the small GEMMs tiny is made of
// 1.2-2x too slow on one thread: s(m) s(n) s(k) falls faster with small dims than this CPU's
// kernels do.) share is 1/threads for a GEMM the engine runs on one thread and 1 for one it
// splits over all of them: a single curve over both put the small shapes on the all-threads
// curve and, with two threads, bent h up to ~1,000 to pull them down, under-rating every
// mid-sized GEMM. The split point is fitted too (one of the measured FLOP counts, or none), so
// the fit needs no copy of the engine's constant. For each h and split, the best log peak is the
// mean residual; keep the smallest squared log error.
void fit_gemm(const ComputeMeasurements& c, CalibrationFit& f) {
    double best_err = 1e300;
    std::vector<double> split_candidates = {0};
    for (const auto& p : c.gemm) {
        if (c.threads > 1) {
            split_candidates.push_back(2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) *
                                       static_cast<double>(p.k));
        }
    }
    auto log_curve = [&](const GemmPoint& p, double h, double serial_below) {
        const double flops =
            2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
        const double share = flops < serial_below ? 1.0 / static_cast<double>(c.threads) : 1.0;
        return std::log(saturation(static_cast<double>(p.m), h) *
                        saturation(static_cast<double>(p.n), h) *
                        saturation(static_cast<double>(p.k), h) * share);
    };
    const auto shapes = static_cast<double>(c.gemm.size());
    for (double split : split_candidates) {
        for (double h : half_candidates()) {
            double mean = 0;
            for (const auto& p : c.gemm) mean += std::log(p.gflops) - log_curve(p, h, split);
            mean /= shapes;
            double err = 0;
            for (const auto& p : c.gemm) {
                const double r = std::log(p.gflops) - mean - log_curve(p, h, split);
                err += r * r;
            }
            if (err < best_err) {
                best_err = err;
                f.gemm_half_dim = h;
                f.peak_gflops = std::exp(mean);
                f.serial_gemm_below_flops = split;
            }
        }
    }
    best_err /= shapes;
    f.gemm_fit_rms_rel_error = std::sqrt(best_err);
}

// Grouped GEMM: y / (peak s(n) s(k)) = ratio * s(tokens per expert; h_t), on the dense fit.
void fit_grouped_gemm(const ComputeMeasurements& c, CalibrationFit& f) {
    double best_err = 1e300;
    for (double h : half_candidates()) {
        double mean = 0;
        for (const auto& p : c.grouped) {
            const double dense = f.peak_gflops *
                                 saturation(static_cast<double>(p.n), f.gemm_half_dim) *
                                 saturation(static_cast<double>(p.k), f.gemm_half_dim);
            mean += std::log(p.gflops / dense) -
                    std::log(saturation(static_cast<double>(p.tokens_per_expert), h));
        }
        mean /= static_cast<double>(c.grouped.size());
        double err = 0;
        for (const auto& p : c.grouped) {
            const double dense = f.peak_gflops *
                                 saturation(static_cast<double>(p.n), f.gemm_half_dim) *
                                 saturation(static_cast<double>(p.k), f.gemm_half_dim);
            const double r = std::log(p.gflops / dense) - mean -
                             std::log(saturation(static_cast<double>(p.tokens_per_expert), h));
            err += r * r;
        }
        if (err < best_err) {
            best_err = err;
            f.grouped_half_tokens = h;
            f.grouped_ratio = std::exp(mean);
        }
    }
    f.grouped_ratio = clamp_fraction(f.grouped_ratio);
}

// Attention: each shape's fraction of peak, by work per query S (Dqk + Dv), for the sim to
// interpolate. A mean over the shapes (before issue 17) priced tiny's attention backward at five
// times its measured rate. Shapes of equal work keep their mean.
void fit_attention(const ComputeMeasurements& c, CalibrationFit& f) {
    std::vector<AttentionFitPoint> points;
    for (const auto& p : c.attention) {
        const double work =
            static_cast<double>(p.seq_len) * static_cast<double>(p.qk_dim + p.v_dim);
        points.push_back({work, p.fwd_gflops / f.peak_gflops, p.bwd_gflops / f.peak_gflops});
    }
    std::sort(points.begin(), points.end(),
              [](const auto& a, const auto& b) { return a.work_per_query < b.work_per_query; });
    for (size_t i = 0; i < points.size();) {
        size_t j = i;
        AttentionFitPoint sum{points[i].work_per_query, 0, 0};
        for (; j < points.size() && points[j].work_per_query == sum.work_per_query; ++j) {
            sum.fwd += points[j].fwd;
            sum.bwd += points[j].bwd;
        }
        const double count = static_cast<double>(j - i);
        f.attention_by_work.push_back(
            {sum.work_per_query, clamp_fraction(sum.fwd / count), clamp_fraction(sum.bwd / count)});
        i = j;
    }
    f.attention_fwd = f.attention_by_work.back().fwd;
    f.attention_bwd = f.attention_by_work.back().bwd;
}

// Memory-bound ops: the streaming bandwidth (the sim counts fp32 activations at precision fp32,
// as this engine moves them); the sim applies it to the byte side of every GEMM's roofline and
// to the optimizer. The layers' own memory-bound ops (norms, SwiGLU, RoPE, permutes) run at the
// engine's rmsnorm + SwiGLU rate instead: they are bound by their arithmetic (exponentials,
// square roots) more than by bytes, so the rate follows the threads, not the memory (measured
// on the 2-core machine: 15.3 GB/s on 2 threads against a stream rate of 21.6; 9.0 on one
// thread against 18.4). Priced at the stream rate, they made tiny on two ranks of one thread 13%
// faster than measured (issue 17). That rate depends on the size: a call whose arrays stay in
// cache ran twice as fast as one streaming from memory (33 against 19 GB/s on two threads), so
// each measured size is a point of the sim's curve, by bytes per kernel call, and may exceed
// the stream rate. The sim adds each call's fixed cost (the empty parallel region) to its bytes'
// time, so the rate is taken net of it: at 53 KB a call on two threads that cost is a fifth of
// the call. (A cost measured at half the call or more says more about the noise than the call;
// the gross rate stays then.)
void fit_memory_ops(const ComputeMeasurements& c, CalibrationFit& f) {
    f.memory_bw_efficiency = 1;
    if (c.stream_gbytes_per_s > 0) {
        for (const auto& p : c.memory_kernels) {
            if (p.gbytes_per_s <= 0) continue;
            MT_CHECK(f.memory_ops_by_bytes.empty() ||
                         p.bytes_per_call() > f.memory_ops_by_bytes.back().bytes_per_call,
                     "[calibrate] the memory kernels' sizes must increase");
            const double call_s = p.bytes_per_call() / (p.gbytes_per_s * 1e9);
            const double bytes_s = call_s - c.call_overhead_s;
            const double net_gbytes_per_s =
                bytes_s > 0.5 * call_s ? p.bytes_per_call() / bytes_s / 1e9 : p.gbytes_per_s;
            f.memory_ops_by_bytes.push_back(
                {p.bytes_per_call(), net_gbytes_per_s / c.stream_gbytes_per_s});
        }
    }
    if (!f.memory_ops_by_bytes.empty()) {
        f.memory_ops_bw_efficiency = clamp_fraction(f.memory_ops_by_bytes.back().efficiency);
    }
}

// A fit's bandwidth in bytes/s: 1 / slope, or, for a non-positive slope (noise at sizes too
// small to see bandwidth), the largest size's rate.
double fitted_rate(double slope, const std::vector<CollectivePoint>& pts, double bytes_factor) {
    if (slope > 0) return 1.0 / slope;
    return pts.back().bytes * bytes_factor / pts.back().time_s;
}

// Collectives. all_reduce (ring): t = 2(n-1) alpha + 2(n-1)/n S / B. all_to_all (the sim's flat
// form): t = alpha + (n-1)/n S / B. One rank: memcpy, t = alpha + S / B. reduce-scatter and
// all-gather (ring, one pass): t = (n-1) alpha + (n-1)/n S / B.
void fit_collectives(const CollectiveMeasurements& coll, CalibrationFit& f) {
    const int n = coll.ranks;
    f.collectives_measured = n > 1;
    const double ar_factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
    const double a2a_factor = n > 1 ? static_cast<double>(n - 1) / n : 1.0;
    const auto [ar_a, ar_b] = linear_fit(coll.all_reduce, ar_factor);
    const auto [a2a_a, a2a_b] = linear_fit(coll.all_to_all, a2a_factor);
    f.all_reduce_gbytes_per_s = fitted_rate(ar_b, coll.all_reduce, ar_factor) / 1e9;
    f.all_to_all_gbytes_per_s = fitted_rate(a2a_b, coll.all_to_all, a2a_factor) / 1e9;
    f.link_gbytes_per_s = std::max(f.all_reduce_gbytes_per_s, f.all_to_all_gbytes_per_s);
    if (n > 1 && coll.reduce_scatter.size() >= 2 && coll.all_gather.size() >= 2) {
        const double pass_factor = static_cast<double>(n - 1) / n;
        f.reduce_scatter_gbytes_per_s =
            fitted_rate(linear_fit(coll.reduce_scatter, pass_factor).second, coll.reduce_scatter,
                        pass_factor) /
            1e9;
        f.all_gather_gbytes_per_s = fitted_rate(linear_fit(coll.all_gather, pass_factor).second,
                                                coll.all_gather, pass_factor) /
                                    1e9;
        f.link_gbytes_per_s = std::max(
            {f.link_gbytes_per_s, f.reduce_scatter_gbytes_per_s, f.all_gather_gbytes_per_s});
    }
    f.latency_us = std::max(ar_a, 0.0) / (n > 1 ? 2.0 * (n - 1) : 1.0) * 1e6;
    f.all_to_all_latency_us = std::max(a2a_a, 0.0) * 1e6;
}

}  // namespace

CalibrationFit fit_calibration(const ComputeMeasurements& c, const CollectiveMeasurements& coll) {
    MT_CHECK(!c.gemm.empty() && !c.grouped.empty() && !c.attention.empty(),
             "[calibrate] nothing measured to fit");
    CalibrationFit f;
    fit_gemm(c, f);
    fit_grouped_gemm(c, f);  // on the GEMM's peak and half-saturation dim
    fit_attention(c, f);     // as fractions of the GEMM's peak
    fit_memory_ops(c, f);
    fit_collectives(coll, f);
    return f;
}

MachineInfo detect_machine(int ranks_on_node, const std::string& command) {
    MachineInfo m;
    m.cpu_name = "cpu";
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line)) {
        if (line.rfind("model name", 0) == 0) {
            const auto colon = line.find(':');
            if (colon != std::string::npos) m.cpu_name = line.substr(colon + 2);
            break;
        }
    }
    m.ranks_on_node = std::max(1, ranks_on_node);
    const double pages = static_cast<double>(sysconf(_SC_PHYS_PAGES));
    const double page = static_cast<double>(sysconf(_SC_PAGE_SIZE));
    m.memory_gib = pages * page / (1024.0 * 1024.0 * 1024.0) / m.ranks_on_node;
    m.command = command;
    const std::time_t now = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    m.timestamp = buf;
    return m;
}

namespace {

// The cluster file's text, a line at a time.
struct TomlText {
    std::string text;
    void line(const std::string& s) { text += s + "\n"; }
};

// Cells appended to a comment row, wrapped before 98 characters.
void wrapped_row(TomlText& out, const std::vector<std::string>& cells) {
    std::string row = "#    ";
    for (const std::string& cell : cells) {
        if (row.size() + cell.size() > 98) {
            out.line(row);
            row = "#    ";
        }
        row += cell;
    }
    out.line(row);
}

// One field of every point of a measured curve, as a TOML array.
template <typename Points, typename Field>
std::string toml_array(const Points& points, Field field) {
    std::string out;
    for (const auto& p : points) {
        out += fmt::format("{}{:.6g}", out.empty() ? "" : ", ", field(p));
    }
    return "[" + out + "]";
}

// Where the file comes from, and what one "GPU" of it is.
void write_preamble(TomlText& out, const std::string& name, const MachineInfo& m,
                    const ComputeMeasurements& c) {
    out.line(fmt::format("# {}: this machine, measured by `moetron calibrate` on {}.", name,
                         m.timestamp));
    out.line(fmt::format("#   command: {}", m.command));
    out.line(fmt::format("#   CPU: {}; {} rank(s) on this node, {} OpenMP thread(s) per rank.",
                         m.cpu_name, m.ranks_on_node, c.threads));
    out.line(
        "# One \"GPU\" of this file is one rank (its threads); the scale-up domain is the ranks "
        "on");
    out.line(
        "# this node. The engine computes everything in fp32: the bf16 and tf32 peaks repeat the");
    out.line(
        "# fp32 one, because the sim prices the attention core and the LM head at the bf16 peak "
        "and");
    out.line("# the router GEMM at the tf32 one. Simulate with --precision fp32.");
}

// The compute measurements and the curves fitted to them, as comments.
void write_compute_measurements(TomlText& out, const ComputeMeasurements& c,
                                const CalibrationFit& f) {
    out.line(fmt::format(
        "# Measurements (mean time per call over a window, the median of {} round(s); the fits "
        "below come from them):",
        c.rounds));
    out.line(fmt::format("#   sgemm fwd+bwd of a linear layer (6 m n k FLOPs), {} shapes, GFLOP/s:",
                         c.gemm.size()));
    std::vector<std::string> gemm_cells;
    for (const auto& p : c.gemm) {
        gemm_cells.push_back(fmt::format(" {}x{}x{}={:.1f}", p.m, p.n, p.k, p.gflops));
    }
    wrapped_row(out, gemm_cells);
    out.line(fmt::format(
        "#   fit eff = s(m) s(n) s(k), s(x) = x / (x + {:.0f}), asymptote {:.1f} GFLOP/s, "
        "rms log error over the shapes {:.2f}",
        f.gemm_half_dim, f.peak_gflops, f.gemm_fit_rms_rel_error));
    if (c.threads > 1) {
        out.line(fmt::format(
            "#   GEMMs under {:.3g} FLOPs ran on one of the {} threads (1/{} of the asymptote)",
            f.serial_gemm_below_flops, c.threads, c.threads));
    }
    if (c.threads == 1 && c.l2_bytes > 0) {
        out.line(fmt::format(
            "#   operands that fit one core's L2 ({} KiB) were measured in place, as a one-thread "
            "rank's step finds them; larger ones cold",
            c.l2_bytes / 1024));
    }
    std::string row = "#   grouped GEMM fwd+bwd (8 experts), tokens/expert: GFLOP/s:";
    for (const auto& p : c.grouped) {
        row += fmt::format(" {}: {:.1f}", p.tokens_per_expert, p.gflops);
    }
    out.line(row);
    for (const auto& p : c.attention) {
        out.line(fmt::format(
            "#   attention B{} S{} H{} Dqk{} Dv{}: fwd {:.1f}, bwd {:.1f} GFLOP/s "
            "(causal, bwd = 2.5x fwd FLOPs)",
            p.batch, p.seq_len, p.heads, p.qk_dim, p.v_dim, p.fwd_gflops, p.bwd_gflops));
    }
    row = "#   rmsnorm + SwiGLU fwd+bwd (rows x dim x ffn: GB/s of fp32 bytes):";
    for (const auto& p : c.memory_kernels) {
        row += fmt::format(" {}x{}x{}: {:.1f}", p.rows, p.dim, p.ffn, p.gbytes_per_s);
    }
    out.line(row);
    out.line(
        fmt::format("#   stream triad {:.1f} GB/s; exp {:.3g}/s; one parallel region {:.2f} us",
                    c.stream_gbytes_per_s, c.exp_per_s, c.call_overhead_s * 1e6));
}

// The collectives' measured points and their alpha-beta fits, as comments (one rank: none).
void write_collective_measurements(TomlText& out, const CollectiveMeasurements& coll,
                                   const CalibrationFit& f) {
    if (!f.collectives_measured) {
        out.line(
            "#   One rank: no collective was measured. The link figures below are memcpy self");
        out.line(
            fmt::format("#   copies ({:.2f} GB/s, {:.1f} us); a 1-GPU simulation never uses them.",
                        f.link_gbytes_per_s, f.latency_us));
        return;
    }
    // A title line, then each measured size and its time.
    auto points = [&](const std::string& title, const std::vector<CollectivePoint>& pts) {
        out.line(title);
        std::string sizes = "#    ";
        for (const auto& p : pts) sizes += fmt::format(" {:.0f}: {:.3g}", p.bytes, p.time_s);
        out.line(sizes);
    };
    points(fmt::format("#   MPI over {} ranks, all_reduce (bytes: s):", coll.ranks),
           coll.all_reduce);
    points("#   reduce_scatter (input bytes: s):", coll.reduce_scatter);
    points("#   all_gather (output bytes: s):", coll.all_gather);
    points("#   all_to_all_v (bytes sent per rank: s):", coll.all_to_all);
    out.line(fmt::format(
        "#   alpha-beta fits: all_reduce (ring) {:.2f} GB/s, {:.1f} us per step; "
        "all_to_all {:.2f} GB/s, {:.1f} us; reduce_scatter {:.2f} GB/s; "
        "all_gather {:.2f} GB/s",
        f.all_reduce_gbytes_per_s, f.latency_us, f.all_to_all_gbytes_per_s, f.all_to_all_latency_us,
        f.reduce_scatter_gbytes_per_s, f.all_gather_gbytes_per_s));
}

// What the file sets without measuring it, and why.
void write_unmeasured_note(TomlText& out) {
    out.line(
        "# Memory: the stream rate (the sim counts 4-byte activations at precision fp32, as the");
    out.line(
        "# engine moves them); the layers' memory-bound ops at the rmsnorm + SwiGLU rate instead");
    out.line(
        "# (bound by their arithmetic, they follow the threads, not the memory; the stream rate");
    out.line("# stays for the byte side of the GEMMs and the optimizer).");
    out.line("# Not measured (set): host overhead 0 (the CPU is its own");
    out.line("# host), scale-out = scale-up (one node), comm_sm_fraction 1: the engine posts each");
    out.line("# gradient bucket's collective during the backward, but its bytes are copied by the");
    out.line("# ranks' own cores, all busy computing, so the sync is as if not overlapped.");
    out.line("");
}

// [gpu]: a rank, its fitted peak, its memory and stream rate.
void write_gpu(TomlText& out, const MachineInfo& m, const ComputeMeasurements& c,
               const CalibrationFit& f) {
    const double tflops = f.peak_gflops / 1e3;
    out.line("[gpu]");
    out.line(fmt::format("name = \"{} ({} threads)\"", m.cpu_name, c.threads));
    out.line(fmt::format("peak_dense_tflops = {{ fp32 = {:.6g}, bf16 = {:.6g}, tf32 = {:.6g} }}",
                         tflops, tflops, tflops));
    out.line(fmt::format("hbm_gib = {:.2f}", m.memory_gib));
    out.line(fmt::format("hbm_gbytes_per_s = {:.4g}", c.stream_gbytes_per_s));
    out.line(fmt::format("exp_per_s = {:.4g}", c.exp_per_s));
    out.line("");
}

// [scale_up] and [scale_out]: both the node's ranks, at the best collective fit's rate.
void write_tiers(TomlText& out, const MachineInfo& m, const CalibrationFit& f, double link) {
    for (const char* tier : {"scale_up", "scale_out"}) {
        out.line(fmt::format("[{}]", tier));
        if (std::string(tier) == "scale_up") {
            out.line(fmt::format("domain_gpus = {}", m.ranks_on_node));
        }
        out.line(fmt::format("gbytes_per_s = {:.4g}", link));
        out.line(fmt::format("latency_us = {:.3g}", f.latency_us));
        out.line(fmt::format("{} = false", std::string(tier) == "scale_up"
                                               ? "in_switch_reduction"
                                               : "in_network_reduction"));
        out.line("");
    }
}

// [efficiency.gemm], [efficiency.grouped_gemm] and [efficiency.attention]: the compute fits.
void write_compute_efficiency(TomlText& out, const ComputeMeasurements& c,
                              const CalibrationFit& f) {
    out.line("[efficiency.gemm]");
    out.line(
        "max_efficiency = { fp32 = 1.0, bf16 = 1.0, tf32 = 1.0 }  # the peak is the fit's "
        "asymptote");
    out.line(fmt::format("half_saturation_dim = {:.4g}", f.gemm_half_dim));
    out.line(fmt::format("threads = {}", c.threads));
    out.line(fmt::format("serial_below_flops = {:.6g}  # smaller GEMMs run on one thread",
                         f.serial_gemm_below_flops));
    out.line("");
    out.line("[efficiency.grouped_gemm]");
    out.line(fmt::format("ratio_to_dense = {:.4g}", f.grouped_ratio));
    out.line(fmt::format("half_saturation_tokens_per_expert = {:.4g}", f.grouped_half_tokens));
    out.line("");
    out.line("[efficiency.attention]");
    out.line(
        fmt::format("fwd_efficiency = {:.4g}  # the largest measured shape's", f.attention_fwd));
    out.line(fmt::format("bwd_efficiency = {:.4g}", f.attention_bwd));
    out.line("exp_efficiency = 1.0");
    out.line(
        "# The measured shapes, by work per query S (Dqk + Dv): the sim interpolates in log work.");
    const auto& attn = f.attention_by_work;
    out.line("work_per_query = " +
             toml_array(attn, [](const AttentionFitPoint& p) { return p.work_per_query; }));
    out.line("fwd_efficiency_at_work = " +
             toml_array(attn, [](const AttentionFitPoint& p) { return p.fwd; }));
    out.line("bwd_efficiency_at_work = " +
             toml_array(attn, [](const AttentionFitPoint& p) { return p.bwd; }));
    out.line("");
}

// [efficiency.memory]: the stream rate, and the layers' memory-bound ops by size.
void write_memory_efficiency(TomlText& out, const CalibrationFit& f) {
    out.line("[efficiency.memory]");
    out.line(fmt::format("bandwidth_efficiency = {:.4g}", f.memory_bw_efficiency));
    if (f.memory_ops_bw_efficiency > 0) {
        out.line(
            fmt::format("memory_ops_bandwidth_efficiency = {:.4g}  # the largest measured size's",
                        f.memory_ops_bw_efficiency));
        out.line(
            "# The measured sizes, by bytes one kernel call moves: the sim interpolates in log");
        out.line("# bytes (above 1: the call stays in a cache the stream rate does not measure).");
        using MemoryPoint = CalibrationFit::MemoryOpsFitPoint;
        const auto& mem = f.memory_ops_by_bytes;
        out.line("memory_ops_bytes = " +
                 toml_array(mem, [](const MemoryPoint& p) { return p.bytes_per_call; }));
        out.line("memory_ops_efficiency_at_bytes = " +
                 toml_array(mem, [](const MemoryPoint& p) { return p.efficiency; }));
    }
    out.line("");
}

// [efficiency.kernel]: a kernel call's fixed cost is the parallel region's; the CPU is its own
// host.
void write_kernel_efficiency(TomlText& out, const ComputeMeasurements& c) {
    out.line("[efficiency.kernel]");
    out.line(fmt::format("gpu_overhead_us = {:.4g}", c.call_overhead_s * 1e6));
    out.line("host_overhead_us = 0");
    out.line("graph_launch_us = 0");
    out.line("");
}

// [efficiency.collectives]: each collective's fit over the link rate.
void write_collective_efficiency(TomlText& out, const CalibrationFit& f, double link) {
    const double ar_eff = clamp_fraction(f.all_reduce_gbytes_per_s / link);
    const double a2a_eff = clamp_fraction(f.all_to_all_gbytes_per_s / link);
    out.line("[efficiency.collectives]");
    out.line(fmt::format("scale_up_bw_efficiency = {:.4g}", ar_eff));
    out.line(fmt::format("scale_out_bw_efficiency = {:.4g}", ar_eff));
    out.line(fmt::format("all_to_all_bw_efficiency = {:.4g}", a2a_eff));
    if (f.reduce_scatter_gbytes_per_s > 0) {
        out.line(fmt::format("reduce_scatter_bw_efficiency = {:.4g}",
                             clamp_fraction(f.reduce_scatter_gbytes_per_s / link)));
        out.line(fmt::format("all_gather_bw_efficiency = {:.4g}",
                             clamp_fraction(f.all_gather_gbytes_per_s / link)));
    }
    out.line("comm_sm_fraction = 1  # the cores copy the collectives' bytes: nothing overlaps");
}

// [efficiency.variability]: how far the slowest rank ran behind, by block length (measured on
// more than one rank only).
void write_variability(TomlText& out, const CollectiveMeasurements& coll) {
    if (coll.slowest_rank.empty()) return;
    out.line("");
    out.line("[efficiency.variability]");
    std::string excess, block_ms, repetitions;
    for (const auto& p : coll.slowest_rank) {
        const char* sep = excess.empty() ? "" : ", ";
        excess += fmt::format("{}{:.4g}", sep, p.excess);
        block_ms += fmt::format("{}{:.4g}", sep, 1e3 * p.block_s);
        repetitions += fmt::format("{}{}", sep, p.repetitions);
    }
    out.line(fmt::format(
        "# Blocks of compute started together on every rank ({} times each): the slowest",
        repetitions));
    out.line("# ran this far behind the ranks' mean, by the block's duration");
    out.line(fmt::format("slowest_rank_excess = [{}]", excess));
    out.line(fmt::format("slowest_rank_excess_block_ms = [{}]", block_ms));
    out.line(fmt::format("slowest_rank_excess_ranks = {}", coll.ranks));
}

}  // namespace

std::string format_cluster_toml(const std::string& name, const MachineInfo& m,
                                const ComputeMeasurements& c, const CollectiveMeasurements& coll,
                                const CalibrationFit& f) {
    TomlText out;
    // The header: what was measured and fitted, and what was not.
    write_preamble(out, name, m, c);
    write_compute_measurements(out, c, f);
    write_collective_measurements(out, coll, f);
    write_unmeasured_note(out);
    // The cluster file proper.
    out.line(fmt::format("name = \"{}\"", name));
    out.line("");
    write_gpu(out, m, c, f);
    const double link = std::max(f.link_gbytes_per_s, 1e-3);
    write_tiers(out, m, f, link);
    out.line("[efficiency]");
    out.line("arch = \"calibrated-cpu\"");
    out.line("");
    write_compute_efficiency(out, c, f);
    write_memory_efficiency(out, f);
    write_kernel_efficiency(out, c);
    write_collective_efficiency(out, f, link);
    write_variability(out, coll);
    return out.text;
}

}  // namespace moetron::calibrate
