// GEMMs through OpenBLAS (cblas_sgemm, row-major). See matmul.h for shapes and README.md for the
// gradient rule: activation gradients are written, weight gradients accumulate (beta = 1).
//
// Threading: all CPU parallelism is OpenMP, the thread pool of every other kernel; BLAS runs
// single-threaded on blocks of C that OpenMP threads own. Debian's default OpenBLAS is the
// pthread build, whose workers spin-wait between calls as OpenMP's do, so two pools on the same
// cores steal time from each other whenever GEMMs and OpenMP regions alternate (as in every
// layer). Measured on 2 cores (bench/bench_kernels, quiet machine): a plain GEMM split by OpenMP
// runs as fast as OpenBLAS's own threading (~250 GFLOP/s with its Haswell kernels), while
// OpenBLAS threading right after an OpenMP region dropped to ~190. The grouped GEMM hands whole
// experts to threads: grouped/plain 0.82 (forward) and 0.90 (backward) at 64 tokens per expert,
// 0.96 / 1.02 at 256, against 0.78 / 0.83 and 0.94 / 0.96 for one OpenBLAS-threaded call per
// expert. What remained at 64 tokens was BLAS packing each expert's weight (2.9 MB at 1024 x 704,
// read from DRAM) for only 128 FLOPs per element (bench/blas_choice/README.md): small experts now
// run on kernels that read the weight in place (small_gemm.h).
#include "moetron/kernels/cpu/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <utility>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/small_gemm.h"

extern "C" {
// OpenBLAS extensions; not declared by every cblas.h variant.
int openblas_get_num_threads(void);
void openblas_set_num_threads(int num_threads);
}

namespace moetron::cpu {

namespace {

// The grouped GEMM hands whole experts to threads when every thread gets at least this many
// (dynamic scheduling then evens out uneven routing); with fewer, each expert's GEMM is split
// over all threads instead. With 4, equal experts lose at most ~10% to the last round (9 experts
// on 2 threads: 5 rounds against 4.5), while a split costs only a parallel region per GEMM.
constexpr int64_t kMinExpertsPerThread = 4;
// Experts with at most this many tokens run on the small-GEMM kernels (small_gemm.h), which read
// the weight in place, when a thread owns the whole expert. Measured on one core (AVX-512): at
// 64 tokens they run the expert's forward 1.3x and backward 1.2x faster than BLAS; at 256 tokens
// BLAS's packing is amortized and the forward is as fast either way.
constexpr int64_t kSmallGemmMaxRows = 128;
// Column blocks start on 64-byte boundaries.
constexpr int64_t kColumnAlign = 16;

// Debian's OpenBLAS is built with 32-bit BLAS integers, so every dimension must fit an int.
void check_blas_dims(int64_t m, int64_t n, int64_t k, const char* op) {
    for (const auto& [value, what] : {std::pair{m, "rows M"}, {n, "columns N"}, {k, "inner K"}}) {
        MT_CHECK(value >= 0 && value <= INT_MAX, "[{}] {} = {} must be in [0, {}] for BLAS", op,
                 what, value, INT_MAX);
    }
}

// OpenMP decides how many cores a GEMM uses, so every entry point sets OpenBLAS's process-wide
// thread count to 1 (a no-op after the first call unless someone raised it again).
void make_blas_single_threaded() {
    if (!omp_in_parallel() && openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

// Rows [r0, r1) x columns [c0, c1) of C, on the calling thread. The degenerate shapes BLAS
// rejects are handled here: nothing to do when the block is empty; with K = 0 the product is zero,
// so C = beta C (C = 0 when beta = 0, never reading C, as BLAS does).
void gemm_block(const Gemm& g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (r1 <= r0 || c1 <= c0) return;
    float* c = g.c + r0 * g.n + c0;
    if (g.k == 0) {
        for (int64_t r = 0; r < r1 - r0; ++r) {
            float* row = c + r * g.n;
            for (int64_t j = 0; j < c1 - c0; ++j) row[j] = g.beta == 0.0f ? 0.0f : g.beta * row[j];
        }
        return;
    }
    // op(A) rows r0.. start at row r0 of A, or at column r0 of A^T; op(B) columns likewise.
    const float* a = g.trans_a ? g.a + r0 : g.a + r0 * g.k;
    const float* b = g.trans_b ? g.b + c0 * g.k : g.b + c0;
    const int lda = static_cast<int>(g.trans_a ? g.m : g.k);
    const int ldb = static_cast<int>(g.trans_b ? g.k : g.n);
    cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                g.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(r1 - r0),
                static_cast<int>(c1 - c0), static_cast<int>(g.k), 1.0f, a, lda, b, ldb, g.beta, c,
                static_cast<int>(g.n));
}

// The whole GEMM over all threads: C is cut along its longer side, because each block packs the
// whole of the other operand (cutting rows repacks op(B) per thread, cutting columns op(A)).
void gemm_parallel(const Gemm& g) {
    const int num_threads = gemm_threads_available();
    if (num_threads <= 1 || 2.0 * g.m * g.n * g.k < kMinParallelGemmFlops) {
        gemm_block(g, 0, g.m, 0, g.n);
        return;
    }
    const bool split_rows = g.m >= g.n;
#pragma omp parallel num_threads(num_threads)
    {
        const int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
        if (split_rows) {
            gemm_block(g, g.m * t / count, g.m * (t + 1) / count, 0, g.n);
        } else {
            auto column = [&](int64_t i) {
                return i == count ? g.n
                                  : std::min(g.n, g.n * i / count / kColumnAlign * kColumnAlign);
            };
            gemm_block(g, 0, g.m, column(t), column(t + 1));
        }
    }
}

// Validates everything before the expert loop: nothing may throw inside an OpenMP region.
void check_grouped_args(const int64_t* offsets, int64_t num_experts, int64_t in_dim,
                        int64_t out_dim, const char* op) {
    MT_CHECK(num_experts >= 0, "[{}] num_experts = {} must not be negative", op, num_experts);
    MT_CHECK(offsets != nullptr, "[{}] offsets must not be null", op);
    MT_CHECK(offsets[0] == 0, "[{}] offsets[0] = {} must be 0 (segments start at row 0)", op,
             offsets[0]);
    for (int64_t e = 0; e < num_experts; ++e) {
        MT_CHECK(offsets[e + 1] >= offsets[e],
                 "[{}] offsets must be non-decreasing: offsets[{}] = {} < offsets[{}] = {}", op,
                 e + 1, offsets[e + 1], e, offsets[e]);
    }
    check_blas_dims(offsets[num_experts], out_dim, in_dim, op);
}

// How an expert's GEMMs run: on the calling thread, which owns the whole expert (then a small
// expert may use the small-GEMM kernels), or split over all threads.
struct ExpertRunner {
    bool whole_expert_on_this_thread;

    void operator()(const Gemm& g) const {
        if (whole_expert_on_this_thread) {
            gemm_block(g, 0, g.m, 0, g.n);
        } else {
            gemm_parallel(g);
        }
    }
    bool use_small_gemm(int64_t num_rows) const {
        return whole_expert_on_this_thread && num_rows <= kSmallGemmMaxRows;
    }
};

// Runs run_expert(e, runner) for every expert with rows (an empty expert has nothing to
// compute; its dweight gets += 0, i.e. is left alone). run_expert passes its GEMMs to the runner,
// which either runs them on the calling thread (whole experts per thread) or splits each over
// all threads (few experts), see kMinExpertsPerThread.
template <class RunExpert>
void for_each_expert(const int64_t* offsets, int64_t num_experts, RunExpert run_expert) {
    int64_t num_busy = 0;
    for (int64_t e = 0; e < num_experts; ++e) num_busy += offsets[e + 1] > offsets[e] ? 1 : 0;
    const int num_threads = gemm_threads_available();
    if (num_threads > 1 && num_busy >= kMinExpertsPerThread * num_threads) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
        for (int64_t e = 0; e < num_experts; ++e) {
            if (offsets[e + 1] > offsets[e]) run_expert(e, ExpertRunner{true});
        }
        return;
    }
    for (int64_t e = 0; e < num_experts; ++e) {
        if (offsets[e + 1] > offsets[e]) run_expert(e, ExpertRunner{num_threads <= 1});
    }
}

}  // namespace

void matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a,
            bool trans_b, float beta) {
    check_blas_dims(m, n, k, "matmul");
    make_blas_single_threaded();
    gemm_parallel({c, a, b, m, n, k, trans_a, trans_b, beta});
}

// ---- linear: y = x W^T, W in the Hugging Face (out_features, in_features) layout ----

void linear_forward(float* out, const float* inp, const float* weight, int64_t num_rows,
                    int64_t in_dim, int64_t out_dim) {
    check_blas_dims(num_rows, out_dim, in_dim, "linear_forward");
    make_blas_single_threaded();
    gemm_parallel({out, inp, weight, num_rows, out_dim, in_dim, false, true, 0.0f});
}

void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, int64_t num_rows, int64_t in_dim, int64_t out_dim) {
    check_blas_dims(num_rows, out_dim, in_dim, "linear_backward");
    make_blas_single_threaded();
    // dinp (M, I) = dout (M, O) @ W (O, I): written.
    if (dinp != nullptr) {
        gemm_parallel({dinp, dout, weight, num_rows, in_dim, out_dim, false, false, 0.0f});
    }
    // dW (O, I) += dout^T (O, M) @ inp (M, I): accumulated.
    if (dweight != nullptr) {
        gemm_parallel({dweight, dout, inp, out_dim, in_dim, num_rows, true, false, 1.0f});
    }
}

// ---- grouped linear: expert e multiplies rows [offsets[e], offsets[e+1]) by weight[e] ----

void grouped_linear_forward(float* out, const float* inp, const float* weight,
                            const int64_t* offsets, int64_t num_experts, int64_t in_dim,
                            int64_t out_dim) {
    check_grouped_args(offsets, num_experts, in_dim, out_dim, "grouped_linear_forward");
    make_blas_single_threaded();
    for_each_expert(offsets, num_experts, [&](int64_t e, const ExpertRunner& run_gemm) {
        const int64_t row0 = offsets[e], num_rows = offsets[e + 1] - offsets[e];
        float* out_e = out + row0 * out_dim;
        const float* inp_e = inp + row0 * in_dim;
        const float* weight_e = weight + e * out_dim * in_dim;
        if (run_gemm.use_small_gemm(num_rows)) {
            small_linear_forward(out_e, inp_e, weight_e, num_rows, in_dim, out_dim);
            return;
        }
        run_gemm(Gemm{out_e, inp_e, weight_e, num_rows, out_dim, in_dim, false, true, 0.0f});
    });
}

void grouped_linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                             const float* weight, const int64_t* offsets, int64_t num_experts,
                             int64_t in_dim, int64_t out_dim) {
    check_grouped_args(offsets, num_experts, in_dim, out_dim, "grouped_linear_backward");
    make_blas_single_threaded();
    for_each_expert(offsets, num_experts, [&](int64_t e, const ExpertRunner& run_gemm) {
        const int64_t row0 = offsets[e], num_rows = offsets[e + 1] - offsets[e];
        const int64_t weight_offset = e * out_dim * in_dim;
        const float* dout_e = dout + row0 * out_dim;
        if (run_gemm.use_small_gemm(num_rows)) {
            if (dinp != nullptr) {
                small_linear_backward_input(dinp + row0 * in_dim, dout_e, weight + weight_offset,
                                            num_rows, in_dim, out_dim);
            }
            if (dweight != nullptr) {
                small_linear_backward_weight(dweight + weight_offset, dout_e, inp + row0 * in_dim,
                                             num_rows, in_dim, out_dim);
            }
            return;
        }
        if (dinp != nullptr) {
            run_gemm(Gemm{dinp + row0 * in_dim, dout_e, weight + weight_offset, num_rows, in_dim,
                          out_dim, false, false, 0.0f});
        }
        if (dweight != nullptr) {
            run_gemm(Gemm{dweight + weight_offset, dout_e, inp + row0 * in_dim, out_dim, in_dim,
                          num_rows, true, false, 1.0f});
        }
    });
}

int gemm_threads_available() {
    return omp_in_parallel() ? 1 : omp_get_max_threads();
}

}  // namespace moetron::cpu
