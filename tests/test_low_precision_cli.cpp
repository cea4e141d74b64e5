// moetron train --precision end to end: each low-precision recipe trains tiny (a short run on the
// built-in synthetic data) to a validation loss within 2% of float32's from the same seed, and
// says in its log what it runs. The long comparison (Tiny Shakespeare, 1,500 steps) is
// tools/low_precision_convergence.py's, in the README.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cli_run.h"
#include "expect_contains.h"

namespace moetron {
namespace {

using moetron::testing::run_cli;

// The run's final validation loss, from its "done" line ("val 5.60 -> 2.73"). (A string search,
// not <regex>: GCC 12's <regex> trips -Wmaybe-uninitialized in the sanitizer build.)
double final_val_loss(const std::string& log) {
    for (size_t at = log.find("val "); at != std::string::npos; at = log.find("val ", at + 1)) {
        const char* first = log.c_str() + at + 4;
        char* end = nullptr;
        std::strtod(first, &end);
        if (end == first || std::string_view(end).substr(0, 4) != " -> ") continue;
        const char* second = end + 4;
        const double loss = std::strtod(second, &end);
        if (end != second) return loss;
    }
    return NAN;
}

std::string train_command(const std::string& precision) {
    return "train --config " + std::string(MOETRON_SOURCE_DIR) +
           "/configs/models/tiny.toml --steps 60 --batch-size 4 --seq-len 32 --eval-every 60 "
           "--threads 1 --precision " +
           precision;
}

class LowPrecisionCli : public ::testing::TestWithParam<std::string> {};

TEST_P(LowPrecisionCli, TrainsWithinTwoPercentOfFloat32) {
    const auto fp32 = run_cli(train_command("fp32"));
    ASSERT_EQ(fp32.exit_code, 0) << fp32.text;
    const auto low = run_cli(train_command(GetParam()));
    ASSERT_EQ(low.exit_code, 0) << low.text;
    EXPECT_CONTAINS(low.text, "precision " + GetParam() + ":");
    const double want = final_val_loss(fp32.text), got = final_val_loss(low.text);
    ASSERT_FALSE(std::isnan(want) || std::isnan(got)) << low.text;
    EXPECT_LT(want, 4.0) << "float32 did not learn:\n" << fp32.text;
    EXPECT_NEAR(got, want, 0.02 * want) << low.text;
    EXPECT_NE(got, want) << "the recipe changed nothing";
}

INSTANTIATE_TEST_SUITE_P(Recipes, LowPrecisionCli,
                         ::testing::Values("bf16", "mxfp8", "fp8-blockwise"), [](const auto& info) {
                             return info.param == "fp8-blockwise" ? std::string("fp8_blockwise")
                                                                  : info.param;
                         });

// An AVX2-only CPU has no vdpbf16ps: MOETRON_CPU_ISA=avx2, which makes an AVX-512 machine stand
// for one, turns the native bf16 GEMM off too.
TEST(LowPrecisionCli, Bf16IsEmulatedUnderForcedAvx2) {
    const auto avx2 = run_cli(train_command("bf16"), "MOETRON_CPU_ISA=avx2 MOETRON_BF16_GEMM=");
    ASSERT_EQ(avx2.exit_code, 0) << avx2.text;
    EXPECT_CONTAINS(avx2.text, "bf16: emulated");
    EXPECT_EQ(avx2.text.find("native AVX512_BF16"), std::string::npos) << avx2.text;
}

TEST(LowPrecisionCliErrors, UnknownPrecisionIsRejected) {
    const auto bad = run_cli(train_command("fp16"));
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_CONTAINS(bad.text, "--precision");
}

}  // namespace
}  // namespace moetron
