// kernels/cpu/rope: the angle table, the forward against the Hugging Face formulation
// (de-interleave then rotate_half) and a float64 loop, the properties that make it RoPE (identity
// at position 0, q.k depends only on relative position), and the backward as the transpose of the
// forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/rope.h"
#include "testing.h"

namespace moetron {
namespace {

using testing::compare;
using testing::expect_close;
using testing::finite_difference_gradient;
using testing::random_floats;
using testing::to_double;

// transformers' DeepSeek-V3 apply_rotary_pos_emb_interleave on one R-vector, step by step:
//   x = x.view(R/2, 2).transpose(-1, -2).reshape(R); out = x * cat(cos, cos) + rotate_half(x) *
//   cat(sin, sin), rotate_half(x) = cat(-x[R/2:], x[:R/2]).
std::vector<double> hf_rope(const std::vector<double>& x, int64_t pos, double theta) {
    const int64_t rope_dim = static_cast<int64_t>(x.size()), half = rope_dim / 2;
    std::vector<double> deinterleaved(rope_dim);
    for (int64_t i = 0; i < half; ++i) {
        deinterleaved[i] = x[2 * i];
        deinterleaved[half + i] = x[2 * i + 1];
    }
    std::vector<double> rotated_half(rope_dim), cos_full(rope_dim), sin_full(rope_dim);
    for (int64_t i = 0; i < half; ++i) {
        rotated_half[i] = -deinterleaved[half + i];
        rotated_half[half + i] = deinterleaved[i];
        const double inv_freq = 1.0 / std::pow(theta, static_cast<double>(2 * i) / rope_dim);
        cos_full[i] = cos_full[half + i] = std::cos(pos * inv_freq);
        sin_full[i] = sin_full[half + i] = std::sin(pos * inv_freq);
    }
    std::vector<double> out(rope_dim);
    for (int64_t i = 0; i < rope_dim; ++i)
        out[i] = deinterleaved[i] * cos_full[i] + rotated_half[i] * sin_full[i];
    return out;
}

// The kernel's argument set for one strided layout, with the tables it needs.
struct RopeLayout {
    int64_t num_tokens, seq_len, num_heads, head_stride, rope_offset, rope_dim;
    float theta;
    std::vector<float> cos, sin;

    RopeLayout(int64_t n, int64_t s, int64_t h, int64_t stride, int64_t offset, int64_t r, float th)
        : num_tokens(n),
          seq_len(s),
          num_heads(h),
          head_stride(stride),
          rope_offset(offset),
          rope_dim(r),
          theta(th),
          cos(s * r / 2),
          sin(s * r / 2) {
        cpu::rope_tables(cos.data(), sin.data(), seq_len, rope_dim, theta);
    }
    int64_t size() const { return num_tokens * num_heads * head_stride; }
    void forward(float* x) const {
        cpu::rope_forward(x, cos.data(), sin.data(), num_tokens, seq_len, num_heads, head_stride,
                          rope_offset, rope_dim);
    }
    void backward(float* dx) const {
        cpu::rope_backward(dx, cos.data(), sin.data(), num_tokens, seq_len, num_heads, head_stride,
                           rope_offset, rope_dim);
    }
    // The whole buffer after RoPE in double: each head's slice through hf_rope, the rest as is.
    std::vector<double> reference(const std::vector<double>& x) const {
        std::vector<double> y = x;
        for (int64_t t = 0; t < num_tokens; ++t) {
            for (int64_t h = 0; h < num_heads; ++h) {
                const int64_t start = (t * num_heads + h) * head_stride + rope_offset;
                const std::vector<double> slice(x.begin() + start, x.begin() + start + rope_dim);
                const auto rotated = hf_rope(slice, t % seq_len, theta);
                std::copy(rotated.begin(), rotated.end(), y.begin() + start);
            }
        }
        return y;
    }
};

TEST(Rope, TablesMatchInverseFrequencyFormula) {
    const int64_t seq_len = 50, rope_dim = 8;
    const double theta = 10000.0;
    std::vector<float> cos(seq_len * rope_dim / 2), sin(cos.size());
    cpu::rope_tables(cos.data(), sin.data(), seq_len, rope_dim, static_cast<float>(theta));
    std::vector<double> cos_ref(cos.size()), sin_ref(cos.size());
    for (int64_t p = 0; p < seq_len; ++p) {
        for (int64_t i = 0; i < rope_dim / 2; ++i) {
            const double angle = p * std::pow(theta, -2.0 * i / rope_dim);
            cos_ref[p * rope_dim / 2 + i] = std::cos(angle);
            sin_ref[p * rope_dim / 2 + i] = std::sin(angle);
        }
    }
    // Floor 1: entries are in [-1, 1], so the absolute error is what matters.
    expect_close("rope", "cos table", compare(cos.data(), cos_ref.data(), cos.size(), 1.0), 1e-7);
    expect_close("rope", "sin table", compare(sin.data(), sin_ref.data(), sin.size(), 1.0), 1e-7);
}

TEST(Rope, HandWrittenExampleMatchesHuggingFaceLayout) {
    // x = (1, 2, 3, 4) at position 1, R = 4, theta = 100: pairs (1, 2) and (3, 4) turn by 1 and
    // 1/10 radian. De-interleaved: (1, 3 | 2, 4); rotate_half: (-2, -4 | 1, 3).
    const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(0.1), s1 = std::sin(0.1);
    const std::vector<double> expected = {1 * c0 - 2 * s0, 3 * c1 - 4 * s1, 2 * c0 + 1 * s0,
                                          4 * c1 + 3 * s1};
    const auto hf = hf_rope({1, 2, 3, 4}, 1, 100.0);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(hf[i], expected[i], 1e-12);

    // The kernel on two tokens of one sequence; the second token sits at position 1.
    RopeLayout layout(2, 2, 1, 4, 0, 4, 100.0f);
    std::vector<float> x = {9, 9, 9, 9, 1, 2, 3, 4};
    layout.forward(x.data());
    expect_close("rope", "hand example", compare(x.data() + 4, expected.data(), 4), 1e-6);
}

TEST(Rope, ForwardMatchesReferenceOnStridedSlicesAndLeavesTheRestAlone) {
    // Two sequences of 4 tokens, 3 heads of stride 10, the rope slice at [3, 9).
    RopeLayout layout(8, 4, 3, 10, 3, 6, 10000.0f);
    const auto x0 = random_floats(layout.size(), 1);
    std::vector<float> x = x0;
    layout.forward(x.data());
    const auto expected = layout.reference(to_double(x0));
    // Float tables and float arithmetic: ~1e-7 absolute, relative to the 1e-2 floor near zero.
    expect_close("rope", "forward", compare(x.data(), expected.data(), x.size()), 1e-5);
    // Dims outside the slice are bit-for-bit unchanged.
    for (int64_t row = 0; row < 8 * 3; ++row) {
        for (int64_t d = 0; d < 10; ++d) {
            if (d >= 3 && d < 9) continue;
            EXPECT_EQ(x[row * 10 + d], x0[row * 10 + d]) << "row " << row << " dim " << d;
        }
    }
}

TEST(Rope, PositionZeroIsTheDeinterleavePermutation) {
    RopeLayout layout(1, 1, 1, 8, 0, 8, 10000.0f);
    const auto x0 = random_floats(8, 2);
    std::vector<float> x = x0;
    layout.forward(x.data());
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(x[i], x0[2 * i]);
        EXPECT_EQ(x[4 + i], x0[2 * i + 1]);
    }
}

TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
    // One head of R = 16 over 64 positions; q at p and k at p + 7 for several p.
    const int64_t seq_len = 64, rope_dim = 16, offset = 7;
    RopeLayout layout(seq_len, seq_len, 1, rope_dim, 0, rope_dim, 10000.0f);
    const auto q = random_floats(rope_dim, 3), k = random_floats(rope_dim, 4);
    std::vector<float> all_q(seq_len * rope_dim), all_k(seq_len * rope_dim);
    for (int64_t t = 0; t < seq_len; ++t) {
        std::copy(q.begin(), q.end(), all_q.begin() + t * rope_dim);
        std::copy(k.begin(), k.end(), all_k.begin() + t * rope_dim);
    }
    layout.forward(all_q.data());
    layout.forward(all_k.data());
    auto rotated_dot = [&](int64_t q_pos, int64_t k_pos) {
        double sum = 0;
        for (int64_t i = 0; i < rope_dim; ++i)
            sum += static_cast<double>(all_q[q_pos * rope_dim + i]) * all_k[k_pos * rope_dim + i];
        return sum;
    };
    const double at_zero = rotated_dot(0, offset);
    double unrotated = 0;
    for (int64_t i = 0; i < rope_dim; ++i) unrotated += static_cast<double>(q[i]) * k[i];
    EXPECT_GT(std::fabs(at_zero - unrotated), 1e-3) << "the offset should change the product";
    double max_diff = 0;
    for (int64_t p : {1, 5, 17, 40, 56}) {
        max_diff = std::max(max_diff, std::fabs(rotated_dot(p, p + offset) - at_zero));
    }
    std::printf("[maxerr] rope relative-position q.k abs=%.3e\n", max_diff);
    EXPECT_LE(max_diff, 1e-5 * (1 + std::fabs(at_zero)));
}

TEST(Rope, BackwardIsTheTransposeOfForward) {
    RopeLayout layout(6, 3, 2, 9, 1, 8, 10000.0f);
    const auto x = random_floats(layout.size(), 5);
    const auto probe = random_floats(layout.size(), 6);  // R in L = sum(rope(x) * R)
    std::vector<float> dx = probe;
    layout.backward(dx.data());

    const auto probe_d = to_double(probe);
    const auto dx_fd = finite_difference_gradient(
        [&](const std::vector<double>& xd) {
            const auto y = layout.reference(xd);
            double sum = 0;
            for (size_t i = 0; i < y.size(); ++i) sum += y[i] * probe_d[i];
            return sum;
        },
        to_double(x));
    expect_close("rope", "dx", compare(dx.data(), dx_fd.data(), dx.size()), 1e-5);

    // A rotation is orthogonal: its transpose undoes it.
    std::vector<float> round_trip = x;
    layout.forward(round_trip.data());
    layout.backward(round_trip.data());
    expect_close("rope", "backward(forward(x))",
                 compare(round_trip.data(), to_double(x).data(), x.size()), 1e-6);
}

TEST(Rope, BadLayoutsAreErrors) {
    std::vector<float> cos(8), sin(8), x(64);
    // Odd rope dim; slice past the head; non-positive theta.
    EXPECT_THROW(cpu::rope_forward(x.data(), cos.data(), sin.data(), 1, 1, 1, 8, 0, 5), Error);
    EXPECT_THROW(cpu::rope_forward(x.data(), cos.data(), sin.data(), 1, 1, 1, 8, 4, 6), Error);
    EXPECT_THROW(cpu::rope_tables(cos.data(), sin.data(), 2, 8, 0.0f), Error);
}

}  // namespace
}  // namespace moetron
