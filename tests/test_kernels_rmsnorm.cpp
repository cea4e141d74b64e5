// kernels/cpu/rmsnorm: forward against a float64 loop, backward against float64 finite differences
// of L = sum(out * R), and the gradient rule (dweight accumulates, dinp is overwritten).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/blas_info.h"
#include "moetron/kernels/cpu/norm_kernels_isa.h"
#include "moetron/kernels/cpu/rmsnorm.h"
#include "testing.h"

namespace moetron {
namespace {

using testing::compare;
using testing::expect_close;
using testing::finite_difference_gradient;
using testing::random_floats;
using testing::to_double;

// out = x / sqrt(mean(x^2) + eps) * w, row by row, all in double.
void rmsnorm_reference(std::vector<double>& out, std::vector<double>& rstd,
                       const std::vector<double>& inp, const std::vector<double>& weight,
                       int64_t num_rows, int64_t dim, double eps) {
    out.assign(num_rows * dim, 0.0);
    rstd.assign(num_rows, 0.0);
    for (int64_t r = 0; r < num_rows; ++r) {
        double sum_squares = 0;
        for (int64_t i = 0; i < dim; ++i) sum_squares += inp[r * dim + i] * inp[r * dim + i];
        rstd[r] = 1.0 / std::sqrt(sum_squares / dim + eps);
        for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = inp[r * dim + i] * rstd[r] * weight[i];
    }
}

struct Shape {
    int64_t num_rows, dim;
    std::string name() const {
        return "N=" + std::to_string(num_rows) + " D=" + std::to_string(dim);
    }
};

void PrintTo(const Shape& s, std::ostream* os) {
    *os << s.name();
}

// "dinp N=7 D=13": the figure and the shape it was measured on.
std::string label(const char* what, const Shape& s) {
    return std::string(what) + " " + s.name();
}

class RmsNormShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(RmsNormShapes, ForwardMatchesFloat64Reference) {
    const Shape shape = GetParam();
    const auto [num_rows, dim] = shape;
    const float eps = 1e-6f;
    const auto inp = random_floats(num_rows * dim, 1);
    const auto weight = random_floats(dim, 2);
    std::vector<float> out(num_rows * dim), rstd(num_rows);
    cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), num_rows, dim, eps);

    std::vector<double> out_ref, rstd_ref;
    rmsnorm_reference(out_ref, rstd_ref, to_double(inp), to_double(weight), num_rows, dim, eps);
    expect_close("rmsnorm", label("out", shape).c_str(),
                 compare(out.data(), out_ref.data(), out.size()), 1e-6);
    expect_close("rmsnorm", label("rstd", shape).c_str(),
                 compare(rstd.data(), rstd_ref.data(), rstd.size()), 1e-6);
}

TEST_P(RmsNormShapes, BackwardMatchesFiniteDifferences) {
    const Shape shape = GetParam();
    const auto [num_rows, dim] = shape;
    const float eps = 1e-6f;
    const auto inp = random_floats(num_rows * dim, 3);
    const auto weight = random_floats(dim, 4);
    const auto probe = random_floats(num_rows * dim, 5);  // R in L = sum(out * R)

    std::vector<float> out(num_rows * dim), rstd(num_rows);
    cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), num_rows, dim, eps);
    std::vector<float> dinp(num_rows * dim), dweight(dim, 0.0f);
    cpu::rmsnorm_backward(dinp.data(), dweight.data(), probe.data(), inp.data(), weight.data(),
                          rstd.data(), num_rows, dim);

    const auto inp_d = to_double(inp), weight_d = to_double(weight), probe_d = to_double(probe);
    auto loss = [&](const std::vector<double>& x, const std::vector<double>& w) {
        std::vector<double> y, r;
        rmsnorm_reference(y, r, x, w, num_rows, dim, eps);
        double sum = 0;
        for (size_t i = 0; i < y.size(); ++i) sum += y[i] * probe_d[i];
        return sum;
    };
    const auto dinp_fd =
        finite_difference_gradient([&](const auto& x) { return loss(x, weight_d); }, inp_d);
    const auto dweight_fd =
        finite_difference_gradient([&](const auto& w) { return loss(inp_d, w); }, weight_d);
    expect_close("rmsnorm", label("dinp", shape).c_str(),
                 compare(dinp.data(), dinp_fd.data(), dinp.size()), 1e-4);
    expect_close("rmsnorm", label("dweight", shape).c_str(),
                 compare(dweight.data(), dweight_fd.data(), dim), 1e-4);
}

// 300 columns span two of the backward's dweight column blocks (256 wide).
INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormShapes,
                         ::testing::Values(Shape{7, 13}, Shape{1, 1}, Shape{3, 300}));

TEST(RmsNorm, WeightGradAccumulatesAndInputGradIsOverwritten) {
    const int64_t num_rows = 4, dim = 9;
    const auto inp = random_floats(num_rows * dim, 6);
    const auto weight = random_floats(dim, 7);
    const auto dout_a = random_floats(num_rows * dim, 8);
    const auto dout_b = random_floats(num_rows * dim, 9);
    std::vector<float> out(num_rows * dim), rstd(num_rows);
    cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), num_rows, dim, 1e-6f);

    // Each micro-batch alone, from a zero dweight.
    std::vector<float> dinp_a(num_rows * dim), dinp_b(num_rows * dim);
    std::vector<float> dweight_a(dim, 0.0f), dweight_b(dim, 0.0f);
    cpu::rmsnorm_backward(dinp_a.data(), dweight_a.data(), dout_a.data(), inp.data(), weight.data(),
                          rstd.data(), num_rows, dim);
    cpu::rmsnorm_backward(dinp_b.data(), dweight_b.data(), dout_b.data(), inp.data(), weight.data(),
                          rstd.data(), num_rows, dim);

    // Both into one dweight, and into a dinp that holds garbage from before.
    std::vector<float> dinp(num_rows * dim, 1234.5f), dweight(dim, 0.0f);
    cpu::rmsnorm_backward(dinp.data(), dweight.data(), dout_a.data(), inp.data(), weight.data(),
                          rstd.data(), num_rows, dim);
    cpu::rmsnorm_backward(dinp.data(), dweight.data(), dout_b.data(), inp.data(), weight.data(),
                          rstd.data(), num_rows, dim);

    for (int64_t i = 0; i < dim; ++i)
        EXPECT_NEAR(dweight[i], dweight_a[i] + dweight_b[i], 1e-5f * (1 + std::fabs(dweight[i])));
    for (int64_t i = 0; i < num_rows * dim; ++i) EXPECT_EQ(dinp[i], dinp_b[i]);

    // A null gradient pointer skips that gradient and leaves the other unchanged.
    std::vector<float> dweight_only(dim, 0.0f);
    cpu::rmsnorm_backward(nullptr, dweight_only.data(), dout_a.data(), inp.data(), weight.data(),
                          rstd.data(), num_rows, dim);
    std::vector<float> dinp_only(num_rows * dim);
    cpu::rmsnorm_backward(dinp_only.data(), nullptr, dout_a.data(), inp.data(), weight.data(),
                          rstd.data(), num_rows, dim);
    EXPECT_EQ(dweight_only, dweight_a);
    EXPECT_EQ(dinp_only, dinp_a);
}

std::vector<cpu::NormKernels> runnable_norm_kernels() {
    std::vector<cpu::NormKernels> kernels = {cpu::norm_kernels_avx2()};
    if (cpu::cpu_has_avx512()) kernels.push_back(cpu::norm_kernels_avx512());
    return kernels;
}

// Each instruction-set build of the norm kernels (the process runs one) against float64: the
// forward, the backward from its formulas, and the gradient norm's sum of squares. 200 columns
// leave vector tails of both widths; dweight is the same bit for bit whatever the column block
// width the threads split it by (each column is summed over the rows in order).
TEST(RmsNorm, EveryRunnableBuildMatchesFloat64) {
    const int64_t num_rows = 37, dim = 200;
    const double eps = 1e-6;
    const auto inp = random_floats(num_rows * dim, 11), weight = random_floats(dim, 12),
               dout = random_floats(num_rows * dim, 13), dweight_before = random_floats(dim, 14);
    std::vector<double> out_ref, rstd_ref;
    rmsnorm_reference(out_ref, rstd_ref, to_double(inp), to_double(weight), num_rows, dim, eps);
    std::vector<double> dinp_ref(num_rows * dim),
        dweight_ref(dweight_before.begin(), dweight_before.end());
    double squares_ref = 0;
    for (int64_t r = 0; r < num_rows; ++r) {
        const double rs = rstd_ref[r];
        double g_dot_x = 0;
        for (int64_t i = 0; i < dim; ++i) {
            const double x = inp[r * dim + i], dy = dout[r * dim + i];
            g_dot_x += dy * weight[i] * x;
            dweight_ref[i] += dy * x * rs;
            squares_ref += x * x;
        }
        for (int64_t i = 0; i < dim; ++i) {
            dinp_ref[r * dim + i] = rs * dout[r * dim + i] * weight[i] -
                                    inp[r * dim + i] * rs * rs * rs * g_dot_x / dim;
        }
    }
    for (const cpu::NormKernels& kernels : runnable_norm_kernels()) {
        SCOPED_TRACE(kernels.isa);
        std::vector<float> out(num_rows * dim), rstd(num_rows), dinp(num_rows * dim);
        kernels.rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), num_rows, dim,
                                static_cast<float>(eps));
        expect_close(kernels.isa, "out", compare(out.data(), out_ref.data(), out.size()), 1e-5);
        expect_close(kernels.isa, "rstd", compare(rstd.data(), rstd_ref.data(), rstd.size()), 1e-6);
        std::vector<float> dweight_wide = dweight_before, dweight_narrow = dweight_before;
        kernels.rmsnorm_backward(dinp.data(), dweight_wide.data(), dout.data(), inp.data(),
                                 weight.data(), rstd.data(), num_rows, dim,
                                 cpu::kMaxNormColumnBlock);
        expect_close(kernels.isa, "dinp", compare(dinp.data(), dinp_ref.data(), dinp.size()), 1e-4);
        // The kernel's rstd is the saved float32 one (rel. 6e-8 here); its rounding and the float32
        // sum with dweight_before leave ~2e-5 on this data.
        expect_close(kernels.isa, "dweight",
                     compare(dweight_wide.data(), dweight_ref.data(), dweight_wide.size()), 1e-4);
        kernels.rmsnorm_backward(nullptr, dweight_narrow.data(), dout.data(), inp.data(),
                                 weight.data(), rstd.data(), num_rows, dim, 16);
        EXPECT_EQ(std::memcmp(dweight_wide.data(), dweight_narrow.data(), dim * sizeof(float)), 0)
            << "dweight depends on the column block width";
        EXPECT_NEAR(kernels.sum_squares(inp.data(), num_rows * dim), squares_ref,
                    1e-12 * squares_ref);
    }
}

TEST(RmsNorm, ZeroRowIsFiniteAndBadShapesAreErrors) {
    // An all-zero row normalizes to zeros through eps, not NaN.
    const int64_t dim = 5;
    const std::vector<float> inp(dim, 0.0f), weight(dim, 1.0f);
    std::vector<float> out(dim, -1.0f), rstd(1);
    cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), 1, dim, 1e-6f);
    EXPECT_FLOAT_EQ(rstd[0], 1000.0f);
    for (float y : out) EXPECT_EQ(y, 0.0f);

    EXPECT_THROW(
        cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), 1, 0, 1e-6f),
        Error);
    EXPECT_THROW(
        cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), 1, dim, -1.0f),
        Error);
}

}  // namespace
}  // namespace moetron
