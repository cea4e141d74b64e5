#include "moetron/parallel/mpi_progress.h"

#include <algorithm>
#include <chrono>

#include "moetron/core/timer.h"
#include "moetron/parallel/mpi_check.h"
#include "moetron/parallel/poll_backoff.h"

namespace moetron::parallel {

bool try_complete(MpiOperation& op) {
    if (op.done.load(std::memory_order_acquire)) return true;
    if (op.testing.test_and_set(std::memory_order_acquire)) return false;
    bool finished = op.done.load(std::memory_order_acquire);
    if (!finished) {
        int flag = 0;
        const int code = MPI_Test(&op.request, &flag, MPI_STATUS_IGNORE);
        if (code != MPI_SUCCESS) {
            // No throw here: this may run on the progress thread. wait() reports it.
            op.error = "[mpi] MPI_Test failed: " + mpi_error_string(code);
            finished = true;
        } else {
            finished = flag != 0;
        }
        if (finished) {
            op.completed_at_s = Timer::now_s();
            op.done.store(true, std::memory_order_release);
        }
    }
    op.testing.clear(std::memory_order_release);
    return finished;
}

MpiProgressEngine::MpiProgressEngine(bool run_thread, double poll_interval_s)
    : poll_interval_s_(poll_interval_s) {
    if (run_thread) thread_ = std::thread([this] { run(); });
}

MpiProgressEngine::~MpiProgressEngine() {
    if (!thread_.joinable()) return;
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
}

void MpiProgressEngine::track(std::shared_ptr<MpiOperation> op) {
    if (!thread_.joinable() || abandoned()) return;
    {
        std::lock_guard lock(mutex_);
        outstanding_.push_back(std::move(op));
        tracked_since_sweep_ = true;
    }
    wake_.notify_one();
}

void MpiProgressEngine::abandon() {
    abandoned_.store(true, std::memory_order_release);
    if (!thread_.joinable()) return;
    {
        std::lock_guard lock(mutex_);
        outstanding_.clear();  // never tested again: MPI keeps the requests until the job ends
    }
    wake_.notify_one();
}

void MpiProgressEngine::begin_wait() {
    if (!thread_.joinable()) return;
    std::lock_guard lock(mutex_);
    ++active_waiters_;
}

void MpiProgressEngine::end_wait() {
    if (!thread_.joinable()) return;
    bool resume = false;
    {
        std::lock_guard lock(mutex_);
        resume = --active_waiters_ == 0 && !outstanding_.empty();
    }
    // Waking the thread with nothing to do would cost a context switch per collective.
    if (resume) wake_.notify_one();
}

void MpiProgressEngine::run() {
    PollBackoff backoff(poll_interval_s_);
    std::unique_lock lock(mutex_);
    while (true) {
        // Sleeps without polling while nothing is outstanding or a caller is polling itself.
        wake_.wait(lock,
                   [this] { return stop_ || (!outstanding_.empty() && active_waiters_ == 0); });
        if (stop_) return;
        // One MPI_Test drives all of Open MPI's pending work (opal_progress); testing each
        // request also retires the finished ones.
        sweeps_.fetch_add(1, std::memory_order_relaxed);
        const size_t before = outstanding_.size();
        std::erase_if(outstanding_,
                      [](const std::shared_ptr<MpiOperation>& op) { return try_complete(*op); });
        const bool only_peer_waits =
            std::all_of(outstanding_.begin(), outstanding_.end(),
                        [](const std::shared_ptr<MpiOperation>& op) { return op->waits_for_peer; });
        if (outstanding_.size() < before || tracked_since_sweep_ || !only_peer_waits) {
            backoff.progressed();
        } else {
            backoff.idle_sweep();
        }
        tracked_since_sweep_ = false;
        if (outstanding_.empty()) continue;
        if (backoff.interval_s() > longest_sleep_s_.load(std::memory_order_relaxed))
            longest_sleep_s_.store(backoff.interval_s(), std::memory_order_relaxed);
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::duration<double>(backoff.interval_s()));
        lock.lock();
    }
}

}  // namespace moetron::parallel
