// core/: dtype conversion, tensor views, arenas, the counter-based RNG, errors, the least-squares
// line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "moetron/core/arena.h"
#include "moetron/core/dtype.h"
#include "moetron/core/error.h"
#include "moetron/core/least_squares.h"
#include "moetron/core/rng.h"
#include "moetron/core/tensor.h"
#include "moetron/core/timer.h"

namespace moetron {
namespace {

TEST(Bf16, RoundTripsEveryBf16Value) {
    // Every finite bf16 bit pattern converts to float and back unchanged.
    for (uint32_t b = 0; b < 0x10000; ++b) {
        const float f = bf16::to_float(static_cast<uint16_t>(b));
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(bf16::to_float(bf16::from_float(f))));
            continue;
        }
        EXPECT_EQ(bf16::from_float(f), b) << "bits " << b;
    }
}

TEST(Bf16, RoundsToNearestEven) {
    // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties go to the even mantissa.
    EXPECT_EQ(bf16::to_float(bf16::from_float(1.0f + 0x1.0p-8f)), 1.0f);
    // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
    EXPECT_EQ(bf16::to_float(bf16::from_float(1.0f + 3 * 0x1.0p-8f)), 1.0f + 0x1.0p-6f);
    // Just above the halfway point rounds up.
    EXPECT_EQ(bf16::to_float(bf16::from_float(1.0f + 0x1.0p-8f + 0x1.0p-20f)), 1.0f + 0x1.0p-7f);
    // The largest float rounds to infinity; NaN stays NaN.
    EXPECT_TRUE(std::isinf(bf16::to_float(bf16::from_float(std::numeric_limits<float>::max()))));
    EXPECT_TRUE(std::isnan(bf16::to_float(bf16::from_float(std::nanf("")))));
    // Relative error of a conversion is at most 2^-9.
    for (float x : {3.14159f, -2.71828f, 1e-20f, 6.02e23f}) {
        const float y = bf16::to_float(bf16::from_float(x));
        EXPECT_LE(std::fabs(y - x) / std::fabs(x), 0x1.0p-9f);
    }
}

TEST(DType, NamesRoundTripAndUnknownIsAnError) {
    for (DType t : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64, DType::u8})
        EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
    EXPECT_THROW(dtype_from_name("F16X"), Error);
}

TEST(Tensor, AtIsRowMajorAndChecksBoundsInDebug) {
    std::vector<float> data(2 * 3 * 4);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
    TensorView t(data.data(), {2, 3, 4}, DType::f32);
    EXPECT_EQ(t.at<float>(1, 2, 3), 23.0f);
    EXPECT_EQ(t.rows(1, 2).at<float>(0, 0, 1), 13.0f);
    EXPECT_EQ(t.reshaped({6, 4}).at<float>(5, 0), 20.0f);
    EXPECT_THROW(t.reshaped({5, 4}), Error);
    EXPECT_THROW((void)t.ptr<double>(), Error);
#if MOETRON_CHECKED_ACCESS
    EXPECT_THROW(t.at<float>(2, 0, 0), Error);
    EXPECT_THROW(t.at<float>(0, 0), Error);
#endif
}

TEST(Arena, PlansAlignedOffsetsAndHandsOutViews) {
    ArenaPlan plan("params");
    plan.add("a", {3}, DType::f32);      // 12 bytes
    plan.add("b", {5, 7}, DType::bf16);  // 70 bytes
    plan.add("c", {1}, DType::f64);
    for (const ArenaEntry& e : plan.entries()) EXPECT_EQ(e.offset_bytes % 64, 0u) << e.name;
    EXPECT_EQ(plan.entries()[1].offset_bytes, 64u);
    EXPECT_EQ(plan.entries()[2].offset_bytes, 192u);
    EXPECT_EQ(plan.total_bytes(), 200u);
    EXPECT_THROW(plan.add("a", {1}), Error);
    EXPECT_THROW(plan.index_of("missing"), Error);

    Arena arena(plan, host_memory());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(arena.base()) % 64, 0u);
    TensorView b = arena.view("b");
    EXPECT_EQ(b.shape, Shape({5, 7}));
    EXPECT_EQ(b.dtype, DType::bf16);
    EXPECT_EQ(static_cast<char*>(b.data) - static_cast<char*>(arena.base()), 64);
    // Zero-filled on allocation.
    for (int i = 0; i < 3; ++i) EXPECT_EQ(arena.view("a").at<float>(i), 0.0f);

    ArenaPlan gpu_plan("gpu", kDeviceAlignmentBytes);
    gpu_plan.add("x", {1});
    gpu_plan.add("y", {1});
    EXPECT_EQ(gpu_plan.entries()[1].offset_bytes, 256u);
}

TEST(Philox, MatchesTheRandom123KnownAnswer) {
    // Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors).
    EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
              (PhiloxCounter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
    EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                            {0xffffffffu, 0xffffffffu}),
              (PhiloxCounter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
    EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                            {0xa4093822u, 0x299f31d0u}),
              (PhiloxCounter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(ParamRng, ElementDependsOnlyOnSeedNameAndIndex) {
    ParamRng a(42, "layers.0.mlp.w"), b(42, "layers.0.mlp.w"), other_name(42, "layers.1.mlp.w"),
        other_seed(43, "layers.0.mlp.w");
    std::vector<float> full(1000), shard(250);
    a.fill_normal(full.data(), full.size(), 0.02f);
    b.fill_normal(shard.data(), shard.size(), 0.02f, /*first_index=*/500);
    for (size_t j = 0; j < shard.size(); ++j) EXPECT_EQ(shard[j], full[500 + j]);
    EXPECT_NE(a.normal(7), other_name.normal(7));
    EXPECT_NE(a.normal(7), other_seed.normal(7));
}

TEST(ParamRng, NormalHasUnitMomentsAndUniformIsInRange) {
    ParamRng rng(1, "moments");
    double sum = 0, sum_sq = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
        const double x = rng.normal(i);
        sum += x;
        sum_sq += x * x;
        const float u = rng.uniform(i);
        ASSERT_GE(u, 0.0f);
        ASSERT_LT(u, 1.0f);
    }
    EXPECT_NEAR(sum / n, 0.0, 0.01);
    EXPECT_NEAR(sum_sq / n, 1.0, 0.01);
}

TEST(RngStream, StateSavesAndRestoresMidBlock) {
    RngStream s(7, 3);
    for (int i = 0; i < 5; ++i) s.next_u32();  // stop inside a 4-word block
    RngStream restored(s.state());
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s.next_u32(), restored.next_u32());
    std::set<uint64_t> seen;
    for (int i = 0; i < 1000; ++i) {
        const uint64_t x = s.next_below(10);
        ASSERT_LT(x, 10u);
        seen.insert(x);
    }
    EXPECT_EQ(seen.size(), 10u);
    EXPECT_NE(RngStream(7, 3).next_u64(), RngStream(7, 4).next_u64());
}

TEST(Error, CheckReportsMessageFileAndExpression) {
    try {
        MT_CHECK(1 + 1 == 3, "[demo] expected {} got {}", 3, 2);
        FAIL() << "MT_CHECK did not throw";
    } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("[demo] expected 3 got 2"), std::string::npos) << what;
        EXPECT_NE(what.find("test_core.cpp"), std::string::npos) << what;
        EXPECT_NE(what.find("1 + 1 == 3"), std::string::npos) << what;
    }
}

TEST(Timer, IsMonotonic) {
    Timer t;
    const double a = t.elapsed_us();
    const double b = t.elapsed_us();
    EXPECT_GE(b, a);
    EXPECT_GE(a, 0.0);
}

TEST(FitLine, RecoversAnExactLineWhateverTheWeights) {
    // y = 3 - 2 x, with x far from 0 as collective sizes in bytes are: the centered sums stay
    // exact.
    const std::vector<double> x = {1e6, 2e6, 4e6, 8e6};
    std::vector<double> y;
    for (double v : x) y.push_back(3 - 2 * v);
    for (const std::vector<double>& w :
         {std::vector<double>{}, std::vector<double>{1, 5, 0.1, 2}}) {
        const LineFit f = fit_line(x, y, w);
        EXPECT_NEAR(f.slope, -2.0, 1e-12);
        EXPECT_NEAR(f.intercept, 3.0, 1e-3);  // 3 against y of -2e7: ulps of the means
        EXPECT_NEAR(f.intercept + f.slope * f.mean_x, f.mean_y, 1e-6);
    }
}

TEST(FitLine, AWeightCountsAsThatManyCopiesOfItsPoint) {
    // Weights {1, 2, 1} fit as the points with the middle one twice; the unweighted fit differs.
    const std::vector<double> x = {0, 1, 3}, y = {0, 2, 1};
    const LineFit weighted = fit_line(x, y, std::vector<double>{1, 2, 1});
    const LineFit copies =
        fit_line(std::vector<double>{0, 1, 1, 3}, std::vector<double>{0, 2, 2, 1});
    EXPECT_NEAR(weighted.slope, copies.slope, 1e-12);
    EXPECT_NEAR(weighted.intercept, copies.intercept, 1e-12);
    EXPECT_NEAR(weighted.mean_x, 1.25, 1e-12);
    EXPECT_NEAR(weighted.mean_y, 1.25, 1e-12);
    // By hand: sxx = 1.5625 + 2 (0.0625) + 3.0625 = 4.75, sxy = 1.5625 - 2 (0.1875) - 0.4375 =
    // 0.75.
    EXPECT_NEAR(weighted.slope, 0.75 / 4.75, 1e-12);
    EXPECT_GT(std::abs(fit_line(x, y).slope - weighted.slope), 0.01);
}

TEST(FitLine, RefusesWhatHasNoSlope) {
    const std::vector<double> two = {1, 2};
    EXPECT_THROW(fit_line(two, std::vector<double>{1, 2, 3}), Error);             // sizes differ
    EXPECT_THROW(fit_line(two, two, std::vector<double>{1}), Error);              // one weight
    EXPECT_THROW(fit_line(two, two, std::vector<double>{1, 0}), Error);           // a zero weight
    EXPECT_THROW(fit_line(std::vector<double>{5, 5}, two), Error);                // one distinct x
    EXPECT_THROW(fit_line(std::vector<double>{}, std::vector<double>{}), Error);  // no point
}

}  // namespace
}  // namespace moetron
