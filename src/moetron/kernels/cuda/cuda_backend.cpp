// The CUDA backend: the ops there are CUDA kernels for (kernels/cuda/ops.h) and the float32 GEMMs
// through cuBLAS, all issued on one stream the backend owns; every other op keeps Backend's
// OpNotImplemented.
// Plain C++ against the CUDA runtime and cuBLAS; the kernels live in the .cu files.
//
// Ordering: every op is asynchronous on stream_, except those that hand the host a value or
// read one, which wait for the stream: copy_to_host, copy_from_host, sum_squares, and
// grouped_linear_* (its segment offsets decide the GEMM shapes).
#include "moetron/kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <fmt/format.h>

#include <climits>
#include <utility>

#include "moetron/core/arena.h"
#include "moetron/core/error.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/cuda/cuda_check.h"
#include "moetron/kernels/cuda/device.h"
#include "moetron/kernels/cuda/ops.h"

namespace moetron {

namespace {

// cuBLAS workspace, given once so that no GEMM allocates (NVIDIA recommends 32 MiB on Hopper).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
// The most segments grouped_linear takes: its offsets are staged in pinned host memory of this
// many entries, allocated once (the router allows at most 1024 experts).
constexpr int64_t kMaxGroupedSegments = 4096;

// cuBLAS takes 32-bit dimensions.
void check_gemm_dims(int64_t m, int64_t n, int64_t k, const char* op) {
    for (const auto& [value, what] : {std::pair{m, "rows M"}, {n, "columns N"}, {k, "inner K"}}) {
        MT_CHECK(value >= 0 && value <= INT_MAX, "[{}] {} = {} must be in [0, {}] for cuBLAS", op,
                 what, value, INT_MAX);
    }
}

void check_count(int64_t n, const char* op) {
    MT_CHECK(n >= 0, "[{}] element count {} must not be negative", op, n);
}

class CudaBackend final : public Backend {
  public:
    explicit CudaBackend(int device) {
        try {
            acquire(device);
        } catch (...) {
            release();  // the destructor does not run for a constructor that throws
            throw;
        }
    }
    ~CudaBackend() override { release(); }

    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    // ---- identity, memory, ordering ----
    std::string_view name() const override { return "cuda"; }
    Device device() const override { return Device::cuda; }
    std::string describe() const override {
        cudaDeviceProp prop{};
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
        return fmt::format("cuda: {} (device {}, {:.1f} GiB)", prop.name, device_,
                           static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024 * 1024));
    }
    MemoryResource& memory() override { return cuda::device_memory(); }
    Stream stream() const override { return Stream{Device::cuda, stream_}; }
    void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
    void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
        if (bytes == 0) return;
        CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
        synchronize();
    }
    void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
        if (bytes == 0) return;
        CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
        synchronize();  // the caller may free or reuse host_src as soon as this returns
    }

    // ---- data movement ----
    void copy(void* dst, const void* src, size_t bytes) override {
        if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    }
    void zero(void* dst, size_t bytes) override {
        if (bytes) CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
    }

    // ---- elementwise ----
    void add_inplace(float* y, const float* x, int64_t n) override {
        check_count(n, "add_inplace");
        cuda::add_inplace(y, x, n, stream_);
    }
    void axpy(float* y, float alpha, const float* x, int64_t n) override {
        check_count(n, "axpy");
        cuda::axpy(y, alpha, x, n, stream_);
    }
    void add(float* out, const float* a, const float* b, int64_t n) override {
        check_count(n, "add");
        cuda::add(out, a, b, n, stream_);
    }

    // ---- GEMMs ----
    void matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                bool trans_a, bool trans_b, float beta, GemmPrecision precision) override {
        check_float32(precision, "matmul");
        check_gemm_dims(m, n, k, "matmul");
        gemm(c, a, b, m, n, k, trans_a, trans_b, beta);
    }
    void linear_forward(float* out, const float* inp, const float* weight, int64_t num_rows,
                        int64_t in_dim, int64_t out_dim, GemmPrecision precision) override {
        check_float32(precision, "linear_forward");
        check_gemm_dims(num_rows, out_dim, in_dim, "linear_forward");
        gemm(out, inp, weight, num_rows, out_dim, in_dim, false, true, 0.0f);
    }
    void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                         const float* weight, int64_t num_rows, int64_t in_dim, int64_t out_dim,
                         GemmPrecision precision) override {
        check_float32(precision, "linear_backward");
        check_gemm_dims(num_rows, out_dim, in_dim, "linear_backward");
        linear_backward_gemms(dinp, dweight, dout, inp, weight, num_rows, in_dim, out_dim);
    }
    void grouped_linear_forward(float* out, const float* inp, const float* weight,
                                const int64_t* offsets, int64_t num_experts, int64_t in_dim,
                                int64_t out_dim, GemmPrecision precision) override {
        check_float32(precision, "grouped_linear_forward");
        const int64_t* rows = segment_offsets_on_host(offsets, num_experts, in_dim, out_dim,
                                                      "grouped_linear_forward");
        for (int64_t e = 0; e < num_experts; ++e) {
            const int64_t row0 = rows[e], num_rows = rows[e + 1] - rows[e];
            if (num_rows == 0) continue;
            gemm(out + row0 * out_dim, inp + row0 * in_dim, weight + e * out_dim * in_dim, num_rows,
                 out_dim, in_dim, false, true, 0.0f);
        }
    }
    void grouped_linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, const int64_t* offsets, int64_t num_experts,
                                 int64_t in_dim, int64_t out_dim,
                                 GemmPrecision precision) override {
        check_float32(precision, "grouped_linear_backward");
        const int64_t* rows = segment_offsets_on_host(offsets, num_experts, in_dim, out_dim,
                                                      "grouped_linear_backward");
        for (int64_t e = 0; e < num_experts; ++e) {
            const int64_t row0 = rows[e], num_rows = rows[e + 1] - rows[e];
            if (num_rows == 0) continue;  // dweight[e] += 0: left alone, as on the CPU
            linear_backward_gemms(dinp ? dinp + row0 * in_dim : nullptr,
                                  dweight ? dweight + e * out_dim * in_dim : nullptr,
                                  dout + row0 * out_dim, inp + row0 * in_dim,
                                  weight + e * out_dim * in_dim, num_rows, in_dim, out_dim);
        }
    }

    // ---- norms, activations, positions ----
    void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                         int64_t num_rows, int64_t dim, float eps) override {
        check_rows("rmsnorm_forward", num_rows, dim);
        MT_CHECK(eps >= 0.0f, "[rmsnorm_forward] eps must be >= 0, got {}", eps);
        cuda::rmsnorm_forward(out, rstd, inp, weight, num_rows, dim, eps, stream_);
    }
    void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                          const float* weight, const float* rstd, int64_t num_rows,
                          int64_t dim) override {
        check_rows("rmsnorm_backward", num_rows, dim);
        cuda::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, num_rows, dim, stream_);
    }
    void swiglu_forward(float* out, const float* inp, int64_t num_rows, int64_t ffn_dim) override {
        check_rows("swiglu_forward", num_rows, ffn_dim);
        cuda::swiglu_forward(out, inp, num_rows, ffn_dim, stream_);
    }
    void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t num_rows,
                         int64_t ffn_dim) override {
        check_rows("swiglu_backward", num_rows, ffn_dim);
        cuda::swiglu_backward(dinp, dout, inp, num_rows, ffn_dim, stream_);
    }

    // ---- optimizer ----
    void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                      const AdamWParams& hp) override {
        check_count(n, "adamw");
        MT_CHECK(hp.step >= 1, "[adamw] step must be >= 1 (bias correction is 1-based), got {}",
                 hp.step);
        MT_CHECK(hp.beta1 >= 0.0f && hp.beta1 < 1.0f && hp.beta2 >= 0.0f && hp.beta2 < 1.0f,
                 "[adamw] betas must be in [0, 1), got ({}, {})", hp.beta1, hp.beta2);
        MT_CHECK(hp.eps >= 0.0f, "[adamw] eps must be >= 0, got {}", hp.eps);
        cuda::adamw_update(params, nullptr, m, v, grads, n, hp.lr, hp.beta1, hp.beta2, hp.eps,
                           hp.weight_decay, hp.step, stream_);
    }
    double sum_squares(const float* x, int64_t n) override {
        check_count(n, "sum_squares");
        double* partials = sum_squares_scratch_;
        double* result = sum_squares_scratch_ + cuda::kSumSquaresPartials;
        cuda::sum_squares(result, partials, x, n, stream_);
        CUDA_CHECK(cudaMemcpyAsync(host_sum_squares_, result, sizeof(double),
                                   cudaMemcpyDeviceToHost, stream_));
        synchronize();
        return *host_sum_squares_;
    }
    void scale_inplace(float* x, int64_t n, float factor) override {
        check_count(n, "scale_inplace");
        cuda::scale_inplace(x, n, factor, stream_);
    }

  private:
    void acquire(int device) {
        device_ = device;
        CUDA_CHECK(cudaSetDevice(device));
        CUDA_CHECK(cudaStreamCreate(&stream_));  // blocking: ordered after cudaMalloc's memset
        CUBLAS_CHECK(cublasCreate(&cublas_));
        CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
        // float32 GEMMs stay float32 (no TF32): the CPU reference is float32.
        CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
        // After cublasSetStream, which resets the workspace to cuBLAS's own pool.
        CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
        CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
        CUDA_CHECK(
            cudaMalloc(&sum_squares_scratch_, sizeof(double) * (cuda::kSumSquaresPartials + 1)));
        CUDA_CHECK(cudaMallocHost(&host_offsets_, sizeof(int64_t) * (kMaxGroupedSegments + 1)));
        CUDA_CHECK(cudaMallocHost(&host_sum_squares_, sizeof(double)));
    }

    // Frees what acquire got, in reverse; errors are ignored (this runs in the destructor, which
    // must not throw, and a failed free at shutdown has no one to report to).
    void release() noexcept {
        if (stream_) (void)cudaStreamSynchronize(stream_);
        if (host_sum_squares_) (void)cudaFreeHost(host_sum_squares_);
        if (host_offsets_) (void)cudaFreeHost(host_offsets_);
        if (sum_squares_scratch_) (void)cudaFree(sum_squares_scratch_);
        if (cublas_) (void)cublasDestroy(cublas_);
        if (cublas_workspace_) (void)cudaFree(cublas_workspace_);
        if (stream_) (void)cudaStreamDestroy(stream_);
    }

    // Only float32 GEMMs have a kernel here so far: the recipes' formats throw.
    static void check_float32(GemmPrecision precision, const char* op) {
        if (precision.format != Precision::fp32)
            throw OpNotImplemented("cuda",
                                   fmt::format("{} in {}", op, precision_name(precision.format)));
    }

    static void check_rows(const char* op, int64_t num_rows, int64_t dim) {
        MT_CHECK(num_rows >= 0 && dim > 0, "[{}] need num_rows >= 0 and dim > 0, got N={} D={}", op,
                 num_rows, dim);
    }

    // C (M, N) = op(A) op(B) + beta C, row-major, dimensions already checked. cuBLAS is
    // column-major, and a row-major X is the column-major X^T, so this computes
    // C^T = op(B)^T op(A)^T: B first, with the CPU's leading dimensions. The shapes cuBLAS
    // rejects (a zero leading dimension) are handled here as matmul.cpp does: nothing to do for
    // an empty C; C = beta C for K = 0, never reading C when beta = 0.
    void gemm(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
              bool trans_a, bool trans_b, float beta) {
        if (m == 0 || n == 0) return;
        if (k == 0) {
            if (beta == 0.0f) {
                zero(c, static_cast<size_t>(m * n) * sizeof(float));
            } else if (beta != 1.0f) {
                cuda::scale_inplace(c, m * n, beta, stream_);
            }
            return;
        }
        const float alpha = 1.0f;
        CUBLAS_CHECK(cublasSgemm(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                                 static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                 static_cast<int>(trans_b ? k : n), a,
                                 static_cast<int>(trans_a ? m : k), &beta, c, static_cast<int>(n)));
    }

    // dinp (M, I) = dout @ W, written (skipped when null); dW (O, I) += dout^T @ inp.
    void linear_backward_gemms(float* dinp, float* dweight, const float* dout, const float* inp,
                               const float* weight, int64_t num_rows, int64_t in_dim,
                               int64_t out_dim) {
        if (dinp != nullptr)
            gemm(dinp, dout, weight, num_rows, in_dim, out_dim, false, false, 0.0f);
        if (dweight != nullptr)
            gemm(dweight, dout, inp, out_dim, in_dim, num_rows, true, false, 1.0f);
    }

    // The E + 1 segment offsets of grouped_linear on the host, checked as the CPU checks them.
    // The GEMM loop needs them there, so this waits for the stream (the offsets are usually
    // written by an earlier op on it). They may be in device or host memory (cudaMemcpyDefault).
    const int64_t* segment_offsets_on_host(const int64_t* offsets, int64_t num_experts,
                                           int64_t in_dim, int64_t out_dim, const char* op) {
        MT_CHECK(num_experts >= 0 && num_experts <= kMaxGroupedSegments,
                 "[{}] num_experts = {} must be in [0, {}] on cuda", op, num_experts,
                 kMaxGroupedSegments);
        MT_CHECK(offsets != nullptr, "[{}] offsets must not be null", op);
        CUDA_CHECK(cudaMemcpyAsync(host_offsets_, offsets,
                                   sizeof(int64_t) * static_cast<size_t>(num_experts + 1),
                                   cudaMemcpyDefault, stream_));
        synchronize();
        MT_CHECK(host_offsets_[0] == 0, "[{}] offsets[0] = {} must be 0 (segments start at row 0)",
                 op, host_offsets_[0]);
        for (int64_t e = 0; e < num_experts; ++e) {
            MT_CHECK(host_offsets_[e + 1] >= host_offsets_[e],
                     "[{}] offsets must be non-decreasing: offsets[{}] = {} < offsets[{}] = {}", op,
                     e + 1, host_offsets_[e + 1], e, host_offsets_[e]);
        }
        check_gemm_dims(host_offsets_[num_experts], out_dim, in_dim, op);
        return host_offsets_;
    }

    int device_ = 0;
    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    void* cublas_workspace_ = nullptr;
    double* sum_squares_scratch_ = nullptr;  // device: kSumSquaresPartials partials, then the sum
    int64_t* host_offsets_ = nullptr;        // pinned: grouped_linear's offsets
    double* host_sum_squares_ = nullptr;     // pinned: sum_squares's result
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
    const int count = cuda::device_count();
    MT_USER_CHECK(device >= 0 && device < count,
                  "there is no CUDA device {}: this machine has {} usable CUDA device{}", device,
                  count, count == 1 ? "" : "s");
    return std::make_unique<CudaBackend>(device);
}

}  // namespace moetron
