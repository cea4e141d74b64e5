// The native bf16 GEMM (bf16_gemm.h): packing with the recipe's rounding, then the register tiles
// of C spread over OpenMP threads, each computed by the AVX512_BF16 micro-kernel.
#include "moetron/kernels/cpu/bf16_gemm.h"

#include <omp.h>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/bf16_gemm_kernel.h"
#include "moetron/kernels/cpu/blas_info.h"
#include "moetron/kernels/cpu/number_formats.h"

namespace moetron::cpu {

namespace {

// Below this many FLOPs the GEMM runs on the calling thread (as matmul.cpp's threshold: a
// parallel region costs a few microseconds).
constexpr double kMinParallelFlops = 4e6;

int64_t panels_covering(int64_t extent, int64_t width) {
    return (extent + width - 1) / width;
}

// x as `extent` vectors of k elements, element i of vector j at x[j * vector_stride + i *
// k_stride], packed in panels of `width` vectors: out[panel][pair][j in panel] holds elements 2p
// (low half) and 2p + 1 (high half) of vector panel * width + j, each rounded to bfloat16 as
// round_to_bf16 rounds; zero past extent and k.
void pack_pairs(uint32_t* out, const float* x, int64_t extent, int64_t k, int64_t vector_stride,
                int64_t k_stride, int64_t width, int num_threads) {
    const int64_t pairs = (k + 1) / 2;
    const int64_t num_panels = panels_covering(extent, width);
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t panel = 0; panel < num_panels; ++panel) {
        uint32_t* dst = out + panel * pairs * width;
        const int64_t first = panel * width;
        const int64_t count = extent - first < width ? extent - first : width;
        for (int64_t p = 0; p < pairs; ++p) {
            const bool has_high = 2 * p + 1 < k;
            for (int64_t j = 0; j < count; ++j) {
                const float* element = x + (first + j) * vector_stride + 2 * p * k_stride;
                const uint32_t low = encode_bf16(element[0]);
                const uint32_t high = has_high ? encode_bf16(element[k_stride]) : 0u;
                dst[p * width + j] = low | (high << 16);
            }
            for (int64_t j = count; j < width; ++j) dst[p * width + j] = 0u;
        }
    }
}

uint32_t* grown(std::vector<uint32_t>& buffer, int64_t count) {
    if (static_cast<int64_t>(buffer.size()) < count) buffer.resize(static_cast<size_t>(count));
    return buffer.data();
}

}  // namespace

bool cpu_has_avx512_bf16() {
    return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
}

void bf16_matmul(Bf16GemmWorkspace& workspace, float* c, const float* a, const float* b, int64_t m,
                 int64_t n, int64_t k, bool trans_a, bool trans_b, float beta) {
    MT_CHECK(cpu_has_avx512_bf16(), "[bf16_matmul] needs a CPU with AVX512_BF16");
    MT_CHECK(m >= 0 && n >= 0 && k >= 0, "[bf16_matmul] shape ({}, {}, {}) must not be negative", m,
             n, k);
    if (m == 0 || n == 0) return;
    const int num_threads =
        omp_in_parallel() || 2.0 * m * n * k < kMinParallelFlops ? 1 : omp_get_max_threads();
    const int64_t pairs = (k + 1) / 2;
    const int64_t row_panels = panels_covering(m, kBf16TileRows);
    const int64_t col_panels = panels_covering(n, kBf16PanelColumns);
    uint32_t* a_pairs = grown(workspace.a_pairs, row_panels * pairs * kBf16TileRows);
    uint32_t* b_pairs = grown(workspace.b_pairs, col_panels * pairs * kBf16PanelColumns);
    // op(A)[r][i] = a[r * k + i], or a[i * m + r] when A is stored transposed; op(B)[i][j] =
    // b[i * n + j], or b[j * k + i].
    pack_pairs(a_pairs, a, m, k, trans_a ? 1 : k, trans_a ? m : 1, kBf16TileRows, num_threads);
    pack_pairs(b_pairs, b, n, k, trans_b ? k : 1, trans_b ? 1 : n, kBf16PanelColumns, num_threads);
    const PackedBf16Gemm g{a_pairs, b_pairs, pairs, c, m, n, beta};
    // Consecutive tiles share a column panel of B, so a thread's share reuses it from cache.
    const int64_t num_tiles = row_panels * col_panels;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t t = 0; t < num_tiles; ++t) {
        bf16_gemm_tile_avx512bf16(g, t % row_panels, t / row_panels);
    }
}

}  // namespace moetron::cpu
