// CUDA_CHECK / CUBLAS_CHECK: report the failing call, file, line and the library's error value
// as a moetron::Error, like MT_CHECK. This header stays free of fmt (whose compile-time format
// checks nvcc's front end cannot evaluate), so .cu files include it instead of core/error.h.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace moetron::cuda::detail {
[[noreturn]] void call_failed(const char* file, int line, const char* call, const char* library,
                              int code, const char* message);
[[noreturn]] void argument_failed(const char* file, int line, const char* message);
}  // namespace moetron::cuda::detail

#define CUDA_CHECK(call)                                                                   \
    do {                                                                                   \
        const cudaError_t moetron_cuda_status = (call);                                    \
        if (moetron_cuda_status != cudaSuccess)                                            \
            ::moetron::cuda::detail::call_failed(__FILE__, __LINE__, #call, "cuda",        \
                                                 static_cast<int>(moetron_cuda_status),    \
                                                 cudaGetErrorString(moetron_cuda_status)); \
    } while (0)

#define CUBLAS_CHECK(call)                                                                      \
    do {                                                                                        \
        const cublasStatus_t moetron_cublas_status = (call);                                    \
        if (moetron_cublas_status != CUBLAS_STATUS_SUCCESS)                                     \
            ::moetron::cuda::detail::call_failed(__FILE__, __LINE__, #call, "cublas",           \
                                                 static_cast<int>(moetron_cublas_status),       \
                                                 cublasGetStatusString(moetron_cublas_status)); \
    } while (0)

// CUDA_REQUIRE(cond, "message"): argument checks inside .cu files.
#define CUDA_REQUIRE(cond, message)                                                         \
    do {                                                                                    \
        if (!(cond)) ::moetron::cuda::detail::argument_failed(__FILE__, __LINE__, message); \
    } while (0)
