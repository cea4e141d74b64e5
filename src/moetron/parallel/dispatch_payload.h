// The wire format of the token rows a dispatch sends to the experts (--precision's recipe, or
// float32): each row of `hidden` floats becomes payload_row_bytes(format, hidden) bytes,
// elements first, then the scales of its blocks:
//   fp32           the floats themselves
//   bf16           bfloat16, rounded to nearest even (the bf16 recipe's GEMM input)
//   mxfp8          E4M3 codes, then one E8M0 scale per 32 elements (1 x 32 blocks along the row)
//   fp8-blockwise  E4M3 codes, then one float32 scale per 128 elements (DeepSeek-V3's 1 x 128
//                  activation tiles), stored unaligned
// A row is quantized on its own, with the blocks along the hidden dimension, which is the
// reduction dimension of the experts' first GEMM: the decoded row is exactly the row-wise
// quantized copy the recipe's GEMM would have made on the experts' rank (kernels/cpu/
// recipe_gemms.h), so the experts consume the received values as they are (model/moe.cpp passes
// GemmPrecision::input_quantized). The quantization
// runs as the backend's ops; the packing around it is host code, so a quantized payload needs
// a backend that computes on the host (the low-precision recipes do anyway).
#pragma once

#include <cstdint>
#include <vector>

#include "moetron/kernels/backend.h"
#include "moetron/parallel/dispatch_traffic.h"

namespace moetron::parallel {

class TokenRowCodec {
  public:
    // Scratch sized once here: encode and decode allocate nothing.
    TokenRowCodec(Precision format, int64_t hidden, Backend& backend);

    Precision format() const { return format_; }
    int64_t row_bytes() const { return row_bytes_; }

    // packed (num_rows, row_bytes) from rows (num_rows, hidden).
    void encode(uint8_t* packed, const float* rows, int64_t num_rows);
    // rows (num_rows, hidden) from packed (num_rows, row_bytes).
    void decode(float* rows, const uint8_t* packed, int64_t num_rows);
    // rows replaced by what they decode to after encoding: the values the experts receive, for
    // a dispatch that sends nothing (every expert in this process), so that the numbers do not
    // depend on the layout.
    void round_trip(float* rows, int64_t num_rows);

  private:
    Precision format_;
    int64_t hidden_, row_bytes_;
    Backend* backend_;
    std::vector<float> row_scratch_;    // (hidden) bf16 rounding
    std::vector<float> scale_scratch_;  // (hidden / 128 blocks) fp8-blockwise scales, aligned
    std::vector<uint8_t> packed_row_;   // (row_bytes) round_trip
};

}  // namespace moetron::parallel
