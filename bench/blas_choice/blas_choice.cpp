// OpenBLAS vs oneDNN on moetron's training GEMM shapes (DESIGN.md section 7: "measure on our
// shapes"). A standalone program built by run.sh, not by the main CMake, so the product does not
// depend on oneDNN. Prints GFLOP/s of cblas_sgemm and dnnl_sgemm per shape, then the grouped
// expert GEMM both ways: one BLAS call per expert in sequence (the library threads inside each
// call) and an OpenMP loop over experts with single-threaded calls.
//
// Usage: blas_choice openblas|onednn all|one [min_seconds_per_measurement]   (default 0.3)
// "all" uses every core (wall time); "one" a single thread timed in its own CPU time, a per-core
// figure that holds on a busy shared machine.
// One library per process: OpenBLAS's pthreads and oneDNN's OpenMP threads both spin-wait after a
// call, so measuring both in one process on a small machine makes each steal the other's cores.
#include <cblas.h>
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

extern "C" {
// Declared by OpenBLAS but not in every cblas.h variant.
char* openblas_get_corename(void);
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
}

namespace {

struct Shape {
    const char* name;
    int64_t m, n, k;
    bool trans_a, trans_b;
};

// The GEMMs of one step of the `small` model style (N = 4096 tokens, D = 1024, dense F = 2816,
// expert F = 704) and MLA projections at DeepSeek-V3's ratios scaled down (q_lora 384, kv_lora
// 512 + rope 64, 8 heads of Dqk 192 / Dv 128). Forward y = x W^T is NT; the input gradient
// dout W is NN; the weight gradient dout^T x is TN.
const Shape kShapes[] = {
    {"mlp_up_fwd      4096x2816x1024 NT", 4096, 2816, 1024, false, true},
    {"mlp_down_fwd    4096x1024x2816 NT", 4096, 1024, 2816, false, true},
    {"mlp_down_dinp   4096x2816x1024 NN", 4096, 2816, 1024, false, false},
    {"mlp_up_dweight  2816x1024x4096 TN", 2816, 1024, 4096, true, false},
    {"mla_q_b_fwd     4096x1536x384  NT", 4096, 1536, 384, false, true},
    {"mla_kv_a_fwd    4096x576x1024  NT", 4096, 576, 1024, false, true},
    {"mla_kv_b_fwd    4096x2048x512  NT", 4096, 2048, 512, false, true},
    {"mla_o_fwd       4096x1024x1024 NT", 4096, 1024, 1024, false, true},
    {"expert_up_fwd   256x704x1024   NT", 256, 704, 1024, false, true},
    {"expert_down_fwd 256x1024x704   NT", 256, 1024, 704, false, true},
    {"expert_dinp     256x1024x704   NN", 256, 1024, 704, false, false},
    {"expert_dweight  704x1024x256   TN", 704, 1024, 256, true, false},
    {"expert_up_fwd   64x704x1024    NT", 64, 704, 1024, false, true},
    {"expert_up_fwd   16x704x1024    NT", 16, 704, 1024, false, true},
};

using GemmFn = void (*)(float* c, const float* a, const float* b, const Shape& s);

void gemm_openblas(float* c, const float* a, const float* b, const Shape& s) {
    const int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
    cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans,
                s.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(s.m), static_cast<int>(s.n),
                static_cast<int>(s.k), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                0.0f, c, static_cast<int>(s.n));
}

void gemm_onednn(float* c, const float* a, const float* b, const Shape& s) {
    const int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
    const dnnl_status_t status = dnnl_sgemm(s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.m, s.n,
                                            s.k, 1.0f, a, lda, b, ldb, 0.0f, c, s.n);
    if (status != dnnl_success) {
        std::fprintf(stderr, "dnnl_sgemm failed with status %d\n", static_cast<int>(status));
        std::exit(1);
    }
}

// Wall clock for the threaded runs; the calling thread's CPU time for single-threaded ones, which
// other processes on a shared machine do not inflate.
double now_s(bool thread_cpu_clock) {
    if (thread_cpu_clock) {
        timespec t{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
        return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Best-of-repeats GFLOP/s after one warm-up call: repeats until min_seconds have passed.
struct Timing {
    double min_seconds;     // keep repeating for this long
    bool thread_cpu_clock;  // see now_s
};

double measure_gflops(const std::function<void()>& run, double flops, const Timing& timing) {
    run();
    double best_s = 1e30, total_s = 0;
    while (total_s < timing.min_seconds) {
        const double t0 = now_s(timing.thread_cpu_clock);
        run();
        const double s = now_s(timing.thread_cpu_clock) - t0;
        best_s = std::min(best_s, s);
        total_s += s;
    }
    return flops / best_s * 1e-9;
}

std::vector<float> random_buffer(size_t n, unsigned seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(gen);
    return v;
}

// E experts, each M x O x I (forward NT), weights (E, O, I), contiguous row segments.
void grouped(GemmFn gemm, bool parallel_over_experts, float* out, const float* inp,
             const float* weight, int64_t num_experts, int64_t rows_per_expert, int64_t in_dim,
             int64_t out_dim) {
    const Shape s{"", rows_per_expert, out_dim, in_dim, false, true};
    if (parallel_over_experts) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t e = 0; e < num_experts; ++e) {
            gemm(out + e * rows_per_expert * out_dim, inp + e * rows_per_expert * in_dim,
                 weight + e * out_dim * in_dim, s);
        }
    } else {
        for (int64_t e = 0; e < num_experts; ++e) {
            gemm(out + e * rows_per_expert * out_dim, inp + e * rows_per_expert * in_dim,
                 weight + e * out_dim * in_dim, s);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    const std::string library = argc > 1 ? argv[1] : "", threads = argc > 2 ? argv[2] : "";
    if ((library != "openblas" && library != "onednn") || (threads != "all" && threads != "one")) {
        std::fprintf(stderr, "usage: blas_choice openblas|onednn all|one [min_seconds]\n");
        return 2;
    }
    const Timing timing{argc > 3 ? std::atof(argv[3]) : 0.3, threads == "one"};
    const bool use_openblas = library == "openblas";
    const GemmFn gemm = use_openblas ? gemm_openblas : gemm_onednn;
    if (threads == "one") {
        omp_set_num_threads(1);  // oneDNN follows OpenMP
        openblas_set_num_threads(1);
    }
    const int num_threads = omp_get_max_threads();
    if (use_openblas) {
        std::printf("OpenBLAS, core %s, %d threads", openblas_get_corename(),
                    openblas_get_num_threads());
    } else {
        const dnnl_version_t* version = dnnl_version();
        std::printf("oneDNN %d.%d.%d, %d OpenMP threads", version->major, version->minor,
                    version->patch, num_threads);
    }
    std::printf(timing.thread_cpu_clock ? ", timed in thread CPU time\n"
                                        : ", timed in wall time\n");
    std::printf("%-36s %10s\n", "shape (M x N x K, op)", "GFLOP/s");
    for (const Shape& s : kShapes) {
        const auto a = random_buffer(static_cast<size_t>(s.m * s.k), 1);
        const auto b = random_buffer(static_cast<size_t>(s.k * s.n), 2);
        std::vector<float> c(static_cast<size_t>(s.m * s.n));
        const double flops = 2.0 * s.m * s.n * s.k;
        const double gflops =
            measure_gflops([&] { gemm(c.data(), a.data(), b.data(), s); }, flops, timing);
        std::printf("%-36s %10.1f\n", s.name, gflops);
    }

    // Grouped expert GEMM: E experts x M tokens x (I = 1024 -> O = 704), against one plain GEMM
    // of the same total FLOPs (E*M rows, one weight).
    std::printf("\ngrouped expert forward (I=1024 -> O=704), GFLOP/s and ratio to plain\n");
    std::printf("%-10s %10s %18s %18s\n", "E x M", "plain", "seq",
                num_threads > 1 ? "omp-over-experts" : "");
    const int64_t in_dim = 1024, out_dim = 704;
    const std::pair<int64_t, int64_t> groups[] = {{64, 16}, {32, 64}, {16, 256}, {8, 512}};
    for (const auto& [num_experts, rows] : groups) {
        const int64_t total_rows = num_experts * rows;
        const auto inp = random_buffer(static_cast<size_t>(total_rows * in_dim), 3);
        const auto weight = random_buffer(static_cast<size_t>(num_experts * out_dim * in_dim), 4);
        std::vector<float> out(static_cast<size_t>(total_rows * out_dim));
        const double flops = 2.0 * total_rows * in_dim * out_dim;
        const Shape plain_shape{"", total_rows, out_dim, in_dim, false, true};
        const double plain = measure_gflops(
            [&] { gemm(out.data(), inp.data(), weight.data(), plain_shape); }, flops, timing);
        double results[2] = {0, 0};
        for (int over_experts = 0; over_experts < (num_threads > 1 ? 2 : 1); ++over_experts) {
            // Single-threaded OpenBLAS inside the OpenMP loop; the pthread build would
            // otherwise fan each call out to its own threads as well. oneDNN (OpenMP runtime)
            // runs single-threaded inside a parallel region by itself.
            if (use_openblas) openblas_set_num_threads(over_experts ? 1 : num_threads);
            results[over_experts] = measure_gflops(
                [&] {
                    grouped(gemm, over_experts == 1, out.data(), inp.data(), weight.data(),
                            num_experts, rows, in_dim, out_dim);
                },
                flops, timing);
        }
        if (use_openblas) openblas_set_num_threads(num_threads);
        char label[32];
        std::snprintf(label, sizeof(label), "%ld x %ld", static_cast<long>(num_experts),
                      static_cast<long>(rows));
        std::printf("%-10s %10.1f %10.1f (%4.2fx)", label, plain, results[0], results[0] / plain);
        if (num_threads > 1) std::printf(" %10.1f (%4.2fx)", results[1], results[1] / plain);
        std::printf("\n");
    }
    std::printf(
        "(plain = one GEMM of (E*M) x 704 x 1024; seq = one call per expert, library "
        "threads inside)\n");
    return 0;
}
