#include "moetron/sim/costs.h"

#include <algorithm>
#include <cmath>

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

}  // namespace

double gemm_efficiency(const EfficiencyParams& e, Precision p, double m, double n, double k) {
    const double h = e.gemm_half_dim;
    return e.gemm_max.at(p) * saturation(m, h) * saturation(n, h) * saturation(k, h) *
           thread_share(e, m, n, k);
}

double grouped_gemm_efficiency(const EfficiencyParams& e, Precision p, double tokens_per_expert,
                               double n, double k) {
    const double h = e.gemm_half_dim;
    return e.gemm_max.at(p) * e.grouped_ratio *
           saturation(tokens_per_expert, e.grouped_half_tokens) * saturation(n, h) *
           saturation(k, h);
}

double attention_efficiency(const EfficiencyParams& e, bool backward, double work_per_query) {
    const auto& curve = e.attention_by_work;
    auto at = [backward](const AttentionEfficiencyPoint& p) { return backward ? p.bwd : p.fwd; };
    if (curve.empty()) return backward ? e.attention_bwd : e.attention_fwd;
    if (work_per_query <= curve.front().work_per_query) return at(curve.front());
    if (work_per_query >= curve.back().work_per_query) return at(curve.back());
    size_t i = 1;
    while (curve[i].work_per_query < work_per_query) ++i;
    const AttentionEfficiencyPoint &lo = curve[i - 1], &hi = curve[i];
    const double t = std::log(work_per_query / lo.work_per_query) /
                     std::log(hi.work_per_query / lo.work_per_query);
    return at(lo) + t * (at(hi) - at(lo));
}

double op_gpu_time_s(const ClusterSpec& c, const Op& op) {
    const EfficiencyParams& e = c.efficiency;
    const double fixed = op.kernels * e.kernel_gpu_overhead_s;
    const double mem_s = op.bytes / (c.gpu.hbm_bytes_per_s * e.memory_bw);
    switch (op.kind) {
        case OpKind::gemm: {
            if (op.flops <= 0) return mem_s + fixed;
            const double eff = gemm_efficiency(e, op.precision, op.m, op.n, op.k);
            return std::max(op.flops / (c.peak_flops(op.precision) * eff), mem_s) + fixed;
        }
        case OpKind::grouped_gemm: {
            if (op.flops <= 0) return mem_s + fixed;
            const double eff = grouped_gemm_efficiency(e, op.precision, op.m, op.n, op.k);
            return std::max(op.flops / (c.peak_flops(op.precision) * eff), mem_s) + fixed;
        }
        case OpKind::attention: {
            const double eff = attention_efficiency(e, op.attention_backward, op.work_per_query);
            const double math_s = op.flops / (c.peak_flops(Precision::bf16) * eff);
            const double exp_s = op.exps / (c.gpu.exp_per_s * e.exp_efficiency);
            return std::max({math_s, exp_s, mem_s}) + fixed;
        }
        case OpKind::memory: {
            const double bw = e.memory_ops_bw > 0 ? e.memory_ops_bw : e.memory_bw;
            return op.bytes / (c.gpu.hbm_bytes_per_s * bw) + fixed;
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
