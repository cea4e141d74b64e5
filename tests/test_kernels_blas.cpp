// What moetron reports about the CPU GEMMs' OpenBLAS (kernels/cpu/blas_info.h).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "moetron/kernels/cpu/blas_info.h"

namespace moetron::cpu {
namespace {

TEST(BlasInfo, ReportsTheLoadedLibrary) {
    const BlasInfo info = blas_info();
    EXPECT_NE(info.config.find("OpenBLAS"), std::string::npos) << info.config;
    EXPECT_FALSE(info.core_name.empty());
    std::printf("[blas] %s\n", describe_blas().c_str());
}

TEST(BlasKernelWarning, SilentWhenTheKernelsFitTheCpu) {
    EXPECT_EQ(blas_kernel_warning(true, "SkylakeX", nullptr), "");
    EXPECT_EQ(blas_kernel_warning(true, "Cooperlake", "Cooperlake"), "");
    EXPECT_EQ(blas_kernel_warning(true, "SAPPHIRERAPIDS", nullptr), "");
    // Without AVX-512 the AVX2 kernels are the best there is.
    EXPECT_EQ(blas_kernel_warning(false, "Haswell", "Haswell"), "");
}

TEST(BlasKernelWarning, NamesTheEnvironmentVariableThatForcedSlowKernels) {
    const std::string warning = blas_kernel_warning(true, "Haswell", "Haswell");
    EXPECT_NE(warning.find("Haswell kernels"), std::string::npos) << warning;
    EXPECT_NE(warning.find("OPENBLAS_CORETYPE=Haswell in the environment"), std::string::npos)
        << warning;
}

TEST(BlasKernelWarning, SuggestsTheAvx512KernelsWhenOpenBlasMisdetects) {
    const std::string warning = blas_kernel_warning(true, "Zen", nullptr);
    EXPECT_NE(warning.find("Zen kernels"), std::string::npos) << warning;
    EXPECT_NE(warning.find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos) << warning;
}

}  // namespace
}  // namespace moetron::cpu
