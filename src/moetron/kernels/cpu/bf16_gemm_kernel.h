// What bf16_gemm.cpp (threads) hands the AVX512_BF16 code (bf16_gemm_avx512bf16.cpp, the one
// file compiled with -mavx512bf16): the panels to pack, and the packed operands and C, one
// register tile of C at a time.
#pragma once

#include <cstdint>

namespace moetron::cpu {

// The register tile: 6 rows of op(A) x 4 vectors of 16 float32 columns = 24 accumulators, plus
// 4 vectors of B's pairs and a broadcast pair, out of AVX-512's 32 registers. op(A) is packed in
// panels of kBf16TileRows rows, op(B) in panels of kBf16PanelColumns columns.
inline constexpr int64_t kBf16TileRows = 6;
inline constexpr int64_t kBf16PanelColumns = 64;

// C (m, n), row-major, = A B + beta C with A and B packed as bfloat16 pairs (bf16_gemm.h):
// a_pairs[panel][pair][row in panel] and b_pairs[panel][pair][column in panel], zero-padded
// past m, n and k.
struct PackedBf16Gemm {
    const uint32_t* a_pairs;
    const uint32_t* b_pairs;
    int64_t pairs;  // ceil(k / 2)
    float* c;
    int64_t m, n;
    float beta;  // 0: C is written without being read
};

// One panel of op(A) (rows) or op(B) (columns), `count` <= width vectors of k elements, element i
// of vector j at x[j * vector_stride + i * k_stride] (one of the two strides is 1), packed as
// out[pair][j] (j < width) with vcvtne2ps2bf16: rounded to nearest even, as round_to_bf16 rounds,
// except that float32 subnormals become zero (vdpbf16ps would count them as zero anyway, but for
// the few that round up to bfloat16's smallest normal); zero past count and past k.
void bf16_pack_panel_avx512bf16(uint32_t* out, const float* x, int64_t count, int64_t width,
                                int64_t k, int64_t vector_stride, int64_t k_stride);

// A transposed op(A)'s rows come kBf16TransposedRowGroup at a time (8 panels): element i of row r
// at x[i * row_stride + r], r < count <= kBf16TransposedRowGroup, packed into panels of
// kBf16TileRows rows as bf16_pack_panel_avx512bf16 packs them (out: the group's first panel;
// rows past count zero up to their panel's end). Reading 48 rows' worth of each k row at once,
// rather than one panel's 6, keeps the reads contiguous.
inline constexpr int64_t kBf16TransposedRowGroup = 8 * kBf16TileRows;
void bf16_pack_transposed_rows_avx512bf16(uint32_t* out, const float* x, int64_t count, int64_t k,
                                          int64_t row_stride);

// The tile of C at row panel `row_panel` and column panel `col_panel`; the parts past m and n
// are neither read nor written.
void bf16_gemm_tile_avx512bf16(const PackedBf16Gemm& g, int64_t row_panel, int64_t col_panel);

}  // namespace moetron::cpu
