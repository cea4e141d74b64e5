#include "moetron/sim/costs.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "moetron/core/error.h"

namespace moetron::sim {

namespace {

double saturation(double x, double half) {
    return x <= 0 ? 0 : x / (x + half);
}

// The share of the device one GEMM of these dimensions uses: all of it, or one thread of a CPU
// rank when the engine leaves a GEMM that small unsplit.
double thread_share(const EfficiencyParams& e, double m, double n, double k) {
    const bool serial = e.threads > 1 && 2 * m * n * k < e.serial_gemm_below_flops;
    return serial ? 1.0 / static_cast<double>(e.threads) : 1.0;
}

// A measured curve: y at x, piecewise linear in log x through the points (sorted by strictly
// increasing x), constant outside them.
template <class Point, class XOf, class YOf>
double interpolate_in_log(const std::vector<Point>& curve, double x, XOf x_of, YOf y_of) {
    MT_CHECK(!curve.empty(), "[sim] an efficiency curve without points");
    if (x <= x_of(curve.front())) return y_of(curve.front());
    if (x >= x_of(curve.back())) return y_of(curve.back());
    size_t i = 1;
    while (x_of(curve[i]) < x) ++i;
    const Point &lo = curve[i - 1], &hi = curve[i];
    const double t = std::log(x / x_of(lo)) / std::log(x_of(hi) / x_of(lo));
    return y_of(lo) + t * (y_of(hi) - y_of(lo));
}

}  // namespace

double gemm_efficiency(const EfficiencyParams& e, MathRate rate, double m, double n, double k) {
    const double h = e.gemm_half_dim;
    return e.gemm_max.at(rate) * saturation(m, h) * saturation(n, h) * saturation(k, h) *
           thread_share(e, m, n, k);
}

double grouped_gemm_efficiency(const EfficiencyParams& e, MathRate rate, double tokens_per_expert,
                               double n, double k) {
    const double h = e.gemm_half_dim;
    return e.gemm_max.at(rate) * e.grouped_ratio *
           saturation(tokens_per_expert, e.grouped_half_tokens) * saturation(n, h) *
           saturation(k, h);
}

double attention_efficiency(const EfficiencyParams& e, bool backward, double work_per_query) {
    if (e.attention_by_work.empty()) return backward ? e.attention_bwd : e.attention_fwd;
    return interpolate_in_log(
        e.attention_by_work, work_per_query,
        [](const AttentionEfficiencyPoint& p) { return p.work_per_query; },
        [backward](const AttentionEfficiencyPoint& p) { return backward ? p.bwd : p.fwd; });
}

double memory_ops_efficiency(const EfficiencyParams& e, double bytes_per_call) {
    if (e.memory_ops_by_bytes.empty()) return e.memory_ops_bw > 0 ? e.memory_ops_bw : e.memory_bw;
    return interpolate_in_log(
        e.memory_ops_by_bytes, bytes_per_call,
        [](const MemoryOpsEfficiencyPoint& p) { return p.bytes; },
        [](const MemoryOpsEfficiencyPoint& p) { return p.efficiency; });
}

double op_gpu_time_s(const ClusterSpec& c, const Op& op) {
    const EfficiencyParams& e = c.efficiency;
    const double fixed = op.kernels * e.kernel_gpu_overhead_s;
    const double mem_s = op.bytes / (c.gpu.hbm_bytes_per_s * e.memory_bw);
    switch (op.kind) {
        case OpKind::gemm: {
            if (op.flops <= 0) return mem_s + fixed;
            const double eff = gemm_efficiency(e, op.rate, op.m, op.n, op.k);
            return std::max(op.flops / (c.peak_flops(op.rate) * eff), mem_s) + fixed;
        }
        case OpKind::grouped_gemm: {
            if (op.flops <= 0) return mem_s + fixed;
            const double eff = grouped_gemm_efficiency(e, op.rate, op.m, op.n, op.k);
            return std::max(op.flops / (c.peak_flops(op.rate) * eff), mem_s) + fixed;
        }
        case OpKind::attention: {
            const double eff = attention_efficiency(e, op.attention_backward, op.work_per_query);
            const double math_s = op.flops / (c.peak_flops(MathRate::bf16) * eff);
            const double exp_s = op.exps / (c.gpu.exp_per_s * e.exp_efficiency);
            return std::max({math_s, exp_s, mem_s}) + fixed;
        }
        case OpKind::memory: {
            const double per_call = op.bytes / std::max(op.kernels, 1);
            return op.bytes / (c.gpu.hbm_bytes_per_s * memory_ops_efficiency(e, per_call)) + fixed;
        }
        case OpKind::copy:
            return mem_s + fixed;
        case OpKind::comm_tp:
        case OpKind::comm_ep:
        case OpKind::comm_cp:
            return op.comm.time_s;
        case OpKind::sync:
            return 0;
    }
    return 0;
}

double op_host_time_s(const ClusterSpec& c, const Op& op) {
    return op.kernels * c.efficiency.kernel_host_overhead_s;
}

}  // namespace moetron::sim
