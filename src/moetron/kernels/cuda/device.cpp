// Host-side device management; plain C++ against the CUDA runtime API.
#include "moetron/kernels/cuda/device.h"

#include "moetron/core/arena.h"
#include "moetron/kernels/cuda/cuda_check.h"

namespace moetron::cuda {

namespace {

class DeviceMemory final : public MemoryResource {
  public:
    void* allocate(size_t bytes, size_t alignment_bytes) override {
        MT_CHECK(alignment_bytes <= kDeviceAlignmentBytes,
                 "[cuda] cudaMalloc guarantees {}-byte alignment, {} requested",
                 kDeviceAlignmentBytes, alignment_bytes);
        if (bytes == 0) return nullptr;
        void* p = nullptr;
        CUDA_CHECK(cudaMalloc(&p, bytes));
        CUDA_CHECK(cudaMemset(p, 0, bytes));
        return p;
    }
    void deallocate(void* p, size_t) override { cudaFree(p); }
    void zero(void* p, size_t bytes) override {
        if (bytes) CUDA_CHECK(cudaMemset(p, 0, bytes));
    }
    Device device() const override { return Device::cuda; }
};

}  // namespace

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky "no driver" error
        return 0;
    }
    return n;
}

MemoryResource& device_memory() {
    static DeviceMemory memory;  // stateless
    return memory;
}

void copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice));
}

void copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost));
}

void synchronize() {
    CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace moetron::cuda
