// kernels/cpu/attention: forward (out and lse) against a float64 loop that materializes the score
// matrix, backward against float64 finite differences of L = sum(out * R), causality, and
// stability with large scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/attention.h"
#include "testing.h"

namespace moetron {
namespace {

using testing::compare;
using testing::expect_close;
using testing::finite_difference_gradient;
using testing::random_floats;
using testing::to_double;

struct Shape {
    int64_t batch, seq_len, num_heads, qk_dim, v_dim;
    int64_t qk_size() const { return batch * seq_len * num_heads * qk_dim; }
    int64_t v_size() const { return batch * seq_len * num_heads * v_dim; }
    int64_t lse_size() const { return batch * num_heads * seq_len; }
    float scale() const { return 1.0f / std::sqrt(static_cast<float>(qk_dim)); }
    std::string name() const {
        return "B=" + std::to_string(batch) + " S=" + std::to_string(seq_len) +
               " H=" + std::to_string(num_heads) + " Dqk=" + std::to_string(qk_dim) +
               " Dv=" + std::to_string(v_dim);
    }
};

void PrintTo(const Shape& s, std::ostream* os) {
    *os << s.name();
}

// "dq B=2 S=5 ...": the figure and the shape it was measured on.
std::string label(const char* what, const Shape& s) {
    return std::string(what) + " " + s.name();
}

// The scaled score scale * q[b,i,h] . k[b,j,h], in double.
double score(const Shape& s, const std::vector<double>& q, const std::vector<double>& k, int64_t b,
             int64_t h, int64_t i, int64_t j, double scale) {
    const double* q_row = q.data() + ((b * s.seq_len + i) * s.num_heads + h) * s.qk_dim;
    const double* k_row = k.data() + ((b * s.seq_len + j) * s.num_heads + h) * s.qk_dim;
    double dot = 0;
    for (int64_t d = 0; d < s.qk_dim; ++d) dot += q_row[d] * k_row[d];
    return scale * dot;
}

// Plain causal softmax attention in double, one full score row at a time.
void attention_reference(std::vector<double>& out, std::vector<double>& lse, const Shape& s,
                         const std::vector<double>& q, const std::vector<double>& k,
                         const std::vector<double>& v, double scale) {
    out.assign(s.v_size(), 0.0);
    lse.assign(s.lse_size(), 0.0);
    std::vector<double> row(s.seq_len);
    for (int64_t b = 0; b < s.batch; ++b) {
        for (int64_t h = 0; h < s.num_heads; ++h) {
            for (int64_t i = 0; i < s.seq_len; ++i) {
                double row_max = -std::numeric_limits<double>::infinity();
                for (int64_t j = 0; j <= i; ++j) {
                    row[j] = score(s, q, k, b, h, i, j, scale);
                    row_max = std::max(row_max, row[j]);
                }
                double sum = 0;
                for (int64_t j = 0; j <= i; ++j) sum += std::exp(row[j] - row_max);
                const double row_lse = row_max + std::log(sum);
                lse[(b * s.num_heads + h) * s.seq_len + i] = row_lse;
                double* out_row = out.data() + ((b * s.seq_len + i) * s.num_heads + h) * s.v_dim;
                for (int64_t j = 0; j <= i; ++j) {
                    const double p = std::exp(row[j] - row_lse);
                    const double* v_row =
                        v.data() + ((b * s.seq_len + j) * s.num_heads + h) * s.v_dim;
                    for (int64_t d = 0; d < s.v_dim; ++d) out_row[d] += p * v_row[d];
                }
            }
        }
    }
}

struct Inputs {
    std::vector<float> q, k, v;
    Inputs(const Shape& s, uint64_t seed, float q_scale = 1.0f)
        : q(random_floats(s.qk_size(), seed, q_scale)),
          k(random_floats(s.qk_size(), seed + 1)),
          v(random_floats(s.v_size(), seed + 2)) {}
};

void run_forward(std::vector<float>& out, std::vector<float>& lse, const Shape& s,
                 const Inputs& in) {
    out.assign(s.v_size(), 0.0f);
    lse.assign(s.lse_size(), 0.0f);
    cpu::attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), s.batch,
                           s.seq_len, s.num_heads, s.qk_dim, s.v_dim, s.scale());
}

class AttentionShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(AttentionShapes, ForwardMatchesFloat64Reference) {
    const Shape s = GetParam();
    const Inputs in(s, 10);
    std::vector<float> out, lse;
    run_forward(out, lse, s, in);
    std::vector<double> out_ref, lse_ref;
    attention_reference(out_ref, lse_ref, s, to_double(in.q), to_double(in.k), to_double(in.v),
                        s.scale());
    expect_close("attention", label("out", s).c_str(),
                 compare(out.data(), out_ref.data(), out.size()), 2e-5);
    expect_close("attention", label("lse", s).c_str(),
                 compare(lse.data(), lse_ref.data(), lse.size()), 1e-5);
}

TEST_P(AttentionShapes, BackwardMatchesFiniteDifferences) {
    const Shape s = GetParam();
    const Inputs in(s, 20);
    const auto probe = random_floats(s.v_size(), 23);  // R in L = sum(out * R)
    std::vector<float> out, lse;
    run_forward(out, lse, s, in);
    // Garbage in the gradients: they are written, not accumulated.
    std::vector<float> dq(s.qk_size(), 1234.5f), dk(s.qk_size(), 1234.5f), dv(s.v_size(), 1234.5f);
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), probe.data(), in.q.data(), in.k.data(),
                            in.v.data(), out.data(), lse.data(), s.batch, s.seq_len, s.num_heads,
                            s.qk_dim, s.v_dim, s.scale());

    const auto q = to_double(in.q), k = to_double(in.k), v = to_double(in.v);
    const auto probe_d = to_double(probe);
    auto loss = [&](const std::vector<double>& qd, const std::vector<double>& kd,
                    const std::vector<double>& vd) {
        std::vector<double> y, unused_lse;
        attention_reference(y, unused_lse, s, qd, kd, vd, s.scale());
        double sum = 0;
        for (size_t i = 0; i < y.size(); ++i) sum += y[i] * probe_d[i];
        return sum;
    };
    const auto dq_fd = finite_difference_gradient([&](const auto& x) { return loss(x, k, v); }, q);
    const auto dk_fd = finite_difference_gradient([&](const auto& x) { return loss(q, x, v); }, k);
    const auto dv_fd = finite_difference_gradient([&](const auto& x) { return loss(q, k, x); }, v);
    expect_close("attention", label("dq", s).c_str(), compare(dq.data(), dq_fd.data(), dq.size()),
                 1e-4);
    expect_close("attention", label("dk", s).c_str(), compare(dk.data(), dk_fd.data(), dk.size()),
                 1e-4);
    expect_close("attention", label("dv", s).c_str(), compare(dv.data(), dv_fd.data(), dv.size()),
                 1e-4);
}

// The brief's shape; a single token; Dqk == Dv; and S = 70, which spans two of the kernel's
// 64-wide query and key blocks with a partial last one.
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionShapes,
                         ::testing::Values(Shape{2, 5, 3, 6, 4}, Shape{2, 1, 2, 5, 3},
                                           Shape{1, 4, 2, 4, 4}, Shape{1, 70, 1, 8, 4}));

// The backward in double from the probabilities (see attention.cpp for the formulas), for shapes
// too large for finite differences.
void attention_backward_reference(std::vector<double>& dq, std::vector<double>& dk,
                                  std::vector<double>& dv, const Shape& s,
                                  const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, const std::vector<double>& dout,
                                  double scale) {
    std::vector<double> out, lse;
    attention_reference(out, lse, s, q, k, v, scale);
    dq.assign(s.qk_size(), 0.0);
    dk.assign(s.qk_size(), 0.0);
    dv.assign(s.v_size(), 0.0);
    auto qk_row = [&](int64_t b, int64_t t, int64_t h) {
        return ((b * s.seq_len + t) * s.num_heads + h) * s.qk_dim;
    };
    auto v_row = [&](int64_t b, int64_t t, int64_t h) {
        return ((b * s.seq_len + t) * s.num_heads + h) * s.v_dim;
    };
    for (int64_t b = 0; b < s.batch; ++b) {
        for (int64_t h = 0; h < s.num_heads; ++h) {
            for (int64_t i = 0; i < s.seq_len; ++i) {
                double d_i = 0;
                for (int64_t d = 0; d < s.v_dim; ++d) {
                    d_i += dout[v_row(b, i, h) + d] * out[v_row(b, i, h) + d];
                }
                const double lse_i = lse[(b * s.num_heads + h) * s.seq_len + i];
                for (int64_t j = 0; j <= i; ++j) {
                    const double p = std::exp(score(s, q, k, b, h, i, j, scale) - lse_i);
                    double dp = 0;
                    for (int64_t d = 0; d < s.v_dim; ++d) {
                        dp += dout[v_row(b, i, h) + d] * v[v_row(b, j, h) + d];
                        dv[v_row(b, j, h) + d] += p * dout[v_row(b, i, h) + d];
                    }
                    const double ds = p * (dp - d_i) * scale;
                    for (int64_t d = 0; d < s.qk_dim; ++d) {
                        dq[qk_row(b, i, h) + d] += ds * k[qk_row(b, j, h) + d];
                        dk[qk_row(b, j, h) + d] += ds * q[qk_row(b, i, h) + d];
                    }
                }
            }
        }
    }
}

// Forward and backward against float64 on shapes too large for finite differences.
class AttentionLargeShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(AttentionLargeShapes, ForwardAndBackwardMatchFloat64) {
    const Shape s = GetParam();
    const Inputs in(s, 90);
    std::vector<float> out, lse;
    run_forward(out, lse, s, in);
    std::vector<double> out_ref, lse_ref;
    attention_reference(out_ref, lse_ref, s, to_double(in.q), to_double(in.k), to_double(in.v),
                        s.scale());
    expect_close("attention", label("out", s).c_str(),
                 compare(out.data(), out_ref.data(), out.size()), 1e-4);
    expect_close("attention", label("lse", s).c_str(),
                 compare(lse.data(), lse_ref.data(), lse.size()), 1e-5);

    const auto dout = random_floats(s.v_size(), 93);
    std::vector<float> dq(s.qk_size()), dk(s.qk_size()), dv(s.v_size());
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), in.q.data(), in.k.data(),
                            in.v.data(), out.data(), lse.data(), s.batch, s.seq_len, s.num_heads,
                            s.qk_dim, s.v_dim, s.scale());
    std::vector<double> dq_ref, dk_ref, dv_ref;
    attention_backward_reference(dq_ref, dk_ref, dv_ref, s, to_double(in.q), to_double(in.k),
                                 to_double(in.v), to_double(dout), s.scale());
    // Gradients are sums over up to 131 keys or queries: errors relative to at least 1.
    expect_close("attention", label("dq", s).c_str(),
                 compare(dq.data(), dq_ref.data(), dq.size(), 1.0), 1e-4);
    expect_close("attention", label("dk", s).c_str(),
                 compare(dk.data(), dk_ref.data(), dk.size(), 1.0), 1e-4);
    expect_close("attention", label("dv", s).c_str(),
                 compare(dv.data(), dv_ref.data(), dv.size(), 1.0), 1e-4);
}

// MLA's head dims (192 / 128) over 131 tokens: three query and key blocks of the kernel, the last
// partial, and whole vectors plus tails in every product; two heads so that rows are strided.
// Head dims above the kernel's 256 (packed a chunk at a time) over two blocks. 4100 tokens: the
// backward's queries come in spans of 4096, and keys of the first span are seen again by the
// second (their dk and dv accumulate across spans).
INSTANTIATE_TEST_SUITE_P(Large, AttentionLargeShapes,
                         ::testing::Values(Shape{1, 131, 2, 192, 128}, Shape{1, 70, 1, 300, 260},
                                           Shape{1, 4100, 1, 4, 3}));

TEST(Attention, FutureTokensDoNotChangeEarlierOutputs) {
    const Shape s{2, 9, 2, 6, 4};
    Inputs in(s, 30);
    std::vector<float> out_before, lse_before;
    run_forward(out_before, lse_before, s, in);

    // Change every head's k and v at token 6 of both sequences.
    const int64_t changed = 6;
    for (int64_t b = 0; b < s.batch; ++b) {
        for (int64_t h = 0; h < s.num_heads; ++h) {
            const int64_t row = (b * s.seq_len + changed) * s.num_heads + h;
            for (int64_t d = 0; d < s.qk_dim; ++d) in.k[row * s.qk_dim + d] += 3.0f;
            for (int64_t d = 0; d < s.v_dim; ++d) in.v[row * s.v_dim + d] -= 5.0f;
        }
    }
    std::vector<float> out_after, lse_after;
    run_forward(out_after, lse_after, s, in);

    const int64_t row_floats = s.num_heads * s.v_dim;  // one token's outputs
    for (int64_t b = 0; b < s.batch; ++b) {
        for (int64_t t = 0; t < s.seq_len; ++t) {
            const int64_t first = (b * s.seq_len + t) * row_floats;
            const bool same =
                std::equal(out_before.begin() + first, out_before.begin() + first + row_floats,
                           out_after.begin() + first);
            // Earlier tokens bit-for-bit unchanged; the changed token and later ones do change.
            EXPECT_EQ(same, t < changed) << "batch " << b << " token " << t;
        }
    }
}

TEST(Attention, LseIsLogSumExpOfScaledScores) {
    const Shape s{1, 6, 2, 5, 3};
    const Inputs in(s, 40);
    std::vector<float> out, lse;
    run_forward(out, lse, s, in);
    const auto q = to_double(in.q), k = to_double(in.k);
    std::vector<double> expected(s.lse_size());
    for (int64_t h = 0; h < s.num_heads; ++h) {
        for (int64_t i = 0; i < s.seq_len; ++i) {
            double sum = 0;  // unshifted: the scores here are O(1)
            for (int64_t j = 0; j <= i; ++j) sum += std::exp(score(s, q, k, 0, h, i, j, s.scale()));
            expected[h * s.seq_len + i] = std::log(sum);
        }
    }
    // Row 0 sees only itself: lse = its own score.
    EXPECT_NEAR(lse[0], score(s, q, k, 0, 0, 0, 0, s.scale()), 1e-6);
    expect_close("attention", "lse vs log-sum-exp",
                 compare(lse.data(), expected.data(), lse.size()), 1e-5);
}

TEST(Attention, LargeScoresStayFiniteAndAccurate) {
    // Queries 30x larger give scores of +-100 and more: exp would overflow float without the
    // running max.
    const Shape s{1, 40, 2, 8, 4};
    const Inputs in(s, 50, 30.0f);
    std::vector<float> out, lse;
    run_forward(out, lse, s, in);
    for (float x : out) ASSERT_TRUE(std::isfinite(x));
    std::vector<double> out_ref, lse_ref;
    attention_reference(out_ref, lse_ref, s, to_double(in.q), to_double(in.k), to_double(in.v),
                        s.scale());
    expect_close("attention", "out (large scores)", compare(out.data(), out_ref.data(), out.size()),
                 1e-4);
    expect_close("attention", "lse (large scores)", compare(lse.data(), lse_ref.data(), lse.size()),
                 1e-5);
}

TEST(Attention, BadArgumentsAreErrors) {
    std::vector<float> buf(64);
    float* p = buf.data();
    EXPECT_THROW(cpu::attention_forward(p, p, p, p, p, 1, 2, 0, 4, 4, 0.5f), Error);
    EXPECT_THROW(cpu::attention_forward(p, p, p, p, p, 1, 2, 1, 0, 4, 0.5f), Error);
    EXPECT_THROW(cpu::attention_forward(p, p, p, p, p, 1, 2, 1, 4, 4, 0.0f), Error);
    EXPECT_THROW(cpu::attention_backward(p, p, p, p, p, p, p, p, p, 1, 2, 1, 4, 4, std::nanf("")),
                 Error);
}

}  // namespace
}  // namespace moetron
