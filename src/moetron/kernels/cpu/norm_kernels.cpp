// Picks the norm kernels for the CPU the binary runs on, once (norm_kernels_isa.h).
#include "moetron/kernels/cpu/norm_kernels_isa.h"

#include "moetron/kernels/cpu/vector_isa.h"

namespace moetron::cpu {

const NormKernels& norm_kernels() {
    static const NormKernels chosen =
        vector_isa() == VectorIsa::kAvx512 ? norm_kernels_avx512() : norm_kernels_avx2();
    return chosen;
}

}  // namespace moetron::cpu
