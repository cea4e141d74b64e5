// The AVX512_BF16 micro-kernel of bf16_gemm.h. This file alone is compiled with -mavx512bf16
// (CMakeLists.txt) and bf16_gemm.cpp calls it only on CPUs that have it. Like
// small_gemm_kernels.inc, everything here has internal linkage and calls no library templates,
// so that no AVX-512 copy of a shared inline function can end up running on other CPUs.
#include <immintrin.h>

#include <cstdint>

#include "moetron/kernels/cpu/bf16_gemm_kernel.h"

namespace moetron::cpu {
namespace {

constexpr int kLanes = 16;  // float32 lanes of a vector: one column of C each
constexpr int kTileVectors = static_cast<int>(kBf16PanelColumns) / kLanes;
constexpr int kTileRows = static_cast<int>(kBf16TileRows);

__m512bh as_bf16_pairs(__m512i bits) {
    return reinterpret_cast<__m512bh&>(bits);
}

// MR rows x NV vectors of C at (row0, col0); the last vector's columns are those in last_mask.
// Per pair of k: NV loads of B's pairs, MR broadcasts of A's pair, MR x NV vdpbf16ps, each
// adding two exact products into every float32 lane.
template <int MR, int NV>
void tile(const PackedBf16Gemm& g, const uint32_t* a, const uint32_t* b, int64_t row0, int64_t col0,
          __mmask16 last_mask) {
    __m512 acc[MR][NV];
    float* c = g.c + row0 * g.n + col0;
    const __m512 beta = _mm512_set1_ps(g.beta);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
            const __mmask16 mask = v == NV - 1 ? last_mask : __mmask16{0xFFFF};
            acc[r][v] =
                g.beta == 0.0f
                    ? _mm512_setzero_ps()
                    : _mm512_mul_ps(beta, _mm512_maskz_loadu_ps(mask, c + r * g.n + v * kLanes));
        }
    }
    for (int64_t p = 0; p < g.pairs; ++p) {
        __m512bh bv[NV];
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
            bv[v] = as_bf16_pairs(_mm512_loadu_si512(b + p * kBf16PanelColumns + v * kLanes));
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            const __m512bh av =
                as_bf16_pairs(_mm512_set1_epi32(static_cast<int>(a[p * kBf16TileRows + r])));
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
            const __mmask16 mask = v == NV - 1 ? last_mask : __mmask16{0xFFFF};
            _mm512_mask_storeu_ps(c + r * g.n + v * kLanes, mask, acc[r][v]);
        }
    }
}

// The edge tiles: fewer rows (MR) or vectors (NV) than a whole tile, chosen at run time.
template <int MR, int NV = kTileVectors>
void tile_vectors(int nv, const PackedBf16Gemm& g, const uint32_t* a, const uint32_t* b,
                  int64_t row0, int64_t col0, __mmask16 last_mask) {
    if constexpr (NV > 1) {
        if (nv < NV) return tile_vectors<MR, NV - 1>(nv, g, a, b, row0, col0, last_mask);
    }
    tile<MR, NV>(g, a, b, row0, col0, last_mask);
}

template <int MR = kTileRows>
void tile_any(int mr, int nv, const PackedBf16Gemm& g, const uint32_t* a, const uint32_t* b,
              int64_t row0, int64_t col0, __mmask16 last_mask) {
    if constexpr (MR > 1) {
        if (mr < MR) return tile_any<MR - 1>(mr, nv, g, a, b, row0, col0, last_mask);
    }
    tile_vectors<MR>(nv, g, a, b, row0, col0, last_mask);
}

}  // namespace

void bf16_gemm_tile_avx512bf16(const PackedBf16Gemm& g, int64_t row_panel, int64_t col_panel) {
    const int64_t row0 = row_panel * kBf16TileRows, col0 = col_panel * kBf16PanelColumns;
    const int64_t rows = g.m - row0 < kBf16TileRows ? g.m - row0 : kBf16TileRows;
    const int64_t cols = g.n - col0 < kBf16PanelColumns ? g.n - col0 : kBf16PanelColumns;
    const int nv = static_cast<int>((cols + kLanes - 1) / kLanes);
    const int last_columns = static_cast<int>(cols - (nv - 1) * kLanes);
    const auto last_mask = static_cast<__mmask16>((1u << last_columns) - 1u);
    tile_any(static_cast<int>(rows), nv, g, g.a_pairs + row_panel * g.pairs * kBf16TileRows,
             g.b_pairs + col_panel * g.pairs * kBf16PanelColumns, row0, col0, last_mask);
}

}  // namespace moetron::cpu
