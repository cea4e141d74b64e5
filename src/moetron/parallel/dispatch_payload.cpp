#include "moetron/parallel/dispatch_payload.h"

#include <cstring>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/quantize.h"

namespace moetron::parallel {

namespace {

uint16_t bf16_bits(float x) {  // x already rounded to bfloat16: its upper half
    uint32_t bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    return static_cast<uint16_t>(bits >> 16);
}

float from_bf16_bits(uint16_t half) {
    const uint32_t bits = static_cast<uint32_t>(half) << 16;
    float x = 0;
    std::memcpy(&x, &bits, sizeof x);
    return x;
}

}  // namespace

TokenRowCodec::TokenRowCodec(Precision format, int64_t hidden, Backend& backend)
    : format_(format),
      hidden_(hidden),
      row_bytes_(payload_row_bytes(format, hidden)),  // refuses a recipe the engine lacks
      backend_(&backend) {
    MT_CHECK(hidden >= 1, "[dispatch] token rows of {} elements", hidden);
    MT_CHECK(format == Precision::fp32 || backend.device() == Device::cpu,
             "[dispatch] a {} dispatch payload is packed on the host; backend '{}' is not",
             precision_name(format), backend.name());
    if (format == Precision::bf16) row_scratch_.resize(static_cast<size_t>(hidden));
    if (format == Precision::fp8_blockwise)
        scale_scratch_.resize(
            static_cast<size_t>(cpu::blocks_covering(hidden, cpu::kDeepSeekTileSize)));
    packed_row_.resize(static_cast<size_t>(row_bytes_));
}

void TokenRowCodec::encode(uint8_t* packed, const float* rows, int64_t num_rows) {
    const int64_t D = hidden_;
    for (int64_t r = 0; r < num_rows; ++r) {
        uint8_t* out = packed + r * row_bytes_;
        const float* row = rows + r * D;
        switch (format_) {
            case Precision::fp32:
                std::memcpy(out, row, static_cast<size_t>(row_bytes_));
                break;
            case Precision::bf16:
                backend_->round_to_bf16(row_scratch_.data(), row, D);
                for (int64_t i = 0; i < D; ++i) {
                    const uint16_t half = bf16_bits(row_scratch_[static_cast<size_t>(i)]);
                    std::memcpy(out + 2 * i, &half, sizeof half);
                }
                break;
            case Precision::mxfp8:
                backend_->quantize_mxfp8(out, out + D, row, 1, D, /*down_columns=*/false);
                break;
            case Precision::fp8_blockwise:
                backend_->quantize_fp8_blocks(out, scale_scratch_.data(), row, 1, D, 1,
                                              cpu::kDeepSeekTileSize);
                std::memcpy(out + D, scale_scratch_.data(), scale_scratch_.size() * sizeof(float));
                break;
            case Precision::nvfp4:  // refused by the constructor
                break;
        }
    }
}

void TokenRowCodec::decode(float* rows, const uint8_t* packed, int64_t num_rows) {
    const int64_t D = hidden_;
    for (int64_t r = 0; r < num_rows; ++r) {
        const uint8_t* in = packed + r * row_bytes_;
        float* row = rows + r * D;
        switch (format_) {
            case Precision::fp32:
                std::memcpy(row, in, static_cast<size_t>(row_bytes_));
                break;
            case Precision::bf16:
                for (int64_t i = 0; i < D; ++i) {
                    uint16_t half = 0;
                    std::memcpy(&half, in + 2 * i, sizeof half);
                    row[i] = from_bf16_bits(half);
                }
                break;
            case Precision::mxfp8:
                backend_->dequantize_mxfp8(row, in, in + D, 1, D, /*down_columns=*/false);
                break;
            case Precision::fp8_blockwise:
                std::memcpy(scale_scratch_.data(), in + D, scale_scratch_.size() * sizeof(float));
                backend_->dequantize_fp8_blocks(row, in, scale_scratch_.data(), 1, D, 1,
                                                cpu::kDeepSeekTileSize);
                break;
            case Precision::nvfp4:  // refused by the constructor
                break;
        }
    }
}

void TokenRowCodec::round_trip(float* rows, int64_t num_rows) {
    if (format_ == Precision::fp32) return;
    for (int64_t r = 0; r < num_rows; ++r) {
        encode(packed_row_.data(), rows + r * hidden_, 1);
        decode(rows + r * hidden_, packed_row_.data(), 1);
    }
}

}  // namespace moetron::parallel
