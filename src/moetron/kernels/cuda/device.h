// The CUDA device as the rest of the engine sees it: how many there are, and the memory
// resource that backs device arenas (core/arena.h). Includable without CUDA headers; in a build
// without CUDA (kernels/no_cuda.cpp) the count is 0 and the memory resource throws.
#pragma once

#include <cstddef>

struct CUstream_st;
using cudaStream_t = CUstream_st*;  // the same type CUDA's headers declare

namespace moetron {
class MemoryResource;  // core/arena.h
}

namespace moetron::cuda {

// Number of usable CUDA devices; 0 without a driver or a GPU (never throws).
int device_count();

// cudaMalloc-backed arenas, 256-byte aligned.
MemoryResource& device_memory();

// Host <-> device copies of whole buffers (synchronous), for tests and set-up, not the step loop.
void copy_to_device(void* device_dst, const void* host_src, size_t bytes);
void copy_to_host(void* host_dst, const void* device_src, size_t bytes);
void synchronize();

}  // namespace moetron::cuda
