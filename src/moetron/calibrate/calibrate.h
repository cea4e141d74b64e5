// Calibration of the cluster model on this machine (`moetron calibrate`): measures the CPU
// kernels the engine runs (sgemm at several shapes, the grouped expert GEMM at several tokens per
// expert, causal attention forward and backward, a streaming kernel, exponentials, the fixed cost
// of one parallel kernel call) and, on an MPI job of more than one rank, all_reduce and
// all_to_all_v at several sizes; fits the sim's efficiency curves and alpha-beta costs to them and
// writes a cluster file (configs/clusters/*.toml format, inline [efficiency] table) that
// sim::load_cluster_spec reads back. The "GPU" of that file is one rank: its threads, its share of
// the node's memory; the scale-up domain is the ranks of this node.
//
// Depends on kernels/ and parallel/ only; sim/ never sees this code, it only reads the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moetron::parallel {
class Communicator;
}

namespace moetron::calibrate {

struct CalibrateOptions {
    double seconds_per_point = 0.05;  // minimum timed time per measured shape (after a warm-up)
    bool quick = false;               // fewer and smaller shapes (tests)
    // The compute kernels are measured in this many rounds, every shape once per round, and each
    // keeps its median over the rounds: on a shared machine another process's burst of a few
    // seconds then spoils one round of the shapes it overlaps, not the file (issue 17: a burst
    // halved the measured rate of every 2048-row GEMM of one calibration, and the sim
    // over-predicted small by 13% on it).
    int rounds = 3;
};

// One measured GEMM shape: out (m x n) = in (m x k) W (k x n), like the sim's Op.
struct GemmPoint {
    int64_t m = 0, n = 0, k = 0;
    double gflops = 0;
};

// One grouped-GEMM measurement: num_experts segments of tokens_per_expert rows each.
struct GroupedPoint {
    int64_t tokens_per_expert = 0, num_experts = 0, n = 0, k = 0;
    double gflops = 0;
};

struct AttentionPoint {
    int64_t batch = 0, seq_len = 0, heads = 0, qk_dim = 0, v_dim = 0;
    double fwd_gflops = 0, bwd_gflops = 0;  // the sim's FLOP convention (causal; bwd = 2.5 fwd)
};

// One measurement of the engine's memory-bound kernels, forward and backward: rmsnorm over
// (rows, dim) and SwiGLU over (rows, 2 ffn) -> (rows, ffn).
struct MemoryKernelsPoint {
    int64_t rows = 0, dim = 0, ffn = 0;
    double gbytes_per_s = 0;  // the fp32 bytes they must move (each input read, each output
                              // written once) per second
    double bytes() const;     // those bytes, all four calls
    double bytes_per_call() const { return bytes() / 4; }
};

// One collective size: bytes per rank (all_reduce: the buffer; reduce_scatter: its input;
// all_gather: its output; all_to_all_v: what one rank sends in all, split evenly over the
// ranks) and the time (the mean of the ranks' medians).
struct CollectivePoint {
    double bytes = 0;
    double time_s = 0;
};

struct ComputeMeasurements {
    int threads = 0;
    int rounds = 1;        // each figure is the median over this many rounds (CalibrateOptions)
    int64_t l2_bytes = 0;  // one core's L2 cache (0: unknown), see gemm_operand_copies
    std::vector<GemmPoint> gemm;
    std::vector<GroupedPoint> grouped;
    std::vector<AttentionPoint> attention;
    double stream_gbytes_per_s = 0;  // triad a = b + s c, 12 bytes per element
    // rmsnorm and SwiGLU forward + backward (the engine's kernels) at a few sizes, increasing:
    // from one whose arrays stay in a core's L2 to one that streams from memory.
    std::vector<MemoryKernelsPoint> memory_kernels;
    double exp_per_s = 0;        // std::exp over a float array, all threads
    double call_overhead_s = 0;  // one empty OpenMP parallel region (a kernel's fixed cost)
};

struct CollectiveMeasurements {
    int ranks = 1;
    std::vector<CollectivePoint> all_reduce;
    std::vector<CollectivePoint> reduce_scatter;  // the gradient sync's, at bucket sizes
    std::vector<CollectivePoint> all_gather;
    std::vector<CollectivePoint> all_to_all;
    // The same fixed block of compute (linear layers' forward and backward), started together on
    // every rank, `repetitions` times: how far the slowest rank ran behind the ranks' mean, as a
    // fraction of the mean, averaged over the repetitions. A synchronizing collective waits that
    // long (sim: slowest_of_n). Measured at several block lengths, shortest first, because on a
    // shared machine the excess is noise that averages out over a longer interval between two
    // synchronizations, where a GPU's slower clock would not. Empty on one rank.
    struct SlowestRankPoint {
        double block_s = 0;  // the block's duration: its fastest run on any rank
        int repetitions = 0;
        double excess = 0;
    };
    std::vector<SlowestRankPoint> slowest_rank;
};

// The attention efficiency at one measured shape (sim: AttentionEfficiencyPoint).
struct AttentionFitPoint {
    double work_per_query = 0;  // S (Dqk + Dv)
    double fwd = 0, bwd = 0;    // fractions of peak_gflops
};

// Fitted parameters of the sim's curves (docs/cluster-model.md "Compute time").
struct CalibrationFit {
    double peak_gflops = 0;  // the sgemm asymptote of the fit (the file's fp32 peak)
    double gemm_half_dim = 0;
    // GEMMs under this many FLOPs ran on one of the threads (fitted: the split point that
    // explains the measurements best; 0 with one thread or when every GEMM was split).
    double serial_gemm_below_flops = 0;
    double grouped_ratio = 0;
    double grouped_half_tokens = 0;
    // Attention: each measured shape's fraction of peak_gflops, by increasing work per query (the
    // sim interpolates between them), and the largest shape's, the file's constant.
    std::vector<AttentionFitPoint> attention_by_work;
    double attention_fwd = 0;
    double attention_bwd = 0;
    double memory_bw_efficiency = 0;
    // The layers' memory-bound ops at the engine's rmsnorm + SwiGLU rate, over the stream rate:
    // at each measured size (bytes per kernel call, increasing; above 1 in cache), and the
    // largest size's, the file's constant (0: not measured).
    struct MemoryOpsFitPoint {
        double bytes_per_call = 0;
        double efficiency = 0;
    };
    std::vector<MemoryOpsFitPoint> memory_ops_by_bytes;
    double memory_ops_bw_efficiency = 0;
    double gemm_fit_rms_rel_error = 0;  // rms log error of the GEMM points, each counted once
    // Collectives: alpha per ring step and bandwidth of each fit (1 rank: self copies).
    bool collectives_measured = false;
    double link_gbytes_per_s = 0;  // the best of the two fits; efficiencies are relative to it
    double latency_us = 0;
    double all_reduce_gbytes_per_s = 0;
    double all_to_all_gbytes_per_s = 0;
    double all_to_all_latency_us = 0;
    // The gradient sync's collectives, each its own ring fit (0: not measured, one rank).
    double reduce_scatter_gbytes_per_s = 0;
    double all_gather_gbytes_per_s = 0;
};

// The fixed facts of the machine and the run that the file header records.
struct MachineInfo {
    std::string cpu_name;   // /proc/cpuinfo "model name", or "cpu"
    int ranks_on_node = 1;  // the scale-up domain
    double memory_gib = 0;  // per rank: the node's physical memory / ranks
    std::string command;    // how it was measured
    std::string timestamp;  // UTC, ISO 8601
};

// How many copies of a GEMM's operands (`bytes` in all) calibrate cycles through, so that each
// call finds them where a training step would. A step's GEMM reads what the op before it just
// wrote. On a rank of one thread that is still in its core's L2 when it fits (measured on the
// 2-core machine: tiny's GEMM shapes run 1.2-1.4x faster from there than from L3, and tiny's
// whole step lives in the caches), so such a GEMM is measured in place (1 copy). Otherwise, a
// larger set or a rank whose threads each wrote part of the input in their own core's cache,
// the operands are cycled through about 64 MiB (1 MiB with quick), at most 64 copies, so that
// they come from outside this core's caches.
int64_t gemm_operand_copies(double bytes, int threads, int64_t l2_bytes, bool quick);

ComputeMeasurements measure_compute(const CalibrateOptions& options);
// Each figure's median over rounds of the same measurements (same shapes in the same order).
ComputeMeasurements median_of_rounds(const std::vector<ComputeMeasurements>& rounds);
// Collective measurements over `world` (every rank calls it). Needs world.size() > 1.
CollectiveMeasurements measure_collectives(parallel::Communicator& world,
                                           const CalibrateOptions& options);
// Self-copy bandwidth (memcpy of the same sizes) for a 1-rank calibration.
CollectiveMeasurements measure_self_copies(const CalibrateOptions& options);

CalibrationFit fit_calibration(const ComputeMeasurements& compute,
                               const CollectiveMeasurements& collectives);

// The cluster file text (TOML), with a comment header of what was measured, when and how.
std::string format_cluster_toml(const std::string& name, const MachineInfo& machine,
                                const ComputeMeasurements& compute,
                                const CollectiveMeasurements& collectives,
                                const CalibrationFit& fit);

MachineInfo detect_machine(int ranks_on_node, const std::string& command);

}  // namespace moetron::calibrate
