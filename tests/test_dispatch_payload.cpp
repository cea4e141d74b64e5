// The dispatch's wire formats (parallel/dispatch_payload.h): a token row encodes into
// payload_row_bytes bytes (payload_bytes_per_element * D for whole blocks, the cluster model's
// definition), and decodes to exactly the row-wise quantized copy that the recipe's expert GEMM
// would make: the experts' first GEMM on the decoded rows, not quantized again, equals the
// recipe's GEMM on the float32 rows bit for bit, for every recipe and for partial blocks.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "moetron/kernels/backend.h"
#include "moetron/kernels/low_precision_backend.h"
#include "moetron/kernels/profiling_backend.h"
#include "moetron/parallel/dispatch_payload.h"
#include "moetron/parallel/dispatch_traffic.h"
#include "testing.h"

namespace moetron {
namespace {

using parallel::PayloadFormat;

struct Recipe {
    Precision precision;
    PayloadFormat payload;
};
constexpr Recipe kRecipes[] = {{Precision::bf16, PayloadFormat::bf16},
                               {Precision::mxfp8, PayloadFormat::mxfp8},
                               {Precision::fp8_blockwise, PayloadFormat::fp8_blockwise}};

TEST(DispatchPayload, RowBytesAreTheSimsBytesPerElementForWholeBlocks) {
    for (const PayloadFormat f : {PayloadFormat::fp32, PayloadFormat::bf16, PayloadFormat::mxfp8,
                                  PayloadFormat::fp8_blockwise}) {
        EXPECT_EQ(static_cast<double>(parallel::payload_row_bytes(f, 7168)),
                  parallel::payload_bytes_per_element(f) * 7168)
            << parallel::payload_format_name(f);
    }
    // A partial block carries a whole scale.
    EXPECT_EQ(parallel::payload_row_bytes(PayloadFormat::mxfp8, 40), 40 + 2);
    EXPECT_EQ(parallel::payload_row_bytes(PayloadFormat::fp8_blockwise, 64), 64 + 4);
}

TEST(DispatchPayload, EncodeWritesRowBytesAndNothingElse) {
    const int64_t rows = 3, D = 40;
    const std::vector<float> x = testing::random_floats(static_cast<size_t>(rows * D), 3);
    for (const Recipe& r : kRecipes) {
        parallel::TokenRowCodec codec(r.payload, D, cpu_backend());
        const auto row_bytes = static_cast<size_t>(codec.row_bytes());
        std::vector<uint8_t> packed(rows * row_bytes + 16, 0xA5);
        codec.encode(packed.data(), x.data(), rows);
        for (size_t i = rows * row_bytes; i < packed.size(); ++i)
            EXPECT_EQ(packed[i], 0xA5) << parallel::payload_format_name(r.payload);
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
    for (const Recipe& r : kRecipes) {
        SCOPED_TRACE(parallel::payload_format_name(r.payload));
        LowPrecisionBackend low(cpu_backend(), r.precision);
        std::vector<float> want(static_cast<size_t>(R * O)), got(want.size());
        low.grouped_linear_forward(want.data(), x.data(), w.data(), offsets, E, D, O);
        parallel::TokenRowCodec codec(r.payload, D, cpu_backend());
        std::vector<float> arrived = x;
        codec.round_trip(arrived.data(), R);
        low.grouped_linear_forward_quantized_input(got.data(), arrived.data(), w.data(), offsets, E,
                                                   D, O);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
        // Not a vacuous match: float32 rows give another result (except on the native bf16
        // kernel, which rounds whatever it is given as it packs it).
        if (low.native_bf16() && r.precision == Precision::bf16) continue;
        std::vector<float> unquantized(want.size());
        low.grouped_linear_forward_quantized_input(unquantized.data(), x.data(), w.data(), offsets,
                                                   E, D, O);
        EXPECT_NE(unquantized, want);
    }
}

// What arrived is not quantized again: the GEMM quantizes the experts' weights only (one call per
// expert), where the recipe's own GEMM also quantizes its input (one call more).
TEST(DispatchPayload, ExpertsGemmOnArrivedRowsQuantizesOnlyTheWeights) {
    const int64_t D = 64, O = 32, E = 3;
    const int64_t offsets[] = {0, 2, 2, 5};
    const std::vector<float> x = testing::random_floats(static_cast<size_t>(5 * D), 21);
    const std::vector<float> w = testing::random_floats(static_cast<size_t>(E * O * D), 22);
    std::vector<float> out(static_cast<size_t>(5 * O));
    ProfilingBackend counted(cpu_backend());
    LowPrecisionBackend low(counted, Precision::mxfp8);
    low.grouped_linear_forward(out.data(), x.data(), w.data(), offsets, E, D, O);
    EXPECT_EQ(counted.calls("quantize_mxfp8"), 1 + E);
    counted.reset();
    low.grouped_linear_forward_quantized_input(out.data(), x.data(), w.data(), offsets, E, D, O);
    EXPECT_EQ(counted.calls("quantize_mxfp8"), E);
}

}  // namespace
}  // namespace moetron
