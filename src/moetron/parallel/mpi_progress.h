// Progress for nonblocking MPI collectives. Open MPI 4.1 advances a nonblocking collective only
// while some thread is inside MPI ("OMPI progress: no" in ompi_info), so an MPI_Iallreduce posted
// before a long computation sits mostly idle until wait(). The progress engine runs one thread per
// world communicator (shared by the groups split from it) that calls MPI_Test on the outstanding
// requests every poll interval, so the collective advances while the caller computes; while its
// sweeps complete nothing and only point-to-point requests wait for their peers, it polls less
// often (poll_backoff.h).
//
// A request must never be tested by two threads at once (MPI forbids it), so each operation
// carries a flag: whichever thread sets it may call MPI_Test; the other skips or retries.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moetron::parallel {

struct MpiOperation {
    MPI_Request request = MPI_REQUEST_NULL;
    std::atomic<bool> done{false};
    std::atomic_flag testing;   // set while one thread is inside MPI_Test on request
    std::string error;          // MPI_Test's failure, written before done is set
    double completed_at_s = 0;  // Timer::now_s() when first seen complete, written before done
    // A point-to-point send or receive: until its peer posts the other side, testing it advances
    // nothing, so the progress thread may poll it less often. A nonblocking collective advances a
    // round on every test without completing, and is always polled at the base interval.
    bool waits_for_peer = false;
};

// Tests op once unless another thread is testing it; true once op is complete (or failed).
bool try_complete(MpiOperation& op);

class MpiProgressEngine {
  public:
    // With run_thread false the engine does nothing: requests progress inside wait()/test() only.
    MpiProgressEngine(bool run_thread, double poll_interval_s);
    ~MpiProgressEngine();
    MpiProgressEngine(const MpiProgressEngine&) = delete;
    MpiProgressEngine& operator=(const MpiProgressEngine&) = delete;

    bool thread_running() const { return thread_.joinable(); }
    // Hands an outstanding operation to the thread, which tests it until it completes.
    void track(std::shared_ptr<MpiOperation> op);

    // After a collective of this world failed (timed out) the job is ending: the thread stops
    // driving the outstanding requests, whose buffers the unwinding caller is about to free, and
    // every later wait of this world fails at once instead of timing out again.
    void abandon();
    bool abandoned() const { return abandoned_.load(std::memory_order_acquire); }

    // Brackets a caller's polling wait(): meanwhile the progress thread sleeps, since two
    // threads polling MPI only contend for its internal locks (and, oversubscribed, for cores).
    void begin_wait();
    void end_wait();

    // Sweeps over the outstanding requests so far (each one MPI_Test per request).
    int64_t sweeps() const { return sweeps_.load(std::memory_order_relaxed); }
    // The longest sleep between two sweeps so far.
    double longest_sleep_s() const { return longest_sleep_s_.load(std::memory_order_relaxed); }

  private:
    void run();

    std::mutex mutex_;
    std::condition_variable wake_;
    std::vector<std::shared_ptr<MpiOperation>> outstanding_;  // guarded by mutex_
    bool stop_ = false;                                       // guarded by mutex_
    std::atomic<bool> abandoned_{false};
    std::atomic<int64_t> sweeps_{0};
    std::atomic<double> longest_sleep_s_{0};
    int active_waiters_ = 0;            // guarded by mutex_
    bool tracked_since_sweep_ = false;  // guarded by mutex_; resets the poll backoff
    double poll_interval_s_;            // the shortest sleep between sweeps (PollBackoff)
    std::thread thread_;
};

}  // namespace moetron::parallel
