// Each recipe's GEMMs (GemmPrecision on the call; kernels/cpu/recipe_gemms.h) against the float64
// product of the unquantized inputs, per shape and per GEMM of a linear layer (forward, input
// gradient, weight gradient, and the experts' grouped forms): every output element within the bound
// its formats imply, and not exact (so that a recipe that quantized nothing would fail).
//
// The bound of one element c = sum_k a_k b_k: each quantized input is within u |x| + d of x (u
// the element format's relative half-spacing: 2^-4 for E4M3, 2^-8 for bfloat16; d the absolute
// error of E4M3 subnormals, 2^-10 times the block's scale, at most 2^-9 amax / 448 with the
// MXFP8 rule), so |c - c_q| <= sum_k (|a| ea + |b| eb + ea eb)... written out below, plus the
// float32 accumulation's K 2^-23 sum |a b|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/backend.h"

namespace moetron {
namespace {

struct Shape {
    int64_t m, k, n;
};

std::vector<float> random_matrix(int64_t count, uint64_t seed, float scale) {
    ParamRng rng(seed, "low_precision_gemm");
    std::vector<float> x(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) x[i] = scale * static_cast<float>(rng.normal(i));
    // A few outliers, as activations have: blocks with a large amax squeeze the others.
    for (int64_t i = 0; i < count; i += 97) x[i] *= 30.0f;
    return x;
}

double relative_spacing(Precision p) {
    return p == Precision::bf16 ? 0x1p-8 : 0x1p-4;
}

double max_abs(const std::vector<float>& x) {
    double m = 0;
    for (float v : x) m = std::max(m, std::fabs(static_cast<double>(v)));
    return m;
}

// C (M, N) = A (M, K) B (K, N) given as element accessors, with each element's error bound.
struct Checked {
    double worst_ratio = 0;  // max over elements of error / bound
    double max_error = 0;
};

template <class GetA, class GetB>
Checked check_product(const std::vector<float>& c, int64_t m, int64_t n, int64_t k, GetA a, GetB b,
                      Precision p, double amax_a, double amax_b) {
    const double u = relative_spacing(p);
    // E4M3 subnormal spacing 2^-9 times the scale (at most amax / 224 for MXFP8, amax / 448 for
    // DeepSeek's): half of it is the rounding error.
    const double da = p == Precision::bf16 ? 0 : 0x1p-10 * amax_a / 224;
    const double db = p == Precision::bf16 ? 0 : 0x1p-10 * amax_b / 224;
    Checked out;
    for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            double exact = 0, bound = 0;
            for (int64_t t = 0; t < k; ++t) {
                const double x = a(i, t), y = b(t, j);
                exact += x * y;
                const double ex = u * std::fabs(x) + da, ey = u * std::fabs(y) + db;
                bound += std::fabs(x) * ey + std::fabs(y) * ex + ex * ey +
                         static_cast<double>(k) * 0x1p-23 * std::fabs(x * y);
            }
            const double error = std::fabs(c[i * n + j] - exact);
            out.max_error = std::max(out.max_error, error);
            out.worst_ratio = std::max(out.worst_ratio, error / bound);
        }
    }
    return out;
}

void expect_within(const Checked& r, const std::string& what) {
    std::printf("[gemm-error] %s: max error %.3e, worst error/bound %.3f\n", what.c_str(),
                r.max_error, r.worst_ratio);
    EXPECT_LE(r.worst_ratio, 1.0) << what;
    EXPECT_GT(r.max_error, 1e-5) << what << ": no quantization error at all";
}

class LowPrecisionGemm : public ::testing::TestWithParam<Precision> {};

TEST_P(LowPrecisionGemm, LinearWithinFormatBound) {
    const Precision p = GetParam();
    Backend& ops = cpu_backend();
    const GemmPrecision gemm{p};
    for (const Shape s : {Shape{64, 256, 96}, {17, 100, 33}, {130, 64, 140}}) {
        const std::string shape = std::string(precision_name(p)) + " M=" + std::to_string(s.m) +
                                  " K=" + std::to_string(s.k) + " N=" + std::to_string(s.n);
        // Linear: x (M, I=K), W (O=N, I), dout (M, O).
        const auto x = random_matrix(s.m * s.k, 1, 1.0f);
        const auto w = random_matrix(s.n * s.k, 2, 0.02f);
        const auto dout = random_matrix(s.m * s.n, 3, 1e-3f);
        std::vector<float> y(s.m * s.n), dx(s.m * s.k), dw(s.n * s.k, 0.0f);
        ops.linear_forward(y.data(), x.data(), w.data(), s.m, s.k, s.n, gemm);
        expect_within(
            check_product(
                y, s.m, s.n, s.k, [&](int64_t i, int64_t t) { return x[i * s.k + t]; },
                [&](int64_t t, int64_t j) { return w[j * s.k + t]; }, p, max_abs(x), max_abs(w)),
            shape + " forward");
        ops.linear_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), s.m, s.k, s.n,
                            gemm);
        expect_within(
            check_product(
                dx, s.m, s.k, s.n, [&](int64_t i, int64_t t) { return dout[i * s.n + t]; },
                [&](int64_t t, int64_t j) { return w[t * s.k + j]; }, p, max_abs(dout), max_abs(w)),
            shape + " input gradient");
        expect_within(
            check_product(
                dw, s.n, s.k, s.m, [&](int64_t i, int64_t t) { return dout[t * s.n + i]; },
                [&](int64_t t, int64_t j) { return x[t * s.k + j]; }, p, max_abs(dout), max_abs(x)),
            shape + " weight gradient");
    }
}

TEST_P(LowPrecisionGemm, GroupedWithinFormatBound) {
    const Precision p = GetParam();
    Backend& ops = cpu_backend();
    const GemmPrecision gemm{p};
    const int64_t experts = 3, in = 96, out = 40;
    const std::vector<int64_t> offsets = {0, 37, 37, 90};  // one expert without tokens
    const int64_t rows = offsets.back();
    const auto x = random_matrix(rows * in, 4, 1.0f);
    const auto w = random_matrix(experts * out * in, 5, 0.05f);
    const auto dout = random_matrix(rows * out, 6, 1e-2f);
    std::vector<float> y(rows * out), dx(rows * in), dw(experts * out * in, 0.0f);
    ops.grouped_linear_forward(y.data(), x.data(), w.data(), offsets.data(), experts, in, out,
                               gemm);
    ops.grouped_linear_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(),
                                offsets.data(), experts, in, out, gemm);
    for (int64_t e = 0; e < experts; ++e) {
        const int64_t r0 = offsets[e], m = offsets[e + 1] - offsets[e];
        if (m == 0) continue;
        const std::string what = std::string(precision_name(p)) + " expert " + std::to_string(e);
        const float* we = w.data() + e * out * in;
        const std::vector<float> ye(y.begin() + r0 * out, y.begin() + (r0 + m) * out);
        expect_within(
            check_product(
                ye, m, out, in, [&](int64_t i, int64_t t) { return x[(r0 + i) * in + t]; },
                [&](int64_t t, int64_t j) { return we[j * in + t]; }, p, max_abs(x), max_abs(w)),
            what + " forward");
        const std::vector<float> dxe(dx.begin() + r0 * in, dx.begin() + (r0 + m) * in);
        expect_within(
            check_product(
                dxe, m, in, out, [&](int64_t i, int64_t t) { return dout[(r0 + i) * out + t]; },
                [&](int64_t t, int64_t j) { return we[t * in + j]; }, p, max_abs(dout), max_abs(w)),
            what + " input gradient");
        const std::vector<float> dwe(dw.begin() + e * out * in, dw.begin() + (e + 1) * out * in);
        expect_within(
            check_product(
                dwe, out, in, m, [&](int64_t i, int64_t t) { return dout[(r0 + t) * out + i]; },
                [&](int64_t t, int64_t j) { return x[(r0 + t) * in + j]; }, p, max_abs(dout),
                max_abs(x)),
            what + " weight gradient");
    }
}

INSTANTIATE_TEST_SUITE_P(Recipes, LowPrecisionGemm,
                         ::testing::Values(Precision::bf16, Precision::mxfp8,
                                           Precision::fp8_blockwise),
                         [](const auto& info) {
                             std::string name(precision_name(info.param));
                             std::replace(name.begin(), name.end(), '-', '_');
                             return name;
                         });

// What a message of a UserError thrown by f says ("" when none is thrown).
template <typename F>
std::string user_error_of(F f) {
    try {
        f();
    } catch (const UserError& e) {
        return e.what();
    }
    return "";
}

TEST(LowPrecision, ParsesPrecisionNames) {
    for (size_t p = 0; p < kNumPrecisions; ++p) {
        const auto precision = static_cast<Precision>(p);
        EXPECT_EQ(parse_precision(precision_name(precision)), precision);
    }
    EXPECT_EQ(parse_precision("mxfp8"), Precision::mxfp8);
    EXPECT_EQ(parse_precision("fp8-blockwise"), Precision::fp8_blockwise);
    EXPECT_EQ(parse_precision("nvfp4"), Precision::nvfp4);
    EXPECT_THROW(parse_precision("fp16"), UserError);
    // The cluster model's old names fail naming the new ones.
    EXPECT_EQ(user_error_of([] { parse_precision("fp8"); }),
              "precision 'fp8' is now spelled 'fp8-blockwise'");
    EXPECT_EQ(user_error_of([] { parse_precision("fp4"); }),
              "precision 'fp4' is now spelled 'nvfp4'");
}

// NVFP4 is a recipe the cluster model prices and the engine cannot run: every engine path that
// meets it refuses it as the user's mistake, naming the commands that take it.
TEST(LowPrecision, TheEngineRefusesNvfp4) {
    const std::string refusal = "the engine has no NVFP4 recipe yet; simulate and plan price it";
    for (size_t p = 0; p < kNumPrecisions; ++p) {
        const auto precision = static_cast<Precision>(p);
        EXPECT_EQ(engine_has_recipe(precision), precision != Precision::nvfp4);
    }
    EXPECT_EQ(user_error_of([] { require_engine_recipe(Precision::nvfp4); }), refusal);
    EXPECT_EQ(user_error_of([] { require_engine_recipe(Precision::mxfp8); }), "");
    Backend& ops = cpu_backend();
    const std::vector<float> x(16, 1.0f), w(16, 1.0f);
    std::vector<float> y(16);
    EXPECT_EQ(user_error_of([&] {
                  ops.linear_forward(y.data(), x.data(), w.data(), 4, 4, 4, {Precision::nvfp4});
              }),
              refusal);
}

}  // namespace
}  // namespace moetron
