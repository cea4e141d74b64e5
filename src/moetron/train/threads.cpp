#include "moetron/train/threads.h"

#include <omp.h>

#include <cstdlib>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron {

int available_processors() {
    return omp_get_num_procs();
}

void check_thread_count(int64_t requested, std::string_view source) {
    const int available = available_processors();
    MT_USER_CHECK(requested <= available,
                  "{} asks for {} compute threads, but this machine offers {} processor(s) to this "
                  "process; use at most {}",
                  source, requested, available, available);
}

ThreadChoice choose_and_set_threads(int requested, double flops_per_work_unit) {
    ThreadChoice choice;
    if (requested > 0) {
        check_thread_count(requested, "--threads");
        choice = {requested, "--threads"};
    } else if (std::getenv("OMP_NUM_THREADS") != nullptr) {
        check_thread_count(omp_get_max_threads(), "OMP_NUM_THREADS");
        choice = {omp_get_max_threads(), "OMP_NUM_THREADS"};
    } else if (flops_per_work_unit < kSingleThreadFlops) {
        choice = {1,
                  "auto: small steps run on one thread, robust on a busy machine; --threads N to "
                  "override"};
    } else {
        choice = {omp_get_max_threads(), "auto: all cores"};
    }
    // OpenBLAS itself stays single-threaded: the GEMMs split their work over OpenMP's threads
    // (kernels/cpu/matmul.cpp).
    omp_set_num_threads(choice.num_threads);
    return choice;
}

}  // namespace moetron
