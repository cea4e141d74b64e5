// Block quantization (quantize.h). One loop serves every tile shape: the matrix is walked in
// bands of block_rows rows (one OpenMP task each) and, within a band, in chunks of whole tiles
// whose absolute maxima fit a small array on the stack, so nothing allocates.
//
// The MXFP8 scale rule (Transformer Engine's MXFP8BlockScaling, quantize_mxfp8.cuh and
// utils.cuh's float_to_e8m0 / exp2f_rcp): scale = 2^e with e = float_to_e8m0(amax * (1 / 448)),
// which rounds the exponent UP, so amax / scale <= 448 and no element saturates except through
// the final rounding; elements are x * 2^-e (exp2f_rcp; exactly 1 when e = 0, i.e. for a zero or
// vanishing block), cast to E4M3 round-to-nearest-even, saturating. The OCP MX v1.0 example
// rule instead takes e = floor(log2 amax) - 8 (8 being E4M3's largest exponent): it keeps one
// more binade of resolution for the block's small values, but a block whose amax lies in
// [448, 512) x 2^(e+8) then clamps its largest elements to 448 (up to 12.5% error on them). TE
// trades that clamping for the lost binade; so do we.
//
// The DeepSeek-V3 rule (the report's section 3.3 and its released quantization kernel): a
// float32 scale amax / 448, elements x / scale cast to E4M3; a zero tile gets scale 1.
#include "moetron/kernels/cpu/quantize.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/number_formats.h"

namespace moetron::cpu {

namespace {

// The widest chunk of a band handled at once: its tiles' maxima live on the stack.
constexpr int64_t kChunkColumns = 256;

struct Mxfp8Scale {
    using Scale = uint8_t;
    static Scale from_amax(float amax) {
        constexpr float kInverseMax = 1.0f / kE4m3Max;  // TE multiplies by max_norm_rcp
        return encode_e8m0_round_up(amax * kInverseMax);
    }
    // What the tile's elements are multiplied by: 2^-e (TE's exp2f_rcp, 1 for e8m0 = 0).
    static float encoding_factor(Scale scale) {
        if (scale == 0) return 1.0f;
        if (scale == 254) return 0x1p-127f;  // a float32 subnormal
        return std::bit_cast<float>(static_cast<uint32_t>(254 - scale) << 23);
    }
    static float to_units(float x, float factor) { return x * factor; }
    static float from_units(float units, Scale scale) { return units * decode_e8m0(scale); }
};

struct DeepSeekScale {
    using Scale = float;
    static Scale from_amax(float amax) {
        const float scale = amax / kE4m3Max;
        return scale > 0.0f ? scale : 1.0f;
    }
    static float encoding_factor(Scale scale) { return scale; }
    static float to_units(float x, float divisor) { return x / divisor; }
    static float from_units(float units, Scale scale) { return units * scale; }
};

struct Tiling {
    int64_t rows, cols, block_rows, block_cols;
    int64_t scale_cols() const { return blocks_covering(cols, block_cols); }
    // Whole tiles per chunk: at least one, at most kChunkColumns columns' worth when tiles are
    // narrower.
    int64_t chunk_columns() const {
        return std::max<int64_t>(1, kChunkColumns / block_cols) * block_cols;
    }
};

void check_tiling(const Tiling& t, const char* op) {
    MT_CHECK(t.rows >= 0 && t.cols >= 0, "[{}] shape ({}, {}) must not be negative", op, t.rows,
             t.cols);
    MT_CHECK(t.block_rows > 0 && t.block_cols > 0, "[{}] tile {} x {} must be positive", op,
             t.block_rows, t.block_cols);
}

template <class Rule>
void quantize_tiles(uint8_t* elements, typename Rule::Scale* scales, const float* x,
                    const Tiling& t) {
    const int64_t num_bands = blocks_covering(t.rows, t.block_rows);
    const int64_t chunk = t.chunk_columns();
#pragma omp parallel for schedule(static)
    for (int64_t band = 0; band < num_bands; ++band) {
        const int64_t r0 = band * t.block_rows, r1 = std::min(t.rows, r0 + t.block_rows);
        for (int64_t c0 = 0; c0 < t.cols; c0 += chunk) {
            const int64_t c1 = std::min(t.cols, c0 + chunk);
            float amax[kChunkColumns] = {};
            for (int64_t r = r0; r < r1; ++r) {
                for (int64_t c = c0; c < c1; ++c) {
                    const float magnitude = std::fabs(x[r * t.cols + c]);
                    float& tile_max = amax[(c - c0) / t.block_cols];
                    if (magnitude > tile_max) tile_max = magnitude;  // NaN never compares greater
                }
            }
            float factor[kChunkColumns];
            for (int64_t tile = 0; tile < blocks_covering(c1 - c0, t.block_cols); ++tile) {
                const typename Rule::Scale scale = Rule::from_amax(amax[tile]);
                factor[tile] = Rule::encoding_factor(scale);
                scales[band * t.scale_cols() + c0 / t.block_cols + tile] = scale;
            }
            for (int64_t r = r0; r < r1; ++r) {
                for (int64_t c = c0; c < c1; ++c) {
                    const float f = factor[(c - c0) / t.block_cols];
                    elements[r * t.cols + c] = encode_e4m3(Rule::to_units(x[r * t.cols + c], f));
                }
            }
        }
    }
}

template <class Rule>
void dequantize_tiles(float* x, const uint8_t* elements, const typename Rule::Scale* scales,
                      const Tiling& t) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < t.rows; ++r) {
        const typename Rule::Scale* scale_row = scales + (r / t.block_rows) * t.scale_cols();
        for (int64_t c = 0; c < t.cols; ++c) {
            x[r * t.cols + c] = Rule::from_units(decode_e4m3(elements[r * t.cols + c]),
                                                 scale_row[c / t.block_cols]);
        }
    }
}

Tiling mxfp8_tiling(int64_t rows, int64_t cols, bool down_columns) {
    return down_columns ? Tiling{rows, cols, kMxfp8BlockSize, 1}
                        : Tiling{rows, cols, 1, kMxfp8BlockSize};
}

}  // namespace

void quantize_mxfp8(uint8_t* elements, uint8_t* scales, const float* x, int64_t rows, int64_t cols,
                    bool down_columns) {
    const Tiling t = mxfp8_tiling(rows, cols, down_columns);
    check_tiling(t, "quantize_mxfp8");
    quantize_tiles<Mxfp8Scale>(elements, scales, x, t);
}

void dequantize_mxfp8(float* x, const uint8_t* elements, const uint8_t* scales, int64_t rows,
                      int64_t cols, bool down_columns) {
    const Tiling t = mxfp8_tiling(rows, cols, down_columns);
    check_tiling(t, "dequantize_mxfp8");
    dequantize_tiles<Mxfp8Scale>(x, elements, scales, t);
}

void quantize_fp8_blocks(uint8_t* elements, float* scales, const float* x, int64_t rows,
                         int64_t cols, int64_t block_rows, int64_t block_cols) {
    const Tiling t{rows, cols, block_rows, block_cols};
    check_tiling(t, "quantize_fp8_blocks");
    quantize_tiles<DeepSeekScale>(elements, scales, x, t);
}

void dequantize_fp8_blocks(float* x, const uint8_t* elements, const float* scales, int64_t rows,
                           int64_t cols, int64_t block_rows, int64_t block_cols) {
    const Tiling t{rows, cols, block_rows, block_cols};
    check_tiling(t, "dequantize_fp8_blocks");
    dequantize_tiles<DeepSeekScale>(x, elements, scales, t);
}

void round_to_bf16(float* out, const float* x, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = decode_bf16(encode_bf16(x[i]));
}

}  // namespace moetron::cpu
