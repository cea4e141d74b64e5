// How many compute threads a run uses (OpenMP's; BLAS runs inside OpenMP's threads).
//
// Small steps run on one thread unless asked otherwise. A tiny model's step is a few milliseconds
// of work split into hundreds of small kernels, and at every kernel boundary OpenMP's and
// OpenBLAS's thread pools wait for each other. On an idle machine a second thread still helps a
// little (tiny preset, 200 steps: 3.2 s on 1 thread, 2.2 s on 2), but when other jobs share the
// cores the waiting threads spin against each other and the same run took 190 s on 2 threads
// against 5-8 s on 1. So when nobody asked for a count, steps under kSingleThreadFlops run on one
// thread: at worst a little slower, never pathologically slow.
//
// A count above the processors this process may use is an error, not a request to honour: each
// OpenMP thread reserves a stack, and 100000 of them crashed the OpenMP runtime while 20000 took
// minutes per step and ignored SIGTERM.
#pragma once

#include <cstdint>
#include <string_view>

namespace moetron {

inline constexpr double kSingleThreadFlops = 5e9;
// The command line's bound on --threads; the machine's processor count bounds it further.
inline constexpr int64_t kMaxThreads = 1 << 16;

// The processors this process may run on (OpenMP's count, which follows the CPU affinity mask).
int available_processors();

// Throws, naming `source` (the flag or variable that asked) and what the machine offers, when
// `requested` exceeds available_processors().
void check_thread_count(int64_t requested, std::string_view source);

struct ThreadChoice {
    int num_threads = 1;
    const char* reason = "";  // for the run's header
};

// requested > 0 wins (checked against the machine); then the OMP_NUM_THREADS environment variable;
// then one thread for work units under kSingleThreadFlops, else every core OpenMP offers. Applies
// the count to OpenMP.
ThreadChoice choose_and_set_threads(int requested, double flops_per_work_unit);

}  // namespace moetron
