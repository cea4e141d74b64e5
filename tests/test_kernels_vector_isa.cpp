// kernels/cpu/vector_isa: which vector kernels run (the CPU's widest unless MOETRON_CPU_ISA=avx2
// forces AVX2), what a bad value says, and that the switch reaches the kernels and the run header
// of `moetron train`.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli_run.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/cpu/blas_info.h"
#include "moetron/kernels/cpu/vector_isa.h"
#include "temp_dir.h"

namespace moetron {
namespace {

using cpu::choose_vector_isa;
using cpu::VectorIsa;

TEST(VectorIsa, UnsetOrEmptyLetsTheCpuDecide) {
    EXPECT_EQ(choose_vector_isa(true, nullptr), VectorIsa::kAvx512);
    EXPECT_EQ(choose_vector_isa(false, nullptr), VectorIsa::kAvx2);
    EXPECT_EQ(choose_vector_isa(true, ""), VectorIsa::kAvx512);
}

TEST(VectorIsa, Avx2CanBeForcedOnAnAvx512Cpu) {
    EXPECT_EQ(choose_vector_isa(true, "avx2"), VectorIsa::kAvx2);
    EXPECT_EQ(choose_vector_isa(false, "avx2"), VectorIsa::kAvx2);
    EXPECT_EQ(choose_vector_isa(true, "avx512"), VectorIsa::kAvx512);
}

TEST(VectorIsa, Avx512WithoutTheCpuOrAnUnknownNameIsAnError) {
    try {
        choose_vector_isa(false, "avx512");
        FAIL() << "avx512 on a CPU without it was accepted";
    } catch (const UserError& e) {
        EXPECT_CONTAINS(std::string(e.what()),
                        "MOETRON_CPU_ISA=avx512, but this CPU lacks AVX-512");
    }
    try {
        choose_vector_isa(true, "AVX2 ");
        FAIL() << "an unknown name was accepted";
    } catch (const UserError& e) {
        EXPECT_CONTAINS(std::string(e.what()), "MOETRON_CPU_ISA=AVX2  is not a vector instruction");
        EXPECT_CONTAINS(std::string(e.what()), "use avx2 or avx512");
    }
}

// The process-wide choice, as this test binary runs (ctest sets no MOETRON_CPU_ISA).
TEST(VectorIsa, ThisProcessRunsTheCpusWidest) {
    if (std::getenv("MOETRON_CPU_ISA") != nullptr) GTEST_SKIP() << "MOETRON_CPU_ISA is set";
    EXPECT_EQ(cpu::vector_isa(), cpu::cpu_has_avx512() ? VectorIsa::kAvx512 : VectorIsa::kAvx2);
}

// One training step of tiny with the switch set: the run header names the vector kernels, and
// a bad value stops the run with the message, before any step.
TEST(VectorIsaCli, TheRunHeaderSaysWhichKernelsRun) {
    ASSERT_TRUE(std::filesystem::exists(MOETRON_BINARY)) << MOETRON_BINARY << " is not built";
    const testing::TempDir dir;
    const std::string train = "train --config " MOETRON_SOURCE_DIR
                              "/configs/models/tiny.toml --steps 1 --batch-size 2 --seq-len 16 "
                              "--threads 1";
    const std::string in_dir = "cd '" + dir.path().string() + "' &&";

    const testing::CliOutput forced = testing::run_cli(train, in_dir + " MOETRON_CPU_ISA=avx2");
    ASSERT_EQ(forced.exit_code, 0) << forced.text;
    EXPECT_CONTAINS(forced.text,
                    cpu::cpu_has_avx512()
                        ? "backend cpu: vector kernels avx2 (forced by MOETRON_CPU_ISA)"
                        : "backend cpu: vector kernels avx2,");

    const testing::CliOutput bad = testing::run_cli(train, in_dir + " MOETRON_CPU_ISA=neon");
    EXPECT_EQ(bad.exit_code, 1) << bad.text;
    EXPECT_CONTAINS(bad.text, "MOETRON_CPU_ISA=neon is not a vector instruction set");
    EXPECT_EQ(bad.text.find("step 1/1"), std::string::npos) << bad.text;
}

}  // namespace
}  // namespace moetron
