// Compute time of one op: a roofline (the slower of FLOPs at an efficient fraction of the
// tensor-core peak and bytes at a fraction of the HBM bandwidth) plus a fixed cost per kernel.
// The efficiency curves (EfficiencyParams) depend on the op:
//   GEMM          gemm_max[rate] * s(m) s(n) s(k),  s(x) = x / (x + half_dim), times
//                 1/threads for a GEMM a calibrated CPU runs on one thread (below
//                 serial_gemm_below_flops; the grouped GEMM hands whole experts to threads)
//   grouped GEMM  the same with grouped_ratio, and m = tokens per expert with its own half point
//   attention     bf16 peak * attention_fwd|bwd, or the SFU exponentials, whichever is slower;
//                 a calibrated CPU's efficiency instead follows its measured curve over the work
//                 per query S (Dqk + Dv) (attention_efficiency)
//   memory-bound  HBM bandwidth * memory_ops_bw (a calibrated CPU's own kernels), else memory_bw;
//                 a calibrated CPU's follows its measured curve over the bytes of one kernel call
//                 (memory_ops_efficiency)
// Host time is the eager launch cost of the op's kernels (zero when a CUDA graph holds it).
#pragma once

#include "moetron/sim/hardware.h"
#include "moetron/sim/ops.h"

namespace moetron::sim {

double gemm_efficiency(const EfficiencyParams& e, MathRate rate, double m, double n, double k);
double grouped_gemm_efficiency(const EfficiencyParams& e, MathRate rate, double tokens_per_expert,
                               double n, double k);

// Fraction of the bf16 peak the attention core reaches, forward or backward, at this work per
// query: the measured curve interpolated in log work (flat outside it), or the constant.
double attention_efficiency(const EfficiencyParams& e, bool backward, double work_per_query);

// Fraction of the HBM bandwidth the layers' memory-bound ops reach, at this many bytes per kernel
// call: the measured curve interpolated in log bytes (flat outside it), else memory_ops_bw, else
// memory_bw.
double memory_ops_efficiency(const EfficiencyParams& e, double bytes_per_call);

// GPU time of a compute or memory op (comm and sync ops: their comm time / 0).
double op_gpu_time_s(const ClusterSpec& c, const Op& op);
// Host time to launch the op eagerly.
double op_host_time_s(const ClusterSpec& c, const Op& op);

}  // namespace moetron::sim
