// The CUDA backend: the Backend (kernels/backend.h) for one GPU. Includable without CUDA headers;
// in a build without CUDA (kernels/no_cuda.cpp) make_cuda_backend throws.
#pragma once

#include <memory>

#include "moetron/kernels/backend.h"

namespace moetron {

// A backend on CUDA device `device` (0-based), which becomes the calling thread's current
// device: memory() is cudaMalloc (kernels/cuda/device.h), stream() a CUDA stream the backend
// owns, and the GEMMs run through a cuBLAS handle bound to that stream. Ops without a CUDA kernel
// throw OpNotImplemented (kernels/README.md lists which). Throws UserError when moetron was built
// without CUDA or the device does not exist.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

}  // namespace moetron
