// The native bf16 GEMM (kernels/cpu/bf16_gemm.h) and its use by the bf16 recipe's GEMMs
// (kernels/cpu/recipe_gemms.h).
//
// The kernel rounds both inputs to bfloat16 and sums their exact products in float32, so against
// the float64 sum of the rounded inputs' products each element is within float32 summation's
// bound (k + 2) 2^-24 sum |a b| (+ the rounding of beta C); inputs rounded any other way
// (truncated, say) or packed wrongly break it by orders of magnitude. Against the emulation
// (rounded inputs, float32 GEMM) it may differ by both GEMMs' summation errors, no more. Shapes
// cover odd K, partial register tiles and panels, every transposition and both betas. The tests
// skip on CPUs without AVX512_BF16 (the recipe then stays emulated, see ReportsHowItRuns).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/backend.h"
#include "moetron/kernels/cpu/bf16_gemm.h"
#include "moetron/kernels/cpu/cpu_backend.h"
#include "moetron/kernels/cpu/number_formats.h"
#include "moetron/kernels/cpu/recipe_gemms.h"

namespace moetron {
namespace {

constexpr GemmPrecision kBf16{Precision::bf16};

std::vector<float> random_matrix(int64_t count, uint64_t seed, float scale) {
    ParamRng rng(seed, "bf16_gemm");
    std::vector<float> x(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) x[i] = scale * static_cast<float>(rng.normal(i));
    return x;
}

double rounded(float x) {
    return cpu::decode_bf16(cpu::encode_bf16(x));
}

#define SKIP_WITHOUT_AVX512_BF16() \
    if (!cpu::cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16"

struct Case {
    int64_t m, n, k;
    bool trans_a, trans_b;
    float beta;
};

std::string name_of(const Case& s) {
    return "M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
           (s.trans_a ? " A^T" : "") + (s.trans_b ? " B^T" : "") +
           " beta=" + std::to_string(s.beta);
}

TEST(Bf16Gemm, EqualsFloat64OfRoundedInputsWithinFloat32Summation) {
    SKIP_WITHOUT_AVX512_BF16();
    cpu::Bf16GemmWorkspace workspace;
    const std::vector<Case> cases = {
        {64, 128, 256, false, true, 0.0f},
        {17, 33, 101, false, false, 0.0f},
        {7, 70, 1, true, false, 1.0f},
        {130, 140, 64, true, true, 1.0f},
        {6, 64, 2, false, false, 0.5f},
        {1, 1, 3, false, true, 0.0f},
        {5, 200, 0, false, false, 1.0f},
        {40, 17, 300, true, false, 0.0f},
        // A transposed A of two whole 48-row packing groups and a part, an odd k, and a B packed
        // 16 columns at a time with a 5-column tail (bf16_gemm_kernel.h).
        {100, 37, 51, true, false, 1.0f},
    };
    for (const Case& s : cases) {
        const auto a = random_matrix(s.m * s.k, 1, 1.0f);
        const auto b = random_matrix(s.k * s.n, 2, 0.05f);
        const auto c0 = random_matrix(s.m * s.n, 3, 2.0f);
        std::vector<float> c = c0;
        cpu::bf16_matmul(
            workspace, {c.data(), a.data(), b.data(), s.m, s.n, s.k, s.trans_a, s.trans_b, s.beta});
        double worst_ratio = 0;
        for (int64_t i = 0; i < s.m; ++i) {
            for (int64_t j = 0; j < s.n; ++j) {
                double exact = s.beta * static_cast<double>(c0[i * s.n + j]);
                double magnitude = std::fabs(exact);
                for (int64_t t = 0; t < s.k; ++t) {
                    const double x = rounded(s.trans_a ? a[t * s.m + i] : a[i * s.k + t]);
                    const double y = rounded(s.trans_b ? b[j * s.k + t] : b[t * s.n + j]);
                    exact += x * y;
                    magnitude += std::fabs(x * y);
                }
                const double bound = static_cast<double>(s.k + 2) * 0x1p-24 * magnitude + 1e-30;
                worst_ratio = std::max(worst_ratio, std::fabs(c[i * s.n + j] - exact) / bound);
            }
        }
        EXPECT_LE(worst_ratio, 1.0) << name_of(s);
    }
}

TEST(Bf16Gemm, ThreadsChangeNothing) {
    SKIP_WITHOUT_AVX512_BF16();
    const int64_t m = 100, n = 150, k = 333;  // 10 MFLOP: above the threshold for threads
    const auto a = random_matrix(m * k, 4, 1.0f);
    const auto b = random_matrix(n * k, 5, 1.0f);
    cpu::Bf16GemmWorkspace workspace;
    std::vector<float> one(m * n), two(m * n);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    cpu::bf16_matmul(workspace, {one.data(), a.data(), b.data(), m, n, k, false, true, 0.0f});
    omp_set_num_threads(2);
    cpu::bf16_matmul(workspace, {two.data(), a.data(), b.data(), m, n, k, false, true, 0.0f});
    omp_set_num_threads(saved);
    EXPECT_EQ(one, two);
}

// A batch of 9 GEMMs is handed out whole to 2 threads (each with its own packing buffers): the
// same values as one at a time.
TEST(Bf16Gemm, BatchOnThreadsEqualsOneByOne) {
    SKIP_WITHOUT_AVX512_BF16();
    const int64_t count = 9, m = 20, n = 70, k = 41;
    const auto a = random_matrix(count * m * k, 13, 1.0f);
    const auto b = random_matrix(count * n * k, 14, 1.0f);
    std::vector<float> batched(count * m * n, 1.0f), single(count * m * n, 1.0f);
    std::vector<cpu::Bf16Matmul> gemms;
    for (int64_t i = 0; i < count; ++i) {
        // Rows of different lengths, so that buffers sized for one GEMM would be wrong for another.
        const int64_t rows = m - i;
        gemms.push_back({batched.data() + i * m * n, a.data() + i * m * k, b.data() + i * n * k,
                         rows, n, k, false, i % 2 == 1, 1.0f});
    }
    cpu::Bf16GemmWorkspace workspace;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(2);
    cpu::bf16_matmul_batch(workspace, gemms.data(), count);
    omp_set_num_threads(saved);
    for (int64_t i = 0; i < count; ++i) {
        cpu::Bf16Matmul g = gemms[i];
        g.c = single.data() + i * m * n;
        cpu::bf16_matmul(workspace, g);
    }
    EXPECT_EQ(batched, single);
}

// |x - y| <= both GEMMs' float32 summation bounds, per element, given sum |a b| per element.
void expect_same_up_to_summation(const std::vector<float>& native,
                                 const std::vector<float>& emulated,
                                 const std::vector<double>& magnitude, int64_t k,
                                 const std::string& what) {
    ASSERT_EQ(native.size(), emulated.size());
    double worst_ratio = 0, max_difference = 0;
    for (size_t i = 0; i < native.size(); ++i) {
        const double difference = std::fabs(native[i] - static_cast<double>(emulated[i]));
        max_difference = std::max(max_difference, difference);
        const double bound = 2.0 * static_cast<double>(k + 2) * 0x1p-24 * magnitude[i] + 1e-30;
        worst_ratio = std::max(worst_ratio, difference / bound);
    }
    EXPECT_LE(worst_ratio, 1.0) << what << ": max difference " << max_difference;
}

// sum_t |op(A)[i][t] op(B)[t][j]| of the rounded inputs, for the bound above.
template <class GetA, class GetB>
std::vector<double> magnitudes(int64_t m, int64_t n, int64_t k, GetA a, GetB b) {
    std::vector<double> out(static_cast<size_t>(m * n), 0.0);
    for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            for (int64_t t = 0; t < k; ++t)
                out[i * n + j] += std::fabs(rounded(a(i, t)) * rounded(b(t, j)));
        }
    }
    return out;
}

TEST(Bf16Recipe, NativeEqualsEmulationUpToSummationOrder) {
    SKIP_WITHOUT_AVX512_BF16();
    cpu::RecipeGemms native(cpu::Bf16Gemm::native);
    cpu::RecipeGemms emulated(cpu::Bf16Gemm::emulated);
    ASSERT_TRUE(native.native_bf16());
    ASSERT_FALSE(emulated.native_bf16());
    const int64_t rows = 45, in = 70, out = 36;
    const auto x = random_matrix(rows * in, 6, 1.0f);
    const auto w = random_matrix(out * in, 7, 0.05f);
    const auto dout = random_matrix(rows * out, 8, 1e-3f);
    const auto dw0 = random_matrix(out * in, 9, 1e-2f);
    auto x_at = [&](int64_t i, int64_t t) { return x[i * in + t]; };

    std::vector<float> y[2], dx[2], dw[2];
    for (int which = 0; which < 2; ++which) {
        cpu::RecipeGemms& ops = which == 0 ? native : emulated;
        y[which].resize(rows * out);
        dx[which].resize(rows * in);
        dw[which] = dw0;
        ops.linear_forward(y[which].data(), x.data(), w.data(), rows, in, out, kBf16);
        ops.linear_backward(dx[which].data(), dw[which].data(), dout.data(), x.data(), w.data(),
                            rows, in, out, kBf16);
    }
    expect_same_up_to_summation(
        y[0], y[1],
        magnitudes(rows, out, in, x_at, [&](int64_t t, int64_t j) { return w[j * in + t]; }), in,
        "forward");
    expect_same_up_to_summation(
        dx[0], dx[1],
        magnitudes(
            rows, in, out, [&](int64_t i, int64_t t) { return dout[i * out + t]; },
            [&](int64_t t, int64_t j) { return w[t * in + j]; }),
        out, "input gradient");
    auto dw_magnitude = magnitudes(
        out, in, rows, [&](int64_t i, int64_t t) { return dout[t * out + i]; }, x_at);
    for (size_t i = 0; i < dw_magnitude.size(); ++i) dw_magnitude[i] += std::fabs(dw0[i]);
    expect_same_up_to_summation(dw[0], dw[1], dw_magnitude, rows, "weight gradient");
}

TEST(Bf16Recipe, GroupedNativeEqualsEmulationUpToSummationOrder) {
    SKIP_WITHOUT_AVX512_BF16();
    cpu::RecipeGemms native(cpu::Bf16Gemm::native);
    cpu::RecipeGemms emulated(cpu::Bf16Gemm::emulated);
    const int64_t experts = 3, in = 50, out = 24;
    const std::vector<int64_t> offsets = {0, 13, 13, 40};  // one expert without tokens
    const int64_t rows = offsets.back();
    const auto x = random_matrix(rows * in, 10, 1.0f);
    const auto w = random_matrix(experts * out * in, 11, 0.05f);
    const auto dout = random_matrix(rows * out, 12, 1e-2f);
    std::vector<float> y[2], dx[2], dw[2];
    for (int which = 0; which < 2; ++which) {
        cpu::RecipeGemms& ops = which == 0 ? native : emulated;
        y[which].resize(rows * out);
        dx[which].resize(rows * in);
        dw[which].assign(experts * out * in, 0.0f);
        ops.grouped_linear_forward(y[which].data(), x.data(), w.data(), offsets.data(), experts, in,
                                   out, kBf16);
        ops.grouped_linear_backward(dx[which].data(), dw[which].data(), dout.data(), x.data(),
                                    w.data(), offsets.data(), experts, in, out, kBf16);
    }
    std::vector<double> y_magnitude(rows * out), dx_magnitude(rows * in),
        dw_magnitude(experts * out * in);
    for (int64_t e = 0; e < experts; ++e) {
        const int64_t r0 = offsets[e], m = offsets[e + 1] - offsets[e];
        const float* we = w.data() + e * out * in;
        const auto ym = magnitudes(
            m, out, in, [&](int64_t i, int64_t t) { return x[(r0 + i) * in + t]; },
            [&](int64_t t, int64_t j) { return we[j * in + t]; });
        std::copy(ym.begin(), ym.end(), y_magnitude.begin() + r0 * out);
        const auto dxm = magnitudes(
            m, in, out, [&](int64_t i, int64_t t) { return dout[(r0 + i) * out + t]; },
            [&](int64_t t, int64_t j) { return we[t * in + j]; });
        std::copy(dxm.begin(), dxm.end(), dx_magnitude.begin() + r0 * in);
        const auto dwm = magnitudes(
            out, in, m, [&](int64_t i, int64_t t) { return dout[(r0 + t) * out + i]; },
            [&](int64_t t, int64_t j) { return x[(r0 + t) * in + j]; });
        std::copy(dwm.begin(), dwm.end(), dw_magnitude.begin() + e * out * in);
    }
    expect_same_up_to_summation(y[0], y[1], y_magnitude, in, "grouped forward");
    expect_same_up_to_summation(dx[0], dx[1], dx_magnitude, out, "grouped input gradient");
    expect_same_up_to_summation(dw[0], dw[1], dw_magnitude, rows, "grouped weight gradient");
}

// The environment variable the benchmarks use, set for one scope.
class ScopedEnvironment {
  public:
    ScopedEnvironment(const char* name, const char* value) : name_(name) {
        const char* old = std::getenv(name);
        if (old != nullptr) old_ = old;
        had_ = old != nullptr;
        setenv(name, value, 1);
    }
    ~ScopedEnvironment() {
        if (had_) {
            setenv(name_, old_.c_str(), 1);
        } else {
            unsetenv(name_);
        }
    }
    ScopedEnvironment(const ScopedEnvironment&) = delete;
    ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

  private:
    const char* name_;
    std::string old_;
    bool had_ = false;
};

TEST(Bf16Recipe, ReportsHowItRuns) {
    const bool cpu_native = cpu::cpu_has_avx512_bf16();
    {
        ScopedEnvironment unset("MOETRON_BF16_GEMM", "");
        const cpu::RecipeGemms automatic;
        EXPECT_EQ(automatic.native_bf16(), cpu_native);
        const std::string expected =
            cpu_native ? "bf16: native AVX512_BF16" : "bf16: emulated (no AVX512_BF16)";
        const std::string line = make_cpu_backend()->describe_gemms(Precision::bf16);
        EXPECT_NE(line.find(expected), std::string::npos) << line;
    }
    {
        ScopedEnvironment forced("MOETRON_BF16_GEMM", "emulated");
        const cpu::RecipeGemms automatic;
        EXPECT_FALSE(automatic.native_bf16());
        const std::string line = automatic.describe(Precision::bf16);
        EXPECT_NE(line.find("bf16: emulated (MOETRON_BF16_GEMM=emulated)"), std::string::npos)
            << line;
    }
    {
        ScopedEnvironment wrong("MOETRON_BF16_GEMM", "fast");
        EXPECT_THROW(cpu::RecipeGemms{}, UserError);
        EXPECT_THROW(make_cpu_backend(), UserError);
    }
    if (!cpu_native) {
        EXPECT_THROW(cpu::RecipeGemms{cpu::Bf16Gemm::native}, UserError);
    }
}

}  // namespace
}  // namespace moetron
