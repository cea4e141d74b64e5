// Parameter initialization on the backend's memory. Normal draws are counter-based (core/rng.h,
// ParamRng): element g of tensor P is stddev * normal(seed, hash of P's name, g), g its index in
// the global (unsharded) tensor, so that any shard of P gets the same numbers as the same slice of
// the whole tensor, whatever the thread count.
#pragma once

#include <cstdint>

namespace moetron::cpu {

// out (num_runs, run_length) written: out[r * run_length + j] = stddev * ParamRng(seed,
// name_hash).normal(first_index + r * run_stride + j). A shard of a tensor is such runs: one run
// for a whole tensor or a row block, one per row for a column split (TensorParallelShard).
// name_hash: fnv1a_64 of the tensor's name.
void init_normal(float* out, uint64_t seed, uint64_t name_hash, int64_t num_runs,
                 int64_t run_length, int64_t first_index, int64_t run_stride, float stddev);
// x (n) = value (norm gains 1, biases 0).
void fill(float* x, int64_t n, float value);

}  // namespace moetron::cpu
