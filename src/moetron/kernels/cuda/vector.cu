// Elementwise arithmetic and the sum of squares on flat float32 buffers (cpu/elementwise.h,
// cpu/adamw.h's norm helpers), grid-stride loops on the caller's stream.
#include "moetron/kernels/cuda/cuda_check.h"
#include "moetron/kernels/cuda/launch.h"
#include "moetron/kernels/cuda/ops.h"

namespace moetron::cuda {

namespace {

using detail::grid_for;
using detail::kThreadsPerBlock;

__device__ inline int64_t first_index() {
    return blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
}
__device__ inline int64_t grid_stride() {
    return int64_t(gridDim.x) * blockDim.x;
}

__global__ void add_inplace_kernel(float* y, const float* x, int64_t n) {
    for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] += x[i];
}

__global__ void axpy_kernel(float* y, float alpha, const float* x, int64_t n) {
    for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] += alpha * x[i];
}

__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
    for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = a[i] + b[i];
}

__global__ void scale_inplace_kernel(float* x, int64_t n, float factor) {
    for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] *= factor;
}

// Sum over the block in a fixed order (a tree in shared memory); thread 0 gets the result.
__device__ double block_sum_in_order(double x) {
    __shared__ double partial[kThreadsPerBlock];
    partial[threadIdx.x] = x;
    __syncthreads();
    for (int width = kThreadsPerBlock / 2; width > 0; width /= 2) {
        if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
        __syncthreads();
    }
    return partial[0];
}

// Pass 1: block b writes the sum of squares of the elements its threads stride over.
__global__ void sum_squares_partials_kernel(double* partials, const float* x, int64_t n) {
    double sum = 0.0;
    for (int64_t i = first_index(); i < n; i += grid_stride())
        sum += static_cast<double>(x[i]) * x[i];
    const double block_total = block_sum_in_order(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = block_total;
}

// Pass 2: one block adds the partials, again in a fixed order.
__global__ void sum_partials_kernel(double* result, const double* partials, int num_partials) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x) sum += partials[i];
    const double total = block_sum_in_order(sum);
    if (threadIdx.x == 0) *result = total;
}

}  // namespace

void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    add_inplace_kernel<<<grid_for(n), kThreadsPerBlock, 0, stream>>>(y, x, n);
    CUDA_CHECK(cudaGetLastError());
}

void axpy(float* y, float alpha, const float* x, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    axpy_kernel<<<grid_for(n), kThreadsPerBlock, 0, stream>>>(y, alpha, x, n);
    CUDA_CHECK(cudaGetLastError());
}

void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    add_kernel<<<grid_for(n), kThreadsPerBlock, 0, stream>>>(out, a, b, n);
    CUDA_CHECK(cudaGetLastError());
}

void scale_inplace(float* x, int64_t n, float factor, cudaStream_t stream) {
    if (n == 0) return;
    scale_inplace_kernel<<<grid_for(n), kThreadsPerBlock, 0, stream>>>(x, n, factor);
    CUDA_CHECK(cudaGetLastError());
}

void sum_squares(double* result, double* partials, const float* x, int64_t n, cudaStream_t stream) {
    if (n == 0) {
        CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), stream));
        return;
    }
    const int64_t wanted_blocks = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
    const int num_blocks =
        static_cast<int>(wanted_blocks < kSumSquaresPartials ? wanted_blocks : kSumSquaresPartials);
    sum_squares_partials_kernel<<<num_blocks, kThreadsPerBlock, 0, stream>>>(partials, x, n);
    CUDA_CHECK(cudaGetLastError());
    sum_partials_kernel<<<1, kThreadsPerBlock, 0, stream>>>(result, partials, num_blocks);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace moetron::cuda
