// The CPU reference backend (cpu_backend.h): made from the op list, each op calling cpu::<op>;
// the GEMMs by hand, float32 on matmul.h and the low-precision formats on RecipeGemms.
#include "moetron/kernels/cpu/cpu_backend.h"

#include <string>

#include "moetron/core/arena.h"
#include "moetron/kernels/cpu/adamw.h"
#include "moetron/kernels/cpu/attention.h"
#include "moetron/kernels/cpu/balance_loss.h"
#include "moetron/kernels/cpu/blas_info.h"
#include "moetron/kernels/cpu/cross_entropy.h"
#include "moetron/kernels/cpu/cross_entropy_combine.h"
#include "moetron/kernels/cpu/dispatch_layout.h"
#include "moetron/kernels/cpu/dispatch_rows.h"
#include "moetron/kernels/cpu/elementwise.h"
#include "moetron/kernels/cpu/embedding.h"
#include "moetron/kernels/cpu/expert_load.h"
#include "moetron/kernels/cpu/machine_probes.h"
#include "moetron/kernels/cpu/matmul.h"
#include "moetron/kernels/cpu/mla_kv.h"
#include "moetron/kernels/cpu/param_init.h"
#include "moetron/kernels/cpu/permute.h"
#include "moetron/kernels/cpu/quantize.h"
#include "moetron/kernels/cpu/rmsnorm.h"
#include "moetron/kernels/cpu/rope.h"
#include "moetron/kernels/cpu/router.h"
#include "moetron/kernels/cpu/row_copy.h"
#include "moetron/kernels/cpu/swiglu.h"
#include "moetron/kernels/cpu/vector_isa.h"

namespace moetron {

namespace {

class CpuBackend final : public Backend {
  public:
    explicit CpuBackend(CpuBackendOptions options) : recipe_gemms_(options.bf16_gemm) {}

    std::string_view name() const override { return "cpu"; }
    Device device() const override { return Device::cpu; }
    std::string describe() const override {
        return std::string("cpu: vector kernels ") + cpu::describe_vector_isa() + ", " +
               cpu::describe_blas();
    }
    std::string describe_gemms(Precision format) const override {
        return recipe_gemms_.describe(format);
    }
    MemoryResource& memory() override { return host_memory(); }
    Stream stream() const override { return kHostStream; }

    // Every op but the GEMMs: the cpu:: kernel of its name.
#define MOETRON_OP(ret, op, category, params, args) \
    ret op params override {                        \
        return cpu::op args;                        \
    }
#define MOETRON_GEMM_OP(ret, op, category, params, args) ret op params override;
#include "moetron/kernels/backend_ops.inc"

  private:
    cpu::RecipeGemms recipe_gemms_;
};

void CpuBackend::matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                        bool trans_a, bool trans_b, float beta, GemmPrecision precision) {
    if (precision.format == Precision::fp32)
        return cpu::matmul(c, a, b, m, n, k, trans_a, trans_b, beta);
    recipe_gemms_.matmul(c, a, b, m, n, k, trans_a, trans_b, beta, precision);
}

void CpuBackend::linear_forward(float* out, const float* inp, const float* weight, int64_t num_rows,
                                int64_t in_dim, int64_t out_dim, GemmPrecision precision) {
    if (precision.format == Precision::fp32)
        return cpu::linear_forward(out, inp, weight, num_rows, in_dim, out_dim);
    recipe_gemms_.linear_forward(out, inp, weight, num_rows, in_dim, out_dim, precision);
}

void CpuBackend::linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, int64_t num_rows, int64_t in_dim,
                                 int64_t out_dim, GemmPrecision precision) {
    if (precision.format == Precision::fp32)
        return cpu::linear_backward(dinp, dweight, dout, inp, weight, num_rows, in_dim, out_dim);
    recipe_gemms_.linear_backward(dinp, dweight, dout, inp, weight, num_rows, in_dim, out_dim,
                                  precision);
}

void CpuBackend::grouped_linear_forward(float* out, const float* inp, const float* weight,
                                        const int64_t* offsets, int64_t num_experts, int64_t in_dim,
                                        int64_t out_dim, GemmPrecision precision) {
    if (precision.format == Precision::fp32)
        return cpu::grouped_linear_forward(out, inp, weight, offsets, num_experts, in_dim, out_dim);
    recipe_gemms_.grouped_linear_forward(out, inp, weight, offsets, num_experts, in_dim, out_dim,
                                         precision);
}

void CpuBackend::grouped_linear_backward(float* dinp, float* dweight, const float* dout,
                                         const float* inp, const float* weight,
                                         const int64_t* offsets, int64_t num_experts,
                                         int64_t in_dim, int64_t out_dim, GemmPrecision precision) {
    if (precision.format == Precision::fp32)
        return cpu::grouped_linear_backward(dinp, dweight, dout, inp, weight, offsets, num_experts,
                                            in_dim, out_dim);
    recipe_gemms_.grouped_linear_backward(dinp, dweight, dout, inp, weight, offsets, num_experts,
                                          in_dim, out_dim, precision);
}

// Chosen here, so that a bad MOETRON_CPU_ISA is reported before a kernel first asks for it inside
// an OpenMP region, where an exception cannot leave.
void choose_vector_isa() {
    cpu::vector_isa();
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(CpuBackendOptions options) {
    choose_vector_isa();
    return std::make_unique<CpuBackend>(options);
}

Backend& cpu_backend() {
    choose_vector_isa();
    // The GEMM scratch of its low-precision formats is its only state: tools and tests share it,
    // one call at a time; a run makes its own backend (make_cpu_backend).
    static CpuBackend backend{CpuBackendOptions{}};
    return backend;
}

}  // namespace moetron
