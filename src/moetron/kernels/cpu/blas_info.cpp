#include "moetron/kernels/cpu/blas_info.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>

extern "C" {
// OpenBLAS extensions; not declared by every cblas.h variant.
char* openblas_get_config(void);
char* openblas_get_corename(void);
}

namespace moetron::cpu {

BlasInfo blas_info() {
    return {openblas_get_config(), openblas_get_corename()};
}

bool cpu_has_avx512() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

std::string blas_kernel_warning(bool cpu_avx512, std::string_view core_name,
                                const char* env_coretype) {
    if (!cpu_avx512) return "";
    // OpenBLAS's x86 kernel families that use AVX-512 (its names, compared case-insensitively).
    constexpr std::array<std::string_view, 3> kAvx512Cores = {"skylakex", "cooperlake",
                                                              "sapphirerapids"};
    std::string lower(core_name);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (std::find(kAvx512Cores.begin(), kAvx512Cores.end(), lower) != kAvx512Cores.end()) return "";
    const std::string cause =
        env_coretype != nullptr
            ? fmt::format(
                  "OPENBLAS_CORETYPE={} in the environment forces them; unset it to let "
                  "OpenBLAS choose",
                  env_coretype)
            : std::string(
                  "this OpenBLAS does not know the CPU; OPENBLAS_CORETYPE=SkylakeX "
                  "selects its AVX-512 kernels");
    return fmt::format(
        "warning: OpenBLAS runs its {} kernels (no AVX-512) on a CPU with AVX-512, about half "
        "the GEMM speed: {}",
        core_name, cause);
}

std::string describe_blas() {
    const BlasInfo info = blas_info();
    std::string text = fmt::format("{} (kernels {})", info.config, info.core_name);
    const std::string warning =
        blas_kernel_warning(cpu_has_avx512(), info.core_name, std::getenv("OPENBLAS_CORETYPE"));
    if (!warning.empty()) text += "\n" + warning;
    return text;
}

}  // namespace moetron::cpu
