// The dispatch's wire formats (parallel/dispatch_payload.h): a token row encodes into
// payload_row_bytes bytes (payload_bytes_per_element * D for whole blocks, the cluster model's
// definition), and decodes to exactly the row-wise quantized copy that the recipe's expert GEMM
// would make: the experts' first GEMM on the decoded rows, not quantized again, equals the
// recipe's GEMM on the float32 rows bit for bit, for every recipe and for partial blocks.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "moetron/kernels/backend.h"
#include "moetron/kernels/cpu/cpu_backend.h"
#include "moetron/parallel/dispatch_payload.h"
#include "moetron/parallel/dispatch_traffic.h"
#include "testing.h"

namespace moetron {
namespace {

// The recipes' formats: each recipe's tokens travel in its own format.
constexpr Precision kRecipes[] = {Precision::bf16, Precision::mxfp8, Precision::fp8_blockwise};

TEST(DispatchPayload, RowBytesAreTheSimsBytesPerElementForWholeBlocks) {
    for (const Precision f :
         {Precision::fp32, Precision::bf16, Precision::mxfp8, Precision::fp8_blockwise}) {
        EXPECT_EQ(static_cast<double>(parallel::payload_row_bytes(f, 7168)),
                  parallel::payload_bytes_per_element(f) * 7168)
            << precision_name(f);
    }
    // A partial block carries a whole scale.
    EXPECT_EQ(parallel::payload_row_bytes(Precision::mxfp8, 40), 40 + 2);
    EXPECT_EQ(parallel::payload_row_bytes(Precision::fp8_blockwise, 64), 64 + 4);
}

TEST(DispatchPayload, EncodeWritesRowBytesAndNothingElse) {
    const int64_t rows = 3, D = 40;
    const std::vector<float> x = testing::random_floats(static_cast<size_t>(rows * D), 3);
    for (const Precision r : kRecipes) {
        parallel::TokenRowCodec codec(r, D, cpu_backend());
        const auto row_bytes = static_cast<size_t>(codec.row_bytes());
        std::vector<uint8_t> packed(rows * row_bytes + 16, 0xA5);
        codec.encode(packed.data(), x.data(), rows);
        for (size_t i = rows * row_bytes; i < packed.size(); ++i)
            EXPECT_EQ(packed[i], 0xA5) << precision_name(r);
        std::vector<float> decoded(x.size()), tripped = x;
        codec.decode(decoded.data(), packed.data(), rows);
        codec.round_trip(tripped.data(), rows);
        EXPECT_EQ(0, std::memcmp(decoded.data(), tripped.data(), x.size() * sizeof(float)));
        EXPECT_NE(decoded, x) << "the format rounded nothing";
    }
}

// Two experts over 5 + 4 rows; D = 200: MXFP8 has a partial block of 8, FP8's 1 x 128 tiles one
// of 72.
TEST(DispatchPayload, ExpertsGemmOnDecodedRowsEqualsTheRecipesGemm) {
    const int64_t D = 200, O = 48, E = 2;
    const int64_t offsets[] = {0, 5, 9};
    const int64_t R = offsets[E];
    const std::vector<float> x = testing::random_floats(static_cast<size_t>(R * D), 11);
    const std::vector<float> w = testing::random_floats(static_cast<size_t>(E * O * D), 12);
    const std::unique_ptr<Backend> emulated = make_cpu_backend({cpu::Bf16Gemm::emulated});
    Backend& ops = *emulated;  // the bf16 kernel would round float32 rows as it packs them
    for (const Precision r : kRecipes) {
        SCOPED_TRACE(std::string(precision_name(r)));
        std::vector<float> want(static_cast<size_t>(R * O)), got(want.size());
        ops.grouped_linear_forward(want.data(), x.data(), w.data(), offsets, E, D, O, {r});
        parallel::TokenRowCodec codec(r, D, ops);
        std::vector<float> arrived = x;
        codec.round_trip(arrived.data(), R);
        const GemmPrecision as_arrived{r, /*input_quantized=*/true};
        ops.grouped_linear_forward(got.data(), arrived.data(), w.data(), offsets, E, D, O,
                                   as_arrived);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
        // Not a vacuous match: float32 rows taken as they are give another result.
        std::vector<float> unquantized(want.size());
        ops.grouped_linear_forward(unquantized.data(), x.data(), w.data(), offsets, E, D, O,
                                   as_arrived);
        EXPECT_NE(unquantized, want);
    }
}

// What arrived is not quantized again: with input_quantized the GEMM quantizes the experts'
// weights only, so float32 rows given as arrived multiply the quantized weights exactly as the
// float32 GEMM multiplies them.
TEST(DispatchPayload, ExpertsGemmOnArrivedRowsQuantizesOnlyTheWeights) {
    const int64_t D = 64, O = 32, E = 3;
    const int64_t offsets[] = {0, 2, 2, 5};
    const std::vector<float> x = testing::random_floats(static_cast<size_t>(5 * D), 21);
    const std::vector<float> w = testing::random_floats(static_cast<size_t>(E * O * D), 22);
    Backend& ops = cpu_backend();
    // The weights as the recipe quantizes them: (O, D) per expert, 1 x 32 blocks along D.
    std::vector<float> w_quantized(w.size());
    std::vector<uint8_t> codes(w.size()), scales(w.size() / 32);
    ops.quantize_mxfp8(codes.data(), scales.data(), w.data(), E * O, D, /*down_columns=*/false);
    ops.dequantize_mxfp8(w_quantized.data(), codes.data(), scales.data(), E * O, D, false);
    std::vector<float> want(static_cast<size_t>(5 * O)), got(want.size());
    ops.grouped_linear_forward(want.data(), x.data(), w_quantized.data(), offsets, E, D, O,
                               kFp32Gemm);
    ops.grouped_linear_forward(got.data(), x.data(), w.data(), offsets, E, D, O,
                               {Precision::mxfp8, /*input_quantized=*/true});
    EXPECT_EQ(got, want);
    ops.grouped_linear_forward(got.data(), x.data(), w.data(), offsets, E, D, O,
                               {Precision::mxfp8});
    EXPECT_NE(got, want) << "the input was not quantized without input_quantized";
}

}  // namespace
}  // namespace moetron
