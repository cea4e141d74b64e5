// The AVX512_BF16 packing and micro-kernel of bf16_gemm.h. This file alone is compiled with
// -mavx512bf16 (CMakeLists.txt) and bf16_gemm.cpp calls it only on CPUs that have it. Like
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

__m512i as_bits(__m512bh pairs) {
    return reinterpret_cast<__m512i&>(pairs);
}

// The first n lanes (none for n <= 0).
__mmask16 first_lanes(int64_t n) {
    if (n <= 0) return 0;
    return n >= kLanes ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << n) - 1u);
}

// Vectors along k (k_stride 1): 32 consecutive elements are 16 pairs in order; each goes to its
// pair's row of the panel.
void pack_vectors_along_k(uint32_t* out, const float* x, int64_t count, int64_t width, int64_t k,
                          int64_t vector_stride) {
    alignas(64) uint32_t pairs[kLanes];
    for (int64_t j = 0; j < count; ++j) {
        const float* v = x + j * vector_stride;
        for (int64_t i = 0; i < k; i += 2 * kLanes) {
            const int64_t left = k - i;  // a short tail is read masked: zeros past k
            const __m512 low = _mm512_maskz_loadu_ps(first_lanes(left), v + i);
            const __m512 high = _mm512_maskz_loadu_ps(first_lanes(left - kLanes), v + i + kLanes);
            _mm512_store_si512(pairs, as_bits(_mm512_cvtne2ps_pbh(high, low)));
            const int64_t first_pair = i / 2;
            const int64_t num_pairs = left >= 2 * kLanes ? kLanes : (left + 1) / 2;
            for (int64_t q = 0; q < num_pairs; ++q) out[(first_pair + q) * width + j] = pairs[q];
        }
    }
}

// What vcvtneps2bf16 makes of one float32 (nearest even, subnormals to zero, NaN quieted), for
// the lanes a whole vector does not cover.
uint32_t bf16_bits(float x) {
    uint32_t bits;
    __builtin_memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7F800000u) == 0) return (bits >> 16) & 0x8000u;
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (bits >> 16) | 0x40u;
    return (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
}

// Word 2i of a pair vector is row 2p's element i, word 2i + 1 row 2p + 1's: applied to
// vcvtne2ps2bf16(row 2p + 1, row 2p), it makes 16 pairs.
__m512i pair_interleave() {
    alignas(64) static constexpr uint16_t kInterleave[2 * kLanes] = {
        0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_load_si512(kInterleave);
}

// Vectors across k (vector_stride 1): rows 2p and 2p + 1 of 16 vectors at a time, converted
// together (row 2p's bf16 values in the low half) and interleaved into 16 pairs. Fewer than 16
// (an A panel is 6 wide) go one by one: masked loads that far apart in memory (the rows of a
// transposed operand) ran the head's weight gradient 20% slower than scalar ones.
void pack_vectors_across_k(uint32_t* out, const float* x, int64_t count, int64_t width, int64_t k,
                           int64_t k_stride) {
    const __m512i interleave = pair_interleave();
    const int64_t whole_vectors = count - count % kLanes;
    for (int64_t p = 0; 2 * p < k; ++p) {
        const float* low = x + 2 * p * k_stride;
        const bool has_high = 2 * p + 1 < k;  // else the pair's high half is zero padding
        uint32_t* dst = out + p * width;
        for (int64_t j = 0; j < whole_vectors; j += kLanes) {
            const __m512 low_values = _mm512_loadu_ps(low + j);
            const __m512 high_values =
                has_high ? _mm512_loadu_ps(low + k_stride + j) : _mm512_setzero_ps();
            const __m512i halves = as_bits(_mm512_cvtne2ps_pbh(high_values, low_values));
            _mm512_storeu_si512(dst + j, _mm512_permutexvar_epi16(interleave, halves));
        }
        for (int64_t j = whole_vectors; j < count; ++j)
            dst[j] = bf16_bits(low[j]) | (has_high ? bf16_bits(low[k_stride + j]) << 16 : 0u);
    }
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

void bf16_pack_panel_avx512bf16(uint32_t* out, const float* x, int64_t count, int64_t width,
                                int64_t k, int64_t vector_stride, int64_t k_stride) {
    if (k_stride == 1) {
        pack_vectors_along_k(out, x, count, width, k, vector_stride);
    } else {
        pack_vectors_across_k(out, x, count, width, k, k_stride);
    }
    if (count == width) return;
    for (int64_t p = 0; 2 * p < k; ++p) {
        for (int64_t j = count; j < width; ++j) out[p * width + j] = 0u;
    }
}

void bf16_pack_transposed_rows_avx512bf16(uint32_t* out, const float* x, int64_t count, int64_t k,
                                          int64_t row_stride) {
    const __m512i interleave = pair_interleave();
    const int64_t pairs = (k + 1) / 2;
    const int64_t num_panels = (count + kBf16TileRows - 1) / kBf16TileRows;
    alignas(64) uint32_t group[kBf16TransposedRowGroup];
    for (int64_t p = 0; p < pairs; ++p) {
        const float* low = x + 2 * p * row_stride;
        const bool has_high = 2 * p + 1 < k;  // else the pair's high half is zero padding
        for (int64_t r = 0; r < count; r += kLanes) {
            const __mmask16 mask = first_lanes(count - r);  // zeros past count
            const __m512 low_values = _mm512_maskz_loadu_ps(mask, low + r);
            const __m512 high_values =
                has_high ? _mm512_maskz_loadu_ps(mask, low + row_stride + r) : _mm512_setzero_ps();
            _mm512_store_si512(
                group + r, _mm512_permutexvar_epi16(
                               interleave, as_bits(_mm512_cvtne2ps_pbh(high_values, low_values))));
        }
        for (int64_t panel = 0; panel < num_panels; ++panel) {
            uint32_t* dst = out + panel * pairs * kBf16TileRows + p * kBf16TileRows;
            for (int64_t q = 0; q < kBf16TileRows; ++q) dst[q] = group[panel * kBf16TileRows + q];
        }
    }
}

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
