// The norm kernels (norm_kernels.inc) on 256-bit vectors: AVX2 and FMA, which the whole build
// assumes (-march=x86-64-v3), so they run on every CPU the binary runs on.
#include <cstdint>

#include "moetron/kernels/cpu/norm_kernels_isa.h"

namespace moetron::cpu {

#include "moetron/kernels/cpu/norm_kernels.inc"

NormKernels norm_kernels_avx2() {
    return {&rmsnorm_forward, &rmsnorm_backward, &sum_squares, "avx2"};
}

}  // namespace moetron::cpu
