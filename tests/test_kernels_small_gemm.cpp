// kernels/cpu/small_gemm: each instruction-set build of the small-GEMM kernels the CPU can run
// (AVX2 always, AVX-512 where present) against float64 triple loops, on shapes that reach every
// register-tile remainder (tokens, outputs, vector tails along the inner and column dimensions).
// The grouped linear that uses them: test_kernels_matmul (GroupedLinearTwoThreads).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "moetron/kernels/cpu/blas_info.h"
#include "moetron/kernels/cpu/small_gemm.h"
#include "moetron/kernels/cpu/small_gemm_isa.h"
#include "moetron/kernels/cpu/vector_isa.h"
#include "testing.h"

namespace moetron {
namespace {

using testing::compare;
using testing::expect_close;
using testing::random_floats;

std::vector<cpu::SmallGemmKernels> runnable_kernels() {
    std::vector<cpu::SmallGemmKernels> kernels = {cpu::small_gemm_kernels_avx2()};
    if (cpu::cpu_has_avx512()) kernels.push_back(cpu::small_gemm_kernels_avx512());
    return kernels;
}

// Sums of up to 128 products of numbers in [-1, 1]: float32 rounding leaves ~1e-5 absolute
// error, so errors are taken relative to at least 1 (a wrong element is off by ~1).
constexpr double kFloor = 1.0;

struct Shape {
    int64_t rows, in_dim, out_dim;
};

// Tokens 1..7 and 67 cover every tile height of both builds; inner and column dimensions of 1,
// 21 and 70 leave vector tails of 8- and 16-lane vectors; 40 x 64 is all whole vectors.
const Shape kShapes[] = {{1, 1, 1},  {2, 21, 7},  {3, 70, 13},  {4, 40, 64},  {5, 17, 9},
                         {6, 64, 6}, {7, 33, 25}, {67, 70, 21}, {64, 128, 70}};

TEST(SmallGemm, EveryRunnableBuildMatchesFloat64TripleLoops) {
    for (const cpu::SmallGemmKernels& kernels : runnable_kernels()) {
        for (const Shape& s : kShapes) {
            SCOPED_TRACE(std::string(kernels.isa) + " M=" + std::to_string(s.rows) +
                         " I=" + std::to_string(s.in_dim) + " O=" + std::to_string(s.out_dim));
            const int64_t m = s.rows, in = s.in_dim, out = s.out_dim;
            const auto inp = random_floats(m * in, 1), weight = random_floats(out * in, 2),
                       dout = random_floats(m * out, 3),
                       dweight_before = random_floats(out * in, 4);
            std::vector<double> out_ref(m * out, 0.0), dinp_ref(m * in, 0.0),
                dweight_ref(dweight_before.begin(), dweight_before.end());
            for (int64_t r = 0; r < m; ++r) {
                for (int64_t o = 0; o < out; ++o) {
                    for (int64_t i = 0; i < in; ++i) {
                        out_ref[r * out + o] += double(inp[r * in + i]) * weight[o * in + i];
                        dinp_ref[r * in + i] += double(dout[r * out + o]) * weight[o * in + i];
                        dweight_ref[o * in + i] += double(dout[r * out + o]) * inp[r * in + i];
                    }
                }
            }
            std::vector<float> out_got(m * out, -1.0f), dinp_got(m * in, -1.0f),
                dweight_got = dweight_before;
            kernels.forward(out_got.data(), inp.data(), weight.data(), m, in, out);
            kernels.backward_input(dinp_got.data(), dout.data(), weight.data(), m, in, out);
            kernels.backward_weight(dweight_got.data(), dout.data(), inp.data(), m, in, out);
            expect_close(kernels.isa, "forward",
                         compare(out_got.data(), out_ref.data(), out_got.size(), kFloor), 1e-4);
            expect_close(kernels.isa, "backward input",
                         compare(dinp_got.data(), dinp_ref.data(), dinp_got.size(), kFloor), 1e-4);
            expect_close(
                kernels.isa, "backward weight (accumulated)",
                compare(dweight_got.data(), dweight_ref.data(), dweight_got.size(), kFloor), 1e-4);
        }
    }
}

// The strided form attention uses: op(A) a transposed view (a_row_stride 1), rows of B and C
// longer than the product (ldb, ldc > n), C accumulated.
TEST(SmallGemm, StridedTransposedViewAccumulatesIntoCBlock) {
    const int64_t m = 13, n = 37, k = 11, ldb = 50, ldc = 45;
    const auto a_t = random_floats(k * m, 8);  // op(A)[r][kk] = a_t[kk * m + r]
    const auto b = random_floats(k * ldb, 9), c_before = random_floats(m * ldc, 10);
    std::vector<double> expected(c_before.begin(), c_before.end());
    for (int64_t r = 0; r < m; ++r) {
        for (int64_t j = 0; j < n; ++j) {
            for (int64_t kk = 0; kk < k; ++kk) {
                expected[r * ldc + j] += double(a_t[kk * m + r]) * b[kk * ldb + j];
            }
        }
    }
    for (const cpu::SmallGemmKernels& kernels : runnable_kernels()) {
        std::vector<float> c = c_before;
        kernels.gemm({c.data(), ldc, true, a_t.data(), 1, m, b.data(), ldb, m, n, k});
        // Columns n..ldc of each row are outside the block and must be untouched.
        expect_close(kernels.isa, "strided gemm",
                     compare(c.data(), expected.data(), c.size(), kFloor), 1e-5);
    }
}

// AVX-512 exactly when the CPU has it, unless MOETRON_CPU_ISA forces AVX2 (vector_isa.h).
TEST(SmallGemm, UsesTheProcesssVectorIsa) {
    EXPECT_EQ(std::string(cpu::small_gemm_isa()), cpu::vector_isa_name(cpu::vector_isa()));
    if (std::getenv("MOETRON_CPU_ISA") == nullptr) {
        EXPECT_EQ(std::string(cpu::small_gemm_isa()), cpu::cpu_has_avx512() ? "avx512" : "avx2");
    }
}

}  // namespace
}  // namespace moetron
