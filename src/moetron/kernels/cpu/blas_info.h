// Which OpenBLAS the CPU GEMMs run on, and whether its kernels fit the CPU.
//
// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernel family once, when the library
// loads, from its own cpuid table or from the OPENBLAS_CORETYPE environment variable. On this
// project's CI machines (AMD, AVX-512) it picks its AVX-512 kernels by itself ("Cooperlake"), but
// the machines' environment sets OPENBLAS_CORETYPE=Haswell, which halves every GEMM
// (bench/blas_choice/README.md: 4096x2816x1024 on two cores, 247 GFLOP/s with Haswell's kernels,
// 482 with SkylakeX's). moetron does not override a setting someone made on purpose; it says what
// runs and warns when the kernels leave the CPU's vector width unused.
#pragma once

#include <string>
#include <string_view>

namespace moetron::cpu {

struct BlasInfo {
    std::string config;     // openblas_get_config(): version and build options
    std::string core_name;  // openblas_get_corename(): the kernel family in use
};
BlasInfo blas_info();

// True when the CPU has AVX-512 F, BW, DQ and VL (what OpenBLAS's AVX-512 kernels use).
bool cpu_has_avx512();

// A warning for the run's header when kernels without AVX-512 run on a CPU that has it, naming
// the cause when OPENBLAS_CORETYPE (env_coretype, may be null) forced them; "" when all is well.
std::string blas_kernel_warning(bool cpu_avx512, std::string_view core_name,
                                const char* env_coretype);

// "OpenBLAS 0.3.21 ... kernels Haswell" plus the warning, if any, for the run's header.
std::string describe_blas();

}  // namespace moetron::cpu
