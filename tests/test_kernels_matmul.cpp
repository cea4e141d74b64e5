// kernels/cpu/matmul: forward of matmul, linear and grouped_linear against float64 triple loops;
// backward against float64 finite differences of L = sum(out * R); the gradient rule (dweight
// accumulates, dinp is overwritten, a null dinp is skipped); empty expert segments; bad offsets.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/matmul.h"
#include "testing.h"

namespace moetron {
namespace {

using testing::compare;
using testing::expect_close;
using testing::finite_difference_gradient;
using testing::random_floats;
using testing::to_double;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- float64 references ----

// C (M, N) = op(A) op(B) + beta C.
std::vector<double> matmul_reference(const std::vector<double>& a, const std::vector<double>& b,
                                     const std::vector<double>& c_in, int64_t m, int64_t n,
                                     int64_t k, bool trans_a, bool trans_b, double beta) {
    std::vector<double> c(m * n);
    for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            double sum = 0;
            for (int64_t p = 0; p < k; ++p) {
                const double a_ip = trans_a ? a[p * m + i] : a[i * k + p];
                const double b_pj = trans_b ? b[j * k + p] : b[p * n + j];
                sum += a_ip * b_pj;
            }
            c[i * n + j] = sum + (beta != 0 ? beta * c_in[i * n + j] : 0.0);
        }
    }
    return c;
}

// out (M, O): row r of expert e is inp[r] @ weight[e]^T; a single expert is the plain linear.
std::vector<double> grouped_linear_reference(const std::vector<double>& inp,
                                             const std::vector<double>& weight,
                                             const std::vector<int64_t>& offsets, int64_t in_dim,
                                             int64_t out_dim) {
    const int64_t num_experts = static_cast<int64_t>(offsets.size()) - 1;
    std::vector<double> out(offsets.back() * out_dim);
    for (int64_t e = 0; e < num_experts; ++e) {
        for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
            for (int64_t o = 0; o < out_dim; ++o) {
                double sum = 0;
                for (int64_t i = 0; i < in_dim; ++i) {
                    sum += inp[r * in_dim + i] * weight[(e * out_dim + o) * in_dim + i];
                }
                out[r * out_dim + o] = sum;
            }
        }
    }
    return out;
}

// Finite-difference gradients of L = sum(grouped_linear(inp, weight) * probe) w.r.t. both inputs.
void grouped_linear_fd(std::vector<double>& dinp, std::vector<double>& dweight,
                       const std::vector<float>& inp, const std::vector<float>& weight,
                       const std::vector<float>& probe, const std::vector<int64_t>& offsets,
                       int64_t in_dim, int64_t out_dim) {
    const auto inp_d = to_double(inp), weight_d = to_double(weight), probe_d = to_double(probe);
    auto loss = [&](const std::vector<double>& x, const std::vector<double>& w) {
        const auto y = grouped_linear_reference(x, w, offsets, in_dim, out_dim);
        double sum = 0;
        for (size_t i = 0; i < y.size(); ++i) sum += y[i] * probe_d[i];
        return sum;
    };
    dinp = finite_difference_gradient([&](const auto& x) { return loss(x, weight_d); }, inp_d);
    dweight = finite_difference_gradient([&](const auto& w) { return loss(inp_d, w); }, weight_d);
}

// ---- matmul ----

struct MatmulCase {
    bool trans_a, trans_b;
    float beta;
};

class MatmulCases : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulCases, MatchesFloat64TripleLoop) {
    const auto [trans_a, trans_b, beta] = GetParam();
    const int64_t m = 7, n = 5, k = 9;
    const auto a = random_floats(m * k, 1), b = random_floats(k * n, 2);
    auto c = random_floats(m * n, 3);
    const auto c_ref =
        matmul_reference(to_double(a), to_double(b), to_double(c), m, n, k, trans_a, trans_b, beta);
    if (beta == 0.0f) std::fill(c.begin(), c.end(), kNaN);  // beta = 0 must not read C
    cpu::matmul(c.data(), a.data(), b.data(), m, n, k, trans_a, trans_b, beta);
    const std::string label = std::string(trans_a ? "T" : "N") + (trans_b ? "T" : "N") +
                              " beta=" + std::to_string(beta).substr(0, 4);
    expect_close("matmul", label.c_str(), compare(c.data(), c_ref.data(), c.size()), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    AllTransposes, MatmulCases,
    ::testing::Values(MatmulCase{false, false, 0.0f}, MatmulCase{false, true, 0.0f},
                      MatmulCase{true, false, 0.0f}, MatmulCase{true, true, 0.0f},
                      MatmulCase{false, false, 0.5f}, MatmulCase{false, true, 1.0f},
                      MatmulCase{true, false, -2.0f}, MatmulCase{true, true, 1.0f}));

TEST(Matmul, EmptyInnerDimensionScalesC) {
    std::vector<float> c = {1.0f, -2.0f, 3.0f, 4.0f};
    cpu::matmul(c.data(), nullptr, nullptr, 2, 2, 0, false, false, 0.5f);
    EXPECT_EQ(c, (std::vector<float>{0.5f, -1.0f, 1.5f, 2.0f}));
    std::fill(c.begin(), c.end(), kNaN);
    cpu::matmul(c.data(), nullptr, nullptr, 2, 2, 0, true, true, 0.0f);
    EXPECT_EQ(c, (std::vector<float>(4, 0.0f)));
}

TEST(Matmul, NegativeDimensionThrows) {
    float c = 0;
    EXPECT_THROW(cpu::matmul(&c, &c, &c, -1, 1, 1, false, false), Error);
}

// ---- linear ----

TEST(Linear, ForwardMatchesFloat64TripleLoop) {
    const int64_t num_rows = 6, in_dim = 11, out_dim = 4;
    const auto inp = random_floats(num_rows * in_dim, 10),
               weight = random_floats(out_dim * in_dim, 11);
    std::vector<float> out(num_rows * out_dim, kNaN);
    cpu::linear_forward(out.data(), inp.data(), weight.data(), num_rows, in_dim, out_dim);
    const auto ref =
        grouped_linear_reference(to_double(inp), to_double(weight), {0, num_rows}, in_dim, out_dim);
    expect_close("linear", "out", compare(out.data(), ref.data(), out.size()), 1e-4);
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
    const int64_t num_rows = 5, in_dim = 7, out_dim = 6;
    const auto inp = random_floats(num_rows * in_dim, 12),
               weight = random_floats(out_dim * in_dim, 13);
    const auto probe = random_floats(num_rows * out_dim, 14);  // R in L = sum(out * R)
    std::vector<float> dinp(num_rows * in_dim, kNaN), dweight(out_dim * in_dim, 0.0f);
    cpu::linear_backward(dinp.data(), dweight.data(), probe.data(), inp.data(), weight.data(),
                         num_rows, in_dim, out_dim);
    std::vector<double> dinp_fd, dweight_fd;
    grouped_linear_fd(dinp_fd, dweight_fd, inp, weight, probe, {0, num_rows}, in_dim, out_dim);
    expect_close("linear", "dinp vs fd", compare(dinp.data(), dinp_fd.data(), dinp.size()), 1e-4);
    expect_close("linear", "dweight vs fd",
                 compare(dweight.data(), dweight_fd.data(), dweight.size()), 1e-4);
}

TEST(Linear, WeightGradientAccumulatesInputGradientIsWritten) {
    const int64_t num_rows = 4, in_dim = 3, out_dim = 5;
    const auto inp = random_floats(num_rows * in_dim, 15),
               weight = random_floats(out_dim * in_dim, 16);
    const auto dout = random_floats(num_rows * out_dim, 17);
    std::vector<float> dinp_once(num_rows * in_dim), dweight_once(out_dim * in_dim, 0.0f);
    cpu::linear_backward(dinp_once.data(), dweight_once.data(), dout.data(), inp.data(),
                         weight.data(), num_rows, in_dim, out_dim);

    // Two micro-batches into the same buffers: dweight doubles, dinp is overwritten (its
    // garbage contents are never read).
    std::vector<float> dinp(num_rows * in_dim, kNaN), dweight(out_dim * in_dim, 0.0f);
    for (int step = 0; step < 2; ++step) {
        std::fill(dinp.begin(), dinp.end(), kNaN);
        cpu::linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(),
                             num_rows, in_dim, out_dim);
    }
    std::vector<float> twice(dweight_once.size());
    for (size_t i = 0; i < twice.size(); ++i) twice[i] = 2 * dweight_once[i];
    expect_close("linear", "dweight after 2 calls vs 2x one call",
                 compare(dweight.data(), twice.data(), twice.size()), 1e-5);
    expect_close("linear", "dinp after 2 calls vs one call",
                 compare(dinp.data(), dinp_once.data(), dinp.size()), 0.0);

    // A null dinp skips the input gradient and still accumulates dweight.
    cpu::linear_backward(nullptr, dweight.data(), dout.data(), inp.data(), weight.data(), num_rows,
                         in_dim, out_dim);
    std::vector<float> thrice(dweight_once.size());
    for (size_t i = 0; i < thrice.size(); ++i) thrice[i] = 3 * dweight_once[i];
    expect_close("linear", "dweight after null-dinp call",
                 compare(dweight.data(), thrice.data(), thrice.size()), 1e-5);
}

// ---- grouped linear ----

// Empty segments first, in the middle and last; uneven sizes.
const std::vector<int64_t> kOffsetsWithEmpty = {0, 0, 3, 3, 8, 9, 13, 13};

TEST(GroupedLinear, ForwardMatchesFloat64TripleLoop) {
    const int64_t in_dim = 6, out_dim = 5;
    const auto& offsets = kOffsetsWithEmpty;
    const int64_t num_experts = offsets.size() - 1, num_rows = offsets.back();
    const auto inp = random_floats(num_rows * in_dim, 20);
    const auto weight = random_floats(num_experts * out_dim * in_dim, 21);
    std::vector<float> out(num_rows * out_dim, kNaN);
    cpu::grouped_linear_forward(out.data(), inp.data(), weight.data(), offsets.data(), num_experts,
                                in_dim, out_dim);
    const auto ref =
        grouped_linear_reference(to_double(inp), to_double(weight), offsets, in_dim, out_dim);
    expect_close("grouped_linear", "out", compare(out.data(), ref.data(), out.size()), 1e-4);
}

TEST(GroupedLinear, BackwardMatchesFiniteDifferences) {
    const int64_t in_dim = 6, out_dim = 5;
    const auto& offsets = kOffsetsWithEmpty;
    const int64_t num_experts = offsets.size() - 1, num_rows = offsets.back();
    const auto inp = random_floats(num_rows * in_dim, 22);
    const auto weight = random_floats(num_experts * out_dim * in_dim, 23);
    const auto probe = random_floats(num_rows * out_dim, 24);
    std::vector<float> dinp(num_rows * in_dim, kNaN), dweight(weight.size(), 0.0f);
    cpu::grouped_linear_backward(dinp.data(), dweight.data(), probe.data(), inp.data(),
                                 weight.data(), offsets.data(), num_experts, in_dim, out_dim);
    std::vector<double> dinp_fd, dweight_fd;
    grouped_linear_fd(dinp_fd, dweight_fd, inp, weight, probe, offsets, in_dim, out_dim);
    expect_close("grouped_linear", "dinp vs fd", compare(dinp.data(), dinp_fd.data(), dinp.size()),
                 1e-4);
    expect_close("grouped_linear", "dweight vs fd",
                 compare(dweight.data(), dweight_fd.data(), dweight.size()), 1e-4);
}

TEST(GroupedLinear, WeightGradientAccumulatesAndEmptyExpertsAreUntouched) {
    const int64_t in_dim = 4, out_dim = 3;
    const auto& offsets = kOffsetsWithEmpty;
    const int64_t num_experts = offsets.size() - 1, num_rows = offsets.back();
    const auto inp = random_floats(num_rows * in_dim, 25);
    const auto weight = random_floats(num_experts * out_dim * in_dim, 26);
    const auto dout = random_floats(num_rows * out_dim, 27);
    const auto initial = random_floats(weight.size(), 28);  // gradients of earlier micro-batches

    std::vector<float> dinp_once(num_rows * in_dim), dweight_once(weight.size(), 0.0f);
    cpu::grouped_linear_backward(dinp_once.data(), dweight_once.data(), dout.data(), inp.data(),
                                 weight.data(), offsets.data(), num_experts, in_dim, out_dim);

    std::vector<float> dinp(num_rows * in_dim), dweight = initial;
    for (int step = 0; step < 2; ++step) {
        std::fill(dinp.begin(), dinp.end(), kNaN);
        cpu::grouped_linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(),
                                     weight.data(), offsets.data(), num_experts, in_dim, out_dim);
    }
    cpu::grouped_linear_backward(nullptr, dweight.data(), dout.data(), inp.data(), weight.data(),
                                 offsets.data(), num_experts, in_dim, out_dim);
    // initial + 3 calls; an expert with no rows keeps exactly its initial gradient.
    std::vector<float> expected(weight.size());
    for (size_t i = 0; i < expected.size(); ++i) expected[i] = initial[i] + 3 * dweight_once[i];
    expect_close("grouped_linear", "dweight after 3 calls vs initial + 3x one call",
                 compare(dweight.data(), expected.data(), expected.size()), 1e-5);
    expect_close("grouped_linear", "dinp after 2 calls vs one call",
                 compare(dinp.data(), dinp_once.data(), dinp.size()), 0.0);
    const int64_t weight_size = out_dim * in_dim;
    for (int64_t e = 0; e < num_experts; ++e) {
        if (offsets[e + 1] > offsets[e]) continue;
        for (int64_t i = e * weight_size; i < (e + 1) * weight_size; ++i) {
            EXPECT_EQ(dweight[i], initial[i]) << "empty expert " << e << " element " << i;
        }
    }
}

TEST(GroupedLinear, AllSegmentsEmptyAndNoExperts) {
    const int64_t in_dim = 3, out_dim = 2, num_experts = 3;
    const std::vector<int64_t> offsets(num_experts + 1, 0);
    std::vector<float> weight(num_experts * out_dim * in_dim, 1.0f), dweight(weight.size(), 7.0f);
    float unused = 0;
    cpu::grouped_linear_forward(&unused, &unused, weight.data(), offsets.data(), num_experts,
                                in_dim, out_dim);
    cpu::grouped_linear_backward(&unused, dweight.data(), &unused, &unused, weight.data(),
                                 offsets.data(), num_experts, in_dim, out_dim);
    EXPECT_EQ(dweight, std::vector<float>(weight.size(), 7.0f));
    EXPECT_EQ(unused, 0.0f);
    const int64_t no_rows[] = {0};
    cpu::grouped_linear_forward(&unused, &unused, weight.data(), no_rows, 0, in_dim, out_dim);
}

// ---- two OpenMP threads: the split paths (the suite itself runs with OMP_NUM_THREADS=1) ----

// Sets the OpenMP thread count for one scope.
class ScopedThreads {
  public:
    explicit ScopedThreads(int num_threads) : saved_(omp_get_max_threads()) {
        omp_set_num_threads(num_threads);
    }
    ~ScopedThreads() { omp_set_num_threads(saved_); }

  private:
    int saved_;
};

// Entries of these larger products are sums of ~100 unit-scale products (magnitude ~10), and
// float32 rounding scales with that magnitude, so relative errors are floored at 1, not 1e-2.
constexpr double kLargeSumFloor = 1.0;

// Large enough (> 4 MFLOP) to be split: M >= N cuts rows, M < N cuts columns (N = 200 is not a
// multiple of the 16-column alignment).
TEST(MatmulTwoThreads, RowAndColumnSplitsMatchFloat64TripleLoop) {
    const ScopedThreads threads(2);
    for (const auto& [m, n] : {std::pair<int64_t, int64_t>{200, 100}, {100, 200}}) {
        for (int transposes = 0; transposes < 4; ++transposes) {
            const bool trans_a = transposes & 1, trans_b = transposes & 2;
            const int64_t k = 120;
            const auto a = random_floats(m * k, 40), b = random_floats(k * n, 41);
            auto c = random_floats(m * n, 42);
            const auto c_ref = matmul_reference(to_double(a), to_double(b), to_double(c), m, n, k,
                                                trans_a, trans_b, 1.0);
            cpu::matmul(c.data(), a.data(), b.data(), m, n, k, trans_a, trans_b, 1.0f);
            const std::string label = std::to_string(m) + "x" + std::to_string(n) + " " +
                                      (trans_a ? "T" : "N") + (trans_b ? "T" : "N") + " 2 threads";
            expect_close("matmul", label.c_str(),
                         compare(c.data(), c_ref.data(), c.size(), kLargeSumFloor), 1e-4);
        }
    }
}

struct GroupedCase {
    const char* name;
    std::vector<int64_t> rows_per_expert;
    int64_t in_dim, out_dim;
};

void PrintTo(const GroupedCase& param, std::ostream* os) {
    *os << param.name;
}

class GroupedLinearTwoThreads : public ::testing::TestWithParam<GroupedCase> {};

// Forward and the exact backward (dinp = dout W_e is the grouped linear of dout with W_e^T;
// dW_e = dout_e^T inp_e), both through the float64 reference.
TEST_P(GroupedLinearTwoThreads, MatchesFloat64Reference) {
    const GroupedCase& param = GetParam();
    const int64_t in_dim = param.in_dim, out_dim = param.out_dim;
    const int64_t num_experts = static_cast<int64_t>(param.rows_per_expert.size());
    std::vector<int64_t> offsets = {0};
    for (int64_t rows : param.rows_per_expert) offsets.push_back(offsets.back() + rows);
    const int64_t num_rows = offsets.back();
    const auto inp = random_floats(num_rows * in_dim, 30);
    const auto weight = random_floats(num_experts * out_dim * in_dim, 31);
    const auto dout = random_floats(num_rows * out_dim, 32);
    std::vector<float> out(num_rows * out_dim, kNaN), dinp(num_rows * in_dim, kNaN),
        dweight(weight.size(), 0.0f);
    {
        const ScopedThreads threads(2);
        cpu::grouped_linear_forward(out.data(), inp.data(), weight.data(), offsets.data(),
                                    num_experts, in_dim, out_dim);
        cpu::grouped_linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(),
                                     weight.data(), offsets.data(), num_experts, in_dim, out_dim);
    }

    const auto ref =
        grouped_linear_reference(to_double(inp), to_double(weight), offsets, in_dim, out_dim);
    std::vector<double> weight_t(weight.size());
    for (int64_t e = 0; e < num_experts; ++e) {
        for (int64_t o = 0; o < out_dim; ++o) {
            for (int64_t i = 0; i < in_dim; ++i) {
                weight_t[(e * in_dim + i) * out_dim + o] = weight[(e * out_dim + o) * in_dim + i];
            }
        }
    }
    const auto dinp_ref =
        grouped_linear_reference(to_double(dout), weight_t, offsets, out_dim, in_dim);
    std::vector<double> dweight_ref(weight.size(), 0.0);
    for (int64_t e = 0; e < num_experts; ++e) {
        for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
            for (int64_t o = 0; o < out_dim; ++o) {
                for (int64_t i = 0; i < in_dim; ++i) {
                    dweight_ref[(e * out_dim + o) * in_dim + i] +=
                        double(dout[r * out_dim + o]) * inp[r * in_dim + i];
                }
            }
        }
    }
    const std::string name = param.name;
    expect_close("grouped_linear", (name + " out").c_str(),
                 compare(out.data(), ref.data(), out.size(), kLargeSumFloor), 1e-4);
    expect_close("grouped_linear", (name + " dinp").c_str(),
                 compare(dinp.data(), dinp_ref.data(), dinp.size(), kLargeSumFloor), 1e-4);
    expect_close("grouped_linear", (name + " dweight").c_str(),
                 compare(dweight.data(), dweight_ref.data(), dweight.size(), kLargeSumFloor), 1e-4);
}

// Many small experts: whole experts per thread. Few large experts (> 4 MFLOP each): every
// expert's GEMMs split over both threads. Ragged: many experts of 0 to 70 tokens with dimensions
// that leave vector tails (the small-GEMM kernels' remainders).
INSTANTIATE_TEST_SUITE_P(
    BothPaths, GroupedLinearTwoThreads,
    ::testing::Values(
        GroupedCase{
            "many-experts", {0, 7, 4, 1, 8, 5, 2, 9, 6, 3, 0, 7, 4, 1, 8, 5, 2, 9, 0, 0}, 16, 12},
        GroupedCase{"few-experts", {150, 0, 90}, 96, 160},
        GroupedCase{"ragged-experts",
                    {5, 0, 64, 1, 70, 3, 0, 17, 64, 2, 9, 33, 0, 64, 7, 1, 40, 64, 11, 6},
                    37,
                    29}),
    [](const auto& info) {
        const std::string name = info.param.name;
        return name == "many-experts" ? "Many" : name == "few-experts" ? "Few" : "Ragged";
    });

TEST(GroupedLinear, BadOffsetsThrow) {
    const int64_t in_dim = 2, out_dim = 2, num_experts = 2;
    std::vector<float> buffer(64, 0.0f);
    auto forward = [&](std::vector<int64_t> offsets, int64_t experts) {
        cpu::grouped_linear_forward(buffer.data(), buffer.data(), buffer.data(), offsets.data(),
                                    experts, in_dim, out_dim);
    };
    auto backward = [&](std::vector<int64_t> offsets) {
        cpu::grouped_linear_backward(buffer.data(), buffer.data(), buffer.data(), buffer.data(),
                                     buffer.data(), offsets.data(), num_experts, in_dim, out_dim);
    };
    EXPECT_THROW(forward({1, 2, 3}, num_experts), Error);  // must start at row 0
    EXPECT_THROW(forward({0, 3, 2}, num_experts), Error);  // decreasing
    EXPECT_THROW(backward({0, 3, 2}), Error);
    EXPECT_THROW(forward({0}, -1), Error);
    EXPECT_THROW(
        cpu::grouped_linear_forward(buffer.data(), buffer.data(), buffer.data(), nullptr, 1, 2, 2),
        Error);
    try {
        forward({0, 3, 2}, num_experts);
    } catch (const Error& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("[grouped_linear_forward]"), std::string::npos) << message;
        EXPECT_NE(message.find("non-decreasing"), std::string::npos) << message;
    }
}

}  // namespace
}  // namespace moetron
