#include "moetron/parallel/mpi_liveness.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "moetron/core/timer.h"
#include "moetron/parallel/mpi_check.h"

namespace moetron::parallel {

namespace {

constexpr int kAliveTag = 7;
// The message itself: constant, so that a send still in flight when the job ends never reads
// freed memory.
const int kAliveMessage = 1;

}  // namespace

MpiLivenessProbe::MpiLivenessProbe(MPI_Comm comm) : comm_(comm) {
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    inbox_.resize(static_cast<size_t>(size_));
}

MpiLivenessProbe::~MpiLivenessProbe() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
}

double MpiLivenessProbe::window_for_timeout(double timeout_s) {
    return std::clamp(timeout_s / 4, std::min(timeout_s, 1.0), 10.0);
}

std::vector<int> MpiLivenessProbe::silent_ranks(double window_s) {
    std::lock_guard lock(mutex_);
    if (!answer_) answer_ = probe(window_s);
    return *answer_;
}

std::vector<int> MpiLivenessProbe::probe(double window_s) {
    std::vector<MPI_Request> receives(static_cast<size_t>(size_), MPI_REQUEST_NULL);
    for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        MPI_Request send = MPI_REQUEST_NULL;
        // Errors are ignored here: the probe only refines a message that is reported anyway.
        if (MPI_Isend(&kAliveMessage, 1, MPI_INT, peer, kAliveTag, comm_, &send) == MPI_SUCCESS)
            MPI_Request_free(&send);  // completes on its own; nobody waits for it
        MPI_Irecv(&inbox_[static_cast<size_t>(peer)], 1, MPI_INT, peer, kAliveTag, comm_,
                  &receives[static_cast<size_t>(peer)]);
    }
    std::vector<bool> heard(static_cast<size_t>(size_), false);
    heard[static_cast<size_t>(rank_)] = true;
    const Timer timer;
    while (true) {
        bool all_heard = true;
        for (int peer = 0; peer < size_; ++peer) {
            const auto p = static_cast<size_t>(peer);
            if (heard[p]) continue;
            int flag = 0;
            if (receives[p] != MPI_REQUEST_NULL) MPI_Test(&receives[p], &flag, MPI_STATUS_IGNORE);
            heard[p] = flag != 0;
            all_heard = all_heard && heard[p];
        }
        if (all_heard || timer.elapsed_s() > window_s) break;
        std::this_thread::yield();
    }
    std::vector<int> silent;
    for (int peer = 0; peer < size_; ++peer) {
        const auto p = static_cast<size_t>(peer);
        if (heard[p]) continue;
        silent.push_back(peer);
        if (receives[p] != MPI_REQUEST_NULL) {
            // A cancelled receive completes at once; it must not match a late message into an
            // inbox nobody reads.
            MPI_Cancel(&receives[p]);
            MPI_Wait(&receives[p], MPI_STATUS_IGNORE);
        }
    }
    return silent;
}

std::string describe_silent_ranks(const std::vector<int>& silent, double window_s) {
    if (silent.empty()) {
        return fmt::format(
            "every rank answered a liveness probe within {} s, so none is stopped or dead: a rank "
            "of the group is busy elsewhere or the ranks called collectives in different orders",
            window_s);
    }
    return fmt::format(
        "world rank{} {} did not answer a liveness probe within {} s (stopped, hung outside MPI, "
        "or dead); every other rank did",
        silent.size() == 1 ? "" : "s", fmt::join(silent, ", "), window_s);
}

}  // namespace moetron::parallel
