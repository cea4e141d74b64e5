// The norm kernels (norm_kernels.inc) on 512-bit vectors. This file alone is compiled with
// -mavx512f (CMakeLists.txt); norm_kernels() calls it only on CPUs that have AVX-512.
#include <cstdint>

#include "moetron/kernels/cpu/norm_kernels_isa.h"

namespace moetron::cpu {

#include "moetron/kernels/cpu/norm_kernels.inc"

NormKernels norm_kernels_avx512() {
    return {&rmsnorm_forward, &rmsnorm_backward, &sum_squares, "avx512"};
}

}  // namespace moetron::cpu
