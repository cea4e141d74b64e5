// kernels/cpu/swiglu: forward against a float64 loop, backward against float64 finite differences
// of L = sum(out * R), and saturated gates stay finite.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/swiglu.h"
#include "testing.h"

namespace moetron {
namespace {

using testing::compare;
using testing::expect_close;
using testing::finite_difference_gradient;
using testing::random_floats;
using testing::to_double;

// out[r, i] = silu(inp[r, i]) * inp[r, F + i], in double.
std::vector<double> swiglu_reference(const std::vector<double>& inp, int64_t num_rows,
                                     int64_t ffn_dim) {
    std::vector<double> out(num_rows * ffn_dim);
    for (int64_t r = 0; r < num_rows; ++r) {
        for (int64_t i = 0; i < ffn_dim; ++i) {
            const double g = inp[r * 2 * ffn_dim + i], u = inp[r * 2 * ffn_dim + ffn_dim + i];
            out[r * ffn_dim + i] = g / (1.0 + std::exp(-g)) * u;
        }
    }
    return out;
}

TEST(SwiGlu, ForwardMatchesFloat64Reference) {
    const int64_t num_rows = 6, ffn_dim = 11;
    const auto inp = random_floats(num_rows * 2 * ffn_dim, 1, 2.0f);
    std::vector<float> out(num_rows * ffn_dim);
    cpu::swiglu_forward(out.data(), inp.data(), num_rows, ffn_dim);
    const auto out_ref = swiglu_reference(to_double(inp), num_rows, ffn_dim);
    expect_close("swiglu", "out", compare(out.data(), out_ref.data(), out.size()), 1e-6);
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
    const int64_t num_rows = 5, ffn_dim = 7;
    const auto inp = random_floats(num_rows * 2 * ffn_dim, 2, 2.0f);
    const auto probe = random_floats(num_rows * ffn_dim, 3);   // R in L = sum(out * R)
    std::vector<float> dinp(num_rows * 2 * ffn_dim, 1234.5f);  // garbage: dinp is written
    cpu::swiglu_backward(dinp.data(), probe.data(), inp.data(), num_rows, ffn_dim);

    const auto probe_d = to_double(probe);
    const auto dinp_fd = finite_difference_gradient(
        [&](const std::vector<double>& x) {
            const auto y = swiglu_reference(x, num_rows, ffn_dim);
            double sum = 0;
            for (size_t i = 0; i < y.size(); ++i) sum += y[i] * probe_d[i];
            return sum;
        },
        to_double(inp));
    expect_close("swiglu", "dinp", compare(dinp.data(), dinp_fd.data(), dinp.size()), 1e-5);
}

TEST(SwiGlu, SaturatedGatesStayFinite) {
    // silu(-200) = -200 * e^-200 ~ 0 and silu(200) = 200; e^200 overflows float on the way.
    const int64_t ffn_dim = 3;
    const std::vector<float> inp = {-200.0f, 0.0f, 200.0f, 1.0f, 1.0f, 1.0f};
    std::vector<float> out(ffn_dim), dinp(2 * ffn_dim);
    const std::vector<float> dout(ffn_dim, 1.0f);
    cpu::swiglu_forward(out.data(), inp.data(), 1, ffn_dim);
    cpu::swiglu_backward(dinp.data(), dout.data(), inp.data(), 1, ffn_dim);
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_EQ(out[1], 0.0f);
    EXPECT_EQ(out[2], 200.0f);
    // d silu/dg is 0, 1/2, 1 at -inf, 0, +inf; dup = silu(g).
    EXPECT_EQ(dinp[0], 0.0f);
    EXPECT_EQ(dinp[1], 0.5f);
    EXPECT_EQ(dinp[2], 1.0f);
    EXPECT_EQ(dinp[5], 200.0f);
    for (float x : dinp) EXPECT_TRUE(std::isfinite(x));

    EXPECT_THROW(cpu::swiglu_forward(out.data(), inp.data(), 1, 0), Error);
}

}  // namespace
}  // namespace moetron
