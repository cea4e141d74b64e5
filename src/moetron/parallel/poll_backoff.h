// The sleep of a polling thread between sweeps over outstanding requests: the base interval
// while requests complete or arrive, doubling after each sweep that completed none, up to
// max_factor times the base. A pipeline stage posts the receive of a gradient one whole
// forward-backward of its neighbour before the gradient is sent; polled every 50 us, such
// receives cost stage 0 of tiny's pp2 12-20 ms of CPU per step (a fifth of its compute) on a CPU
// rank, taken from the cores the computing threads need, and made the engine's stages look
// balanced where their compute is not. The requests a caller waits for are unaffected: a caller
// polls them itself (MpiProgressEngine::begin_wait). Only point-to-point requests let the sleep
// grow (MpiOperation::waits_for_peer): a nonblocking collective advances a round on each test
// without completing, and a gradient all-reduce polled every 0.8 ms made tiny's two-rank step
// 2-8% slower.
#pragma once

#include <algorithm>

namespace moetron::parallel {

class PollBackoff {
  public:
    explicit PollBackoff(double base_s, double max_factor = kDefaultMaxFactor)
        : base_s_(base_s), max_s_(base_s * max_factor), interval_s_(base_s) {}

    double interval_s() const { return interval_s_; }
    // A request completed or a new one arrived: the next steps may follow soon.
    void progressed() { interval_s_ = base_s_; }
    // A sweep completed nothing: what is outstanding waits for a peer, not for us.
    void idle_sweep() { interval_s_ = std::min(2 * interval_s_, max_s_); }

    // 16 x the default 50 us: a request seen complete at most 0.8 ms late, about 1% of a core
    // spent polling one that waits for a peer.
    static constexpr double kDefaultMaxFactor = 16;

  private:
    double base_s_, max_s_, interval_s_;
};

}  // namespace moetron::parallel
