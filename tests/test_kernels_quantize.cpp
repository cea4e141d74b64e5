// The low-precision formats and block quantizers (kernels/cpu/number_formats.h,
// kernels/cpu/quantize.h) against tests/data/quantize_reference.bin, written by an independent
// Python implementation (tools/reference/make_quantize_reference.py, ml_dtypes): every element
// code, scale and dequantized value must agree bit for bit.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "moetron/kernels/backend.h"
#include "moetron/kernels/cpu/number_formats.h"
#include "moetron/kernels/cpu/quantize.h"
#include "reference_file.h"

namespace moetron {
namespace {

using testing::ReferenceFile;

const ReferenceFile& reference() {
    static const ReferenceFile file =
        ReferenceFile::load(std::string(MOETRON_SOURCE_DIR) + "/tests/data/quantize_reference.bin");
    return file;
}

// Same bits, or both NaN (NaN payloads are not part of the formats' contract).
bool same_float(float actual, float expected) {
    if (std::isnan(actual) && std::isnan(expected)) return true;
    return std::bit_cast<uint32_t>(actual) == std::bit_cast<uint32_t>(expected);
}

TEST(QuantizeReference, E4m3EncodeAndDecode) {
    const auto& input = reference().get("e4m3.input").f32;
    const auto& codes = reference().get("e4m3.codes").i32;
    for (size_t i = 0; i < input.size(); ++i) {
        const uint8_t code = cpu::encode_e4m3(input[i]);
        EXPECT_EQ(code, codes[i]) << "e4m3(" << input[i] << ")";
    }
    // Every code decodes to the value that encodes back to it (NaN aside).
    for (int code = 0; code < 256; ++code) {
        const float value = cpu::decode_e4m3(static_cast<uint8_t>(code));
        if ((code & 0x7F) == 0x7F) {
            EXPECT_TRUE(std::isnan(value)) << code;
        } else {
            EXPECT_EQ(cpu::encode_e4m3(value), code) << value;
        }
    }
}

TEST(QuantizeReference, E8m0RoundsUp) {
    const auto& input = reference().get("e8m0.input").f32;
    const auto& codes = reference().get("e8m0.codes").i32;
    for (size_t i = 0; i < input.size(); ++i) {
        EXPECT_EQ(cpu::encode_e8m0_round_up(input[i]), codes[i]) << "e8m0(" << input[i] << ")";
    }
    EXPECT_EQ(cpu::decode_e8m0(127), 1.0f);
    EXPECT_EQ(cpu::decode_e8m0(0), std::ldexp(1.0f, -127));
    EXPECT_TRUE(std::isnan(cpu::decode_e8m0(0xFF)));
}

TEST(QuantizeReference, Bf16RoundsToNearestEven) {
    const auto& input = reference().get("bf16.input").f32;
    const auto& bits = reference().get("bf16.bits").i32;
    std::vector<float> rounded(input.size());
    cpu_backend().round_to_bf16(rounded.data(), input.data(), static_cast<int64_t>(input.size()));
    for (size_t i = 0; i < input.size(); ++i) {
        EXPECT_EQ(cpu::encode_bf16(input[i]), bits[i]) << "bf16(" << input[i] << ")";
        EXPECT_TRUE(same_float(rounded[i], cpu::decode_bf16(static_cast<uint16_t>(bits[i]))));
    }
}

struct Recipe {
    std::string name;
    int64_t block_rows, block_cols;
    bool mxfp8;
};

class QuantizeBlocks : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizeBlocks, MatchReferenceBitForBit) {
    const std::string matrix = GetParam();
    const testing::ReferenceTensor& x = reference().get(matrix + ".x");
    const int64_t rows = x.shape[0], cols = x.shape[1], n = rows * cols;
    Backend& ops = cpu_backend();
    for (const Recipe& r : {Recipe{"mxfp8_1x32", 1, 32, true},
                            {"mxfp8_32x1", 32, 1, true},
                            {"fp8_1x128", 1, 128, false},
                            {"fp8_128x1", 128, 1, false},
                            {"fp8_128x128", 128, 128, false}}) {
        SCOPED_TRACE(matrix + " " + r.name);
        const std::string prefix = matrix + "." + r.name + ".";
        const auto& want_codes = reference().get(prefix + "elements", {rows, cols}).i32;
        const testing::ReferenceTensor& want_scales = reference().get(prefix + "scales");
        const auto& want_values = reference().get(prefix + "dequantized", {rows, cols}).f32;
        const int64_t num_scales = want_scales.numel();
        EXPECT_EQ(num_scales, cpu::blocks_covering(rows, r.block_rows) *
                                  cpu::blocks_covering(cols, r.block_cols));

        std::vector<uint8_t> codes(n);
        std::vector<float> values(n);
        int mismatched_scales = 0;
        if (r.mxfp8) {
            std::vector<uint8_t> scales(num_scales);
            ops.quantize_mxfp8(codes.data(), scales.data(), x.f32.data(), rows, cols,
                               r.block_rows > 1);
            ops.dequantize_mxfp8(values.data(), codes.data(), scales.data(), rows, cols,
                                 r.block_rows > 1);
            for (int64_t i = 0; i < num_scales; ++i)
                mismatched_scales += scales[i] != want_scales.i32[i];
        } else {
            std::vector<float> scales(num_scales);
            ops.quantize_fp8_blocks(codes.data(), scales.data(), x.f32.data(), rows, cols,
                                    r.block_rows, r.block_cols);
            ops.dequantize_fp8_blocks(values.data(), codes.data(), scales.data(), rows, cols,
                                      r.block_rows, r.block_cols);
            for (int64_t i = 0; i < num_scales; ++i)
                mismatched_scales += !same_float(scales[i], want_scales.f32[i]);
        }
        EXPECT_EQ(mismatched_scales, 0);
        int mismatched_codes = 0, mismatched_values = 0;
        for (int64_t i = 0; i < n; ++i) {
            if (codes[i] != want_codes[i] && mismatched_codes++ < 3)
                ADD_FAILURE() << "element " << i << " x=" << x.f32[i] << ": code " << int(codes[i])
                              << ", expected " << want_codes[i];
            if (!same_float(values[i], want_values[i]) && mismatched_values++ < 3)
                ADD_FAILURE() << "element " << i << " x=" << x.f32[i] << ": " << values[i]
                              << ", expected " << want_values[i];
        }
        EXPECT_EQ(mismatched_codes, 0);
        EXPECT_EQ(mismatched_values, 0);
    }
}

INSTANTIATE_TEST_SUITE_P(Matrices, QuantizeBlocks, ::testing::Values("random", "zeros", "special"));

// The saturation the TE rule avoids: an MXFP8 block's largest element never clamps, so it comes
// back within E4M3's half-spacing (2^-4 relative) of itself.
TEST(QuantizeMxfp8, LargestElementNeverSaturates) {
    std::vector<float> x(32, 0.5f);
    for (float amax : {448.0f, 449.0f, 500.0f, 511.9f, 1e-3f, 3.0e30f}) {
        x[7] = -amax;
        std::vector<uint8_t> codes(32), scale(1);
        std::vector<float> back(32);
        cpu::quantize_mxfp8(codes.data(), scale.data(), x.data(), 1, 32, false);
        cpu::dequantize_mxfp8(back.data(), codes.data(), scale.data(), 1, 32, false);
        EXPECT_LE(std::fabs(back[7] + amax), amax * 0x1p-4f) << amax;
    }
}

}  // namespace
}  // namespace moetron
