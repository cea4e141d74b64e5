// Which ranks stopped answering, asked when a collective times out. A timed-out collective only
// says that some rank of its group did not take part; the job's message should say which. On the
// first timeout a rank sends a small "alive" message to every other rank of the world, on a
// communicator of its own, and listens for theirs for a short window. Every rank that is blocked
// in a collective times out at about the same moment and sends its own message, so the ranks not
// heard from are the ones that are stopped (SIGSTOP), hung outside MPI, dead, or busy elsewhere
// for longer than the timeout. Eager point-to-point sends complete without the receiver, so a
// stopped rank cannot block the probe.
#pragma once

#include <mpi.h>

#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace moetron::parallel {

class MpiLivenessProbe {
  public:
    // Takes ownership of comm: a duplicate of the world used for nothing else.
    explicit MpiLivenessProbe(MPI_Comm comm);
    ~MpiLivenessProbe();
    MpiLivenessProbe(const MpiLivenessProbe&) = delete;
    MpiLivenessProbe& operator=(const MpiLivenessProbe&) = delete;

    int world_rank() const { return rank_; }

    // Says "alive" to every other rank and listens up to window_s for theirs; returns the world
    // ranks not heard from, in order. Only the first call probes (a rank says "alive" once); later
    // calls return its answer at once.
    std::vector<int> silent_ranks(double window_s);

    // The window a collective with this timeout probes for: long enough for the other blocked
    // ranks to time out too (they entered the collective at slightly different moments), short
    // against the timeout itself.
    static double window_for_timeout(double timeout_s);

  private:
    std::vector<int> probe(double window_s);

    MPI_Comm comm_;
    int rank_ = 0;
    int size_ = 1;
    std::vector<int> inbox_;  // one slot per rank for its "alive" message
    std::mutex mutex_;
    std::optional<std::vector<int>> answer_;  // guarded by mutex_
};

// "world rank 3 did not answer ..." for a timeout message.
std::string describe_silent_ranks(const std::vector<int>& silent, double window_s);

}  // namespace moetron::parallel
