#include "moetron/kernels/cpu/vector_isa.h"

#include <cstdlib>
#include <string_view>

#include "moetron/core/user_error.h"
#include "moetron/kernels/cpu/blas_info.h"

namespace moetron::cpu {

namespace {

constexpr const char* kIsaVariable = "MOETRON_CPU_ISA";

}  // namespace

VectorIsa choose_vector_isa(bool cpu_avx512, const char* requested) {
    const std::string_view value = requested != nullptr ? requested : "";
    if (value.empty()) return cpu_avx512 ? VectorIsa::kAvx512 : VectorIsa::kAvx2;
    if (value == "avx2") return VectorIsa::kAvx2;
    if (value == "avx512") {
        MT_USER_CHECK(cpu_avx512,
                      "{}=avx512, but this CPU lacks AVX-512 (F, BW, DQ and VL are needed); "
                      "unset it or set avx2",
                      kIsaVariable);
        return VectorIsa::kAvx512;
    }
    MT_USER_THROW(
        "{}={} is not a vector instruction set moetron knows; use avx2 or avx512, or "
        "unset it to let the CPU decide",
        kIsaVariable, value);
}

VectorIsa vector_isa() {
    static const VectorIsa chosen = choose_vector_isa(cpu_has_avx512(), std::getenv(kIsaVariable));
    return chosen;
}

const char* vector_isa_name(VectorIsa isa) {
    return isa == VectorIsa::kAvx512 ? "avx512" : "avx2";
}

const char* describe_vector_isa() {
    if (vector_isa() == VectorIsa::kAvx2 && cpu_has_avx512()) {
        return "avx2 (forced by MOETRON_CPU_ISA)";
    }
    return vector_isa_name(vector_isa());
}

}  // namespace moetron::cpu
