// A monotonic wall-clock timer (std::chrono::steady_clock). Units are in the method names.
#pragma once

#include <chrono>

namespace moetron {

class Timer {
  public:
    Timer() : start_(Clock::now()) {}
    void reset() { start_ = Clock::now(); }
    double elapsed_s() const {
        return std::chrono::duration<double>(Clock::now() - start_).count();
    }
    double elapsed_ms() const { return elapsed_s() * 1e3; }
    double elapsed_us() const { return elapsed_s() * 1e6; }

    // Seconds since an arbitrary fixed origin; for trace timestamps that must agree within a run.
    static double now_s() {
        return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
    }

  private:
    using Clock = std::chrono::steady_clock;
    Clock::time_point start_;
};

}  // namespace moetron
