// The ordering context of a backend's work: what makes "this op, then that collective" hold.
// On a GPU it is a CUDA stream: kernels and NCCL calls issued on one stream run in issue order,
// and the host does not wait. On the CPU every call has finished when it returns, so the context
// is empty. Core never includes CUDA headers, hence the opaque handle.
#pragma once

#include "moetron/core/tensor.h"

namespace moetron {

struct Stream {
    Device device = Device::cpu;
    void* native_handle = nullptr;  // cudaStream_t on Device::cuda; null on the CPU
};

// The CPU's context: calls complete before they return.
inline constexpr Stream kHostStream{};

}  // namespace moetron
