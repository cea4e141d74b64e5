// Launch geometry shared by the .cu files: one block size, and grid-stride grids capped so that
// a launch never exceeds the grid limit whatever the element count. Device code only (nvcc).
#pragma once

#include <cstdint>

namespace moetron::cuda::detail {

inline constexpr int kThreadsPerBlock = 256;

// Blocks for a grid-stride loop over n elements: enough to cover n, at least one, at most 65535
// (each thread then strides over the rest).
inline int grid_for(int64_t n) {
    const int64_t blocks = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
    return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

}  // namespace moetron::cuda::detail
