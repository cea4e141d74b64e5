// The hardware catalog: one cluster file (configs/clusters/*.toml) describes a GPU, its scale-up
// domain (NVLink) and its scale-out network, plus the efficiency parameters of its architecture.
// Efficiency parameters come from one shared file per architecture (configs/clusters/efficiency/
// hopper.toml, blackwell.toml) selected by `efficiency = "<arch>"`, or from an inline
// [efficiency] table (what a calibrated cluster, e.g. a CPU measured by `moetron calibrate`,
// writes). Units are in the names: _tflops (1e12 FLOP/s), _gib (2^30 bytes, as nvidia-smi
// reports memory), _gbytes_per_s (1e9 bytes/s), _us.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moetron/core/precision.h"

namespace moetron::sim {

// The rate classes of the GPU's matrix units: the keys of a cluster file's peak_dense_tflops and
// of an efficiency set's gemm max_efficiency (the hardware's, not recipes). A training recipe
// (core/precision.h, --precision) runs its GEMMs at one of them (math_rate_of). tf32 is the router
// GEMM's: Megatron keeps it in fp32 (--moe-router-dtype fp32) and NGC PyTorch containers run fp32
// matmuls on TF32 tensor cores (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1); no recipe runs at it. fp32 is
// a CPU "cluster" measured by `moetron calibrate`, whose engine computes everything in single
// precision.
enum class MathRate : uint8_t { tf32, bf16, fp8, mxfp8, fp4, fp32 };
inline constexpr int kNumMathRates = 6;

// "tf32", "bf16", "fp8", "mxfp8", "fp4", "fp32": the cluster files' keys.
std::string_view math_rate_key(MathRate rate);
// A cluster file's key ("nvfp4" reads as fp4); throws a user error naming the known keys.
MathRate math_rate_from_key(std::string_view key);
// The rate a recipe's GEMMs run at: fp32, bf16 and mxfp8 at their own, fp8-blockwise at the plain
// FP8 one (DeepSeek-V3 scales its blocks around FP8 tensor-core GEMMs), nvfp4 at fp4.
MathRate math_rate_of(Precision recipe);
// Bytes per element of a GEMM operand at this rate (scales ignored: < 4%).
double operand_bytes(MathRate rate);
// The rate of the GEMMs a recipe keeps out of low precision (the LM head), and the format of
// what it keeps in high precision whatever its GEMM format: activations, their gradients and the
// model's weights. The fp32 recipe (this engine on a CPU) keeps them in fp32; bf16 and the
// low-precision recipes in bf16 (Megatron-LM's --bf16 with Transformer Engine's fp8/fp4 GEMMs).
MathRate high_precision_rate(Precision recipe);
// Its bytes per element: 4 at fp32, 2 otherwise.
double high_precision_bytes(Precision recipe);
// mxfp8, fp8-blockwise and nvfp4: GEMM inputs quantized, with scales.
bool is_low_precision(Precision recipe);

// Per-rate values (peak FLOP/s, efficiencies). Absent entries are NaN.
struct PerMathRate {
    std::array<double, kNumMathRates> values;
    PerMathRate();
    bool has(MathRate rate) const;
    double at(MathRate rate) const;  // throws if absent
    void set(MathRate rate, double v) { values[static_cast<int>(rate)] = v; }
};

// Slowest-of-N: every synchronizing collective waits for its slowest member. GPUs of one SKU
// differ in speed (a spread with standard deviation gpu_speed_sigma, so the slowest of N runs
// ~sigma sqrt(2 ln N) behind the mean), and now and then a GPU straggles for a step (with
// probability straggler_rate per GPU and step, by straggler_slowdown of the step).
struct VariabilitySpec {
    // The spread of the GPUs' speed (a fraction). A GPU's slower clock lasts (the published
    // figures: sigma_interval_s 0); a shared machine's noise averages out over a longer interval
    // between two synchronizations: sigma(T) = gpu_speed_sigma (T / sigma_interval_s)^-exponent
    // for T past the interval, the exponent between 0 (lasting) and 1/2 (independent noise).
    double gpu_speed_sigma = 0;
    double sigma_interval_s = 0;
    double sigma_exponent = 0;
    double straggler_rate = 0;
    double straggler_slowdown = 0;
    double sigma_over(double interval_s) const;
};

// The expected slowdown of a step that N GPUs synchronize every interval_s, split into the
// part the EP collectives see (slowest of the ep GPUs of one group) and what the DP collectives
// add (slowest of all N), plus straggler events: fractions of the step.
struct SlowestOfN {
    double ep_jitter = 0, dp_jitter = 0, stragglers = 0;
    double total() const { return ep_jitter + dp_jitter + stragglers; }
};
SlowestOfN slowest_of_n(const VariabilitySpec& v, int64_t gpus, int64_t ep, double interval_s);
// How far the slowest of n draws of a Gaussian lies above their mean, in standard deviations:
// ~sqrt(2 ln n) (0 for one).
double slowest_of_n_sigmas(int64_t n);

// An attention efficiency measured at one shape: work_per_query = S (Dqk + Dv), the key
// length times the head dims one query's scores and output use.
struct AttentionEfficiencyPoint {
    double work_per_query = 0;
    double fwd = 0, bwd = 0;  // fractions of the bf16 peak
};

// A memory-bound kernel's rate measured at one size: bytes = what one kernel call reads and
// writes; efficiency = its rate over the HBM bandwidth. Above 1 where the call's bytes fit in a
// cache the stream rate does not measure.
struct MemoryOpsEfficiencyPoint {
    double bytes = 0;
    double efficiency = 0;
};

// Efficiency of an architecture's kernels and collectives: fractions of peak that real kernels
// reach, and fixed costs. One set per architecture, the same for every data point.
struct EfficiencyParams {
    std::string arch;  // "hopper", "blackwell", "calibrated-cpu", ...

    // Dense GEMM: eff = gemm_max[rate] * s(m) * s(n) * s(k), s(x) = x / (x + half_dim): small
    // dimensions waste tiles (wave quantization, pipeline fill).
    PerMathRate gemm_max;
    double gemm_half_dim = 64;
    // A calibrated CPU rank: a GEMM of fewer FLOPs than serial_gemm_below_flops runs on one of
    // its `threads` threads (the engine splits only larger ones, kernels/cpu/matmul.cpp), so it
    // gets 1/threads of the all-threads peak; 0 (GPUs): every GEMM uses the whole device.
    double serial_gemm_below_flops = 0;
    int64_t threads = 1;
    // Grouped GEMM (one GEMM per local expert): the dense curve times grouped_ratio, and the
    // per-expert token count plays the role of m with its own half-saturation point.
    double grouped_ratio = 0.9;
    double grouped_half_tokens = 256;
    // Flash attention (bf16): fraction of the bf16 peak, forward and backward; the softmax
    // exponentials also bound it (exp_efficiency of the SFU rate), whichever is slower.
    double attention_fwd = 0.5;
    double attention_bwd = 0.4;
    // A calibrated CPU's attention, measured at a few shapes: its efficiency falls steeply with
    // the work per query S (Dqk + Dv) (short sequences and narrow heads make small tiles), so a
    // constant would misprice one shape or the other. Sorted by work; interpolated in log work,
    // constant outside the measured range. Empty (GPUs): attention_fwd / attention_bwd.
    std::vector<AttentionEfficiencyPoint> attention_by_work;
    double exp_efficiency = 0.8;
    // Memory-bound kernels reach this fraction of the HBM bandwidth.
    double memory_bw = 0.75;
    // The memory-bound ops of the layers (OpKind::memory: norms, activations, RoPE, permutes,
    // residual adds) reach this fraction instead; 0: memory_bw. A calibrated CPU measures its
    // engine's own kernels for it: they are bound by their arithmetic (exponentials, square
    // roots) more than by bytes, so on one thread they run at half the stream rate while
    // memory_bw, the stream rate, stays for the byte side of the GEMMs and the optimizer.
    double memory_ops_bw = 0;
    // A calibrated CPU's rate of those kernels at a few sizes: a call whose bytes stay in a cache
    // runs at up to twice the rate of one that streams from memory (the 2-core machine: rmsnorm +
    // SwiGLU at 512 x 64 ran at 33 GB/s on two threads, at 4,096 x 512 at 19), so one rate
    // misprices tiny's ops or small's. Sorted by bytes per kernel call; interpolated in log bytes,
    // constant outside the measured range. Empty (GPUs): memory_ops_bw.
    std::vector<MemoryOpsEfficiencyPoint> memory_ops_by_bytes;
    // Fixed costs per kernel: on the GPU (launch latency and tail) and on the host (an eager
    // framework call: Python, dispatcher, launch). CUDA graphs remove the host part.
    double kernel_gpu_overhead_s = 2e-6;
    double kernel_host_overhead_s = 10e-6;
    double graph_launch_s = 15e-6;
    // Collectives: fraction of link bandwidth reached per tier, and all-to-all (dispatch and
    // combine kernels) as its own figure.
    double scale_up_bw = 0.8;
    double scale_out_bw = 0.85;
    double all_to_all_bw = 0.75;
    // The gradient sync's reduce-scatter and all-gather, each on both tiers in place of the
    // tier's figure; 0: the tier's. NCCL's rings reach about the all-reduce's bus bandwidth for
    // all three, so the GPU sets leave them out; a calibrated CPU measures them, since its MPI
    // runs them by other algorithms (the 2-core machine, 2 ranks: a 2 MB all-gather 3-5x faster
    // than a 2 MB all-reduce, a reduce-scatter 1.5-3.5x).
    double reduce_scatter_bw = 0;
    double all_gather_bw = 0;
    // Fraction of SMs a communication kernel occupies while it overlaps compute; 1 on a
    // calibrated CPU, whose cores move a collective's bytes themselves (nothing overlaps).
    double comm_sm_fraction = 0.1;
    // GPU speed spread and stragglers of the fleet (a cluster file's [variability] overrides).
    VariabilitySpec variability;
};

struct GpuSpec {
    std::string name;
    PerMathRate peak_dense_tflops;  // dense (no sparsity) tensor-core peak per rate class
    double hbm_bytes = 0;
    double hbm_bytes_per_s = 0;
    double exp_per_s = 0;  // special-function unit exponentials per second (softmax)
    // Copy bandwidth to host memory per direction, as a copy engine reaches it (PCIe or
    // NVLink-C2C); what activation offloading moves. 0: not given (offloading is refused).
    double host_link_bytes_per_s = 0;
};

struct ScaleUpSpec {
    int64_t domain_gpus = 1;           // GPUs per NVLink domain (8 for HGX, 72 for NVL72)
    double bytes_per_s = 0;            // per GPU per direction
    double latency_s = 0;              // alpha of one collective step inside the domain
    bool in_switch_reduction = false;  // NVLS (NVLink SHARP) all-reduce
};

// The scale-out fabric, from `fabric = "<name>"` (configs/clusters/fabrics/<name>.toml) and/or
// the cluster file's own keys, which override the fabric's.
struct ScaleOutSpec {
    std::string fabric;                 // "ib-ndr", "ib-xdr", "spectrum-x", or "" (inline)
    double bytes_per_s = 0;             // per GPU per direction (its NIC)
    double latency_s = 0;               // alpha of one step across domains
    bool in_network_reduction = false;  // SHARP in the switches (not used by the model yet)
    // Congestion: a rail-optimized fat tree puts switch_radix / 2 domains under one leaf
    // switch; a group spanning more domains crosses the spine, where flow collisions leave
    // spine_efficiency of the bandwidth (adaptive routing keeps it high).
    int64_t switch_radix = 0;  // 0: no spine modelled
    double spine_efficiency = 1;
};

struct ClusterSpec {
    std::string name;
    std::string source;  // the file it came from
    GpuSpec gpu;
    ScaleUpSpec scale_up;
    ScaleOutSpec scale_out;
    EfficiencyParams efficiency;

    // Peak of a rate class in FLOP/s; throws when the cluster file lists none.
    double peak_flops(MathRate rate) const;
    // The peak a recipe's GEMMs run at; a user error naming the rates the cluster file lists when
    // its GPU lacks the recipe's.
    double recipe_peak_flops(Precision recipe) const;
};

// Loads a cluster file. `efficiency = "<arch>"` reads <dir of file>/efficiency/<arch>.toml,
// `fabric = "<name>"` under [scale_out] reads <dir of file>/fabrics/<name>.toml.
ClusterSpec load_cluster_spec(const std::string& path);
// The same from text; efficiency_dir is where `efficiency = "<arch>"` files are looked up
// (fabric files in its sibling fabrics/).
ClusterSpec parse_cluster_spec(std::string_view text, std::string_view source_name,
                               const std::string& efficiency_dir);
EfficiencyParams parse_efficiency_params(std::string_view text, std::string_view source_name);

}  // namespace moetron::sim
