// Probes of the machine a backend runs on, for `moetron calibrate` (calibrate/measure.cpp): the
// memory bandwidth an elementwise op can reach, the rate of exponentials (softmax's special
// function) and the fixed cost of launching an op. Each is the simplest op that isolates its
// resource, so the cluster model's parameters (sim/hardware.h: hbm_gbytes_per_s, exp_per_s,
// gpu_overhead_us) come from the same backend the engine trains with.
#pragma once

#include <cstdint>

namespace moetron::cpu {

// a (n) = b + s * c: STREAM's triad, 12 bytes moved per element.
void stream_triad(float* a, const float* b, const float* c, float s, int64_t n);
// out (n) = exp(inp), all threads.
void exp_elementwise(float* out, const float* inp, int64_t n);
// One empty OpenMP parallel region: what every multi-threaded CPU op pays before its work.
void empty_launch();

}  // namespace moetron::cpu
