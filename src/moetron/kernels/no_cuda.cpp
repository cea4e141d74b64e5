// The CUDA device API in a build without CUDA: no devices, and a clear error on any use.
#include "moetron/core/arena.h"
#include "moetron/core/error.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/cuda/cuda_backend.h"
#include "moetron/kernels/cuda/device.h"

namespace moetron::cuda {

namespace {
[[noreturn]] void built_without_cuda(const char* what) {
    MT_THROW("[cuda] {}: moetron was built without CUDA (no nvcc found at configure time)", what);
}
}  // namespace

int device_count() {
    return 0;
}
MemoryResource& device_memory() {
    built_without_cuda("device_memory");
}
void copy_to_device(void*, const void*, size_t) {
    built_without_cuda("copy_to_device");
}
void copy_to_host(void*, const void*, size_t) {
    built_without_cuda("copy_to_host");
}
void synchronize() {
    built_without_cuda("synchronize");
}

}  // namespace moetron::cuda

namespace moetron {

std::unique_ptr<Backend> make_cuda_backend(int) {
    MT_USER_THROW(
        "the cuda backend is not available: moetron was built without CUDA (no nvcc found at "
        "configure time); rebuild with the CUDA toolkit installed");
}

}  // namespace moetron
