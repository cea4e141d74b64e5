// Block quantization of float32 matrices into the recipes' FP8 formats and back (the formats are
// in number_formats.h). A row-major (rows, cols) matrix is cut into tiles of block_rows x
// block_cols elements; each tile has one scale and its elements are stored as E4M3 codes in the
// matrix's own layout. Tiles at the matrix's right and bottom edges may be partial: they are
// quantized as if padded with zeros. Scales are row-major (ceil(rows / block_rows),
// ceil(cols / block_cols)).
//
// MXFP8 (OCP MX v1.0): tiles of 1 x 32 (blocks along a row) or 32 x 1 (down a column), E8M0
// scales chosen by Transformer Engine's rule (quantize.cpp explains it and how it differs from
// the OCP specification's example). DeepSeek-V3's FP8 (technical report, section 3.3): 1 x 128
// tiles for activations and gradients, 128 x 128 blocks for weights, float32 scales amax / 448.
//
// NaN elements stay NaN (E4M3 0x7F); they do not enter a tile's absolute maximum.
#pragma once

#include <cstdint>

namespace moetron::cpu {

inline constexpr int64_t kMxfp8BlockSize = 32;
// DeepSeek-V3's activation tile (1 x 128) and weight block side (128 x 128).
inline constexpr int64_t kDeepSeekTileSize = 128;

inline int64_t blocks_covering(int64_t extent, int64_t block) {
    return (extent + block - 1) / block;
}

// down_columns false: 1 x 32 tiles, scales (rows, ceil(cols / 32)); true: 32 x 1 tiles, scales
// (ceil(rows / 32), cols).
void quantize_mxfp8(uint8_t* elements, uint8_t* scales, const float* x, int64_t rows, int64_t cols,
                    bool down_columns);
void dequantize_mxfp8(float* x, const uint8_t* elements, const uint8_t* scales, int64_t rows,
                      int64_t cols, bool down_columns);

// Any tile shape, float32 scales: DeepSeek-V3's 1 x 128, 128 x 1 and 128 x 128.
void quantize_fp8_blocks(uint8_t* elements, float* scales, const float* x, int64_t rows,
                         int64_t cols, int64_t block_rows, int64_t block_cols);
void dequantize_fp8_blocks(float* x, const uint8_t* elements, const float* scales, int64_t rows,
                           int64_t cols, int64_t block_rows, int64_t block_cols);

// out = x rounded to the nearest bfloat16 (ties to even), kept in float32 (out may be x).
void round_to_bf16(float* out, const float* x, int64_t n);

}  // namespace moetron::cpu
