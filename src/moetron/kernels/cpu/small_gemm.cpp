// Picks the small-GEMM kernels for the CPU the binary runs on, once (small_gemm.h).
#include "moetron/kernels/cpu/small_gemm.h"

#include "moetron/kernels/cpu/small_gemm_isa.h"
#include "moetron/kernels/cpu/vector_isa.h"

namespace moetron::cpu {

namespace {

const SmallGemmKernels& kernels() {
    static const SmallGemmKernels chosen = vector_isa() == VectorIsa::kAvx512
                                               ? small_gemm_kernels_avx512()
                                               : small_gemm_kernels_avx2();
    return chosen;
}

}  // namespace

void small_linear_forward(float* out, const float* inp, const float* weight, int64_t num_rows,
                          int64_t in_dim, int64_t out_dim) {
    kernels().forward(out, inp, weight, num_rows, in_dim, out_dim);
}

void small_linear_backward_input(float* dinp, const float* dout, const float* weight,
                                 int64_t num_rows, int64_t in_dim, int64_t out_dim) {
    kernels().backward_input(dinp, dout, weight, num_rows, in_dim, out_dim);
}

void small_linear_backward_weight(float* dweight, const float* dout, const float* inp,
                                  int64_t num_rows, int64_t in_dim, int64_t out_dim) {
    kernels().backward_weight(dweight, dout, inp, num_rows, in_dim, out_dim);
}

void small_gemm(const StridedGemm& g) {
    kernels().gemm(g);
}

const char* small_gemm_isa() {
    return kernels().isa;
}

}  // namespace moetron::cpu
