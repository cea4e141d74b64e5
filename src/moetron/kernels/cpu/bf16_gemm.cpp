// The native bf16 GEMM (bf16_gemm.h): packing with the recipe's rounding (vectorized, in the
// AVX512_BF16 file), then the register tiles
// of C, each computed by the AVX512_BF16 micro-kernel; threads share the panels and tiles of one
// GEMM (in one parallel region), or take whole GEMMs of a batch.
#include "moetron/kernels/cpu/bf16_gemm.h"

#include <omp.h>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/bf16_gemm_kernel.h"
#include "moetron/kernels/cpu/blas_info.h"
#include "moetron/kernels/cpu/matmul.h"

namespace moetron::cpu {

namespace {

// A batch hands whole GEMMs to threads when every thread gets at least this many (matmul.cpp's
// kMinExpertsPerThread, for the same reason: dynamic scheduling evens out unequal GEMMs).
constexpr int64_t kMinGemmsPerThread = 4;

// op(A)'s panels packed together (kBf16TransposedRowGroup rows).
constexpr int64_t kPanelsPerGroup = kBf16TransposedRowGroup / kBf16TileRows;

// Tiles a thread takes at a time: dynamic, so that a thread the OS preempts (a shared machine)
// does not hold up the others, in runs long enough to reuse a column panel of B from cache.
constexpr int kTilesPerGrab = 16;

int64_t panels_covering(int64_t extent, int64_t width) {
    return (extent + width - 1) / width;
}

double flops(const Bf16Matmul& g) {
    return 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
}

// A GEMM's operands packed (bf16_gemm_kernel.h), in one thread's buffers.
struct Packing {
    const Bf16Matmul& g;
    int64_t pairs, row_panels, col_panels;
    uint32_t* a_pairs;
    uint32_t* b_pairs;

    Packing(const Bf16Matmul& gemm, Bf16GemmWorkspace::Buffers& buffers)
        : g(gemm),
          pairs((gemm.k + 1) / 2),
          row_panels(panels_covering(gemm.m, kBf16TileRows)),
          col_panels(panels_covering(gemm.n, kBf16PanelColumns)),
          a_pairs(grown(buffers.a_pairs, row_panels * pairs * kBf16TileRows)),
          b_pairs(grown(buffers.b_pairs, col_panels * pairs * kBf16PanelColumns)) {}

    static uint32_t* grown(std::vector<uint32_t>& buffer, int64_t count) {
        if (static_cast<int64_t>(buffer.size()) < count) buffer.resize(static_cast<size_t>(count));
        return buffer.data();
    }

    // Panel `panel` of op(A) (rows) or op(B) (columns): x as vectors of k elements, element i of
    // vector j at x[j * vector_stride + i * k_stride] (bf16_gemm_kernel.h).
    void pack_panel(uint32_t* out, const float* x, int64_t extent, int64_t vector_stride,
                    int64_t k_stride, int64_t width, int64_t panel) const {
        const int64_t first = panel * width;
        const int64_t count = extent - first < width ? extent - first : width;
        bf16_pack_panel_avx512bf16(out + panel * pairs * width, x + first * vector_stride, count,
                                   width, g.k, vector_stride, k_stride);
    }
    // op(A)[r][i] = a[r * k + i], or a[i * m + r] when A is stored transposed: then in groups of
    // 8 panels, whose rows lie side by side in memory (bf16_gemm_kernel.h).
    int64_t num_a_groups() const { return panels_covering(row_panels, kPanelsPerGroup); }
    void pack_a_group(int64_t group) const {
        const int64_t first_panel = group * kPanelsPerGroup;
        if (g.trans_a) {
            const int64_t first_row = first_panel * kBf16TileRows;
            const int64_t count = g.m - first_row < kBf16TransposedRowGroup
                                      ? g.m - first_row
                                      : kBf16TransposedRowGroup;
            bf16_pack_transposed_rows_avx512bf16(a_pairs + first_panel * pairs * kBf16TileRows,
                                                 g.a + first_row, count, g.k, g.m);
            return;
        }
        const int64_t end =
            first_panel + kPanelsPerGroup < row_panels ? first_panel + kPanelsPerGroup : row_panels;
        for (int64_t panel = first_panel; panel < end; ++panel)
            pack_panel(a_pairs, g.a, g.m, g.k, 1, kBf16TileRows, panel);
    }
    // op(B)[i][j] = b[i * n + j], or b[j * k + i] when B is stored transposed.
    void pack_b(int64_t panel) const {
        pack_panel(b_pairs, g.b, g.n, g.trans_b ? g.k : 1, g.trans_b ? 1 : g.n, kBf16PanelColumns,
                   panel);
    }
    PackedBf16Gemm packed() const { return {a_pairs, b_pairs, pairs, g.c, g.m, g.n, g.beta}; }
    // Tile t: consecutive tiles share a column panel of B, so a thread's run of them reuses it
    // from cache.
    int64_t num_tiles() const { return row_panels * col_panels; }
    void compute_tile(const PackedBf16Gemm& p, int64_t t) const {
        bf16_gemm_tile_avx512bf16(p, t % row_panels, t / row_panels);
    }
};

void gemm_on_this_thread(const Bf16Matmul& g, Bf16GemmWorkspace::Buffers& buffers) {
    if (g.m == 0 || g.n == 0) return;
    const Packing packing(g, buffers);
    for (int64_t group = 0; group < packing.num_a_groups(); ++group) packing.pack_a_group(group);
    for (int64_t panel = 0; panel < packing.col_panels; ++panel) packing.pack_b(panel);
    const PackedBf16Gemm packed = packing.packed();
    for (int64_t t = 0; t < packing.num_tiles(); ++t) packing.compute_tile(packed, t);
}

// One parallel region: the threads pack both operands' panels, then compute the tiles.
void gemm_on_threads(const Bf16Matmul& g, Bf16GemmWorkspace::Buffers& buffers, int num_threads) {
    if (g.m == 0 || g.n == 0) return;
    const Packing packing(g, buffers);
    const PackedBf16Gemm packed = packing.packed();
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static) nowait
        for (int64_t group = 0; group < packing.num_a_groups(); ++group)
            packing.pack_a_group(group);
#pragma omp for schedule(static)
        for (int64_t panel = 0; panel < packing.col_panels; ++panel) packing.pack_b(panel);
#pragma omp for schedule(dynamic, kTilesPerGrab)
        for (int64_t t = 0; t < packing.num_tiles(); ++t) packing.compute_tile(packed, t);
    }
}

void check(const Bf16Matmul& g) {
    MT_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0,
             "[bf16_matmul] shape ({}, {}, {}) must not be negative", g.m, g.n, g.k);
}

}  // namespace

bool cpu_has_avx512_bf16() {
    return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
}

void bf16_matmul(Bf16GemmWorkspace& workspace, const Bf16Matmul& gemm) {
    MT_CHECK(cpu_has_avx512_bf16(), "[bf16_matmul] needs a CPU with AVX512_BF16");
    check(gemm);
    if (workspace.per_thread.empty()) workspace.per_thread.resize(1);
    const int num_threads = gemm_threads_available();
    if (num_threads <= 1 || flops(gemm) < kMinParallelGemmFlops) {
        gemm_on_this_thread(gemm, workspace.per_thread[0]);
    } else {
        gemm_on_threads(gemm, workspace.per_thread[0], num_threads);
    }
}

void bf16_matmul_batch(Bf16GemmWorkspace& workspace, const Bf16Matmul* gemms, int64_t count) {
    MT_CHECK(cpu_has_avx512_bf16(), "[bf16_matmul_batch] needs a CPU with AVX512_BF16");
    int64_t num_busy = 0;
    for (int64_t i = 0; i < count; ++i) {
        check(gemms[i]);
        num_busy += gemms[i].m > 0 && gemms[i].n > 0 ? 1 : 0;
    }
    const int num_threads = gemm_threads_available();
    if (num_threads <= 1 || num_busy < kMinGemmsPerThread * num_threads) {
        for (int64_t i = 0; i < count; ++i) bf16_matmul(workspace, gemms[i]);
        return;
    }
    // Every thread's buffers exist before the region; inside it they grow only while the GEMMs do.
    if (static_cast<int64_t>(workspace.per_thread.size()) < num_threads)
        workspace.per_thread.resize(static_cast<size_t>(num_threads));
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t i = 0; i < count; ++i) {
        gemm_on_this_thread(gemms[i],
                            workspace.per_thread[static_cast<size_t>(omp_get_thread_num())]);
    }
}

}  // namespace moetron::cpu
