// Parameter initialization: OpenMP over chunks of the output, dynamically scheduled (the expert
// tensors are large, the norms small).
#include "moetron/kernels/cpu/param_init.h"

#include <algorithm>

#include "moetron/core/rng.h"

namespace moetron::cpu {

namespace {

// Elements one thread initializes at a time: large enough to amortize the scheduling, small
// enough that the big expert tensors spread over all threads.
constexpr int64_t kInitChunk = int64_t{1} << 16;

}  // namespace

void init_normal(float* out, uint64_t seed, uint64_t name_hash, int64_t num_runs,
                 int64_t run_length, int64_t first_index, int64_t run_stride, float stddev) {
    const ParamRng rng(seed, name_hash);
    const int64_t n = num_runs * run_length;
    const int64_t num_chunks = (n + kInitChunk - 1) / kInitChunk;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t c = 0; c < num_chunks; ++c) {
        const int64_t chunk_end = std::min(n, (c + 1) * kInitChunk);
        // The chunk may start inside a run and cross several: one fill per piece of a run.
        for (int64_t i = c * kInitChunk; i < chunk_end;) {
            const int64_t run = i / run_length, in_run = i % run_length;
            const int64_t count = std::min(run_length - in_run, chunk_end - i);
            rng.fill_normal(out + i, static_cast<uint64_t>(count), stddev,
                            static_cast<uint64_t>(first_index + run * run_stride + in_run));
            i += count;
        }
    }
}

void fill(float* x, int64_t n, float value) {
    std::fill(x, x + n, value);
}

}  // namespace moetron::cpu
