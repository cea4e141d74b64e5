// Learning-rate schedule: linear warmup, then cosine decay to min_lr (the schedule of
// DeepSeek-V3's predecessors and of llm.c / nanoGPT, with the floor reached at the last step).
#pragma once

#include <cstdint>

namespace moetron {

class LrSchedule {
  public:
    // total_steps optimizer steps; warmup_steps of them ramp up linearly.
    LrSchedule(double peak_lr, double min_lr, int64_t warmup_steps, int64_t total_steps);

    // Learning rate of 0-based optimizer step `step`:
    //   step < warmup:  peak * (step + 1) / warmup            (never 0, so step 0 learns)
    //   else:           min + (peak - min) * (1 + cos(pi * p)) / 2,
    //                   p = (step - warmup) / (total - 1 - warmup), clamped to [0, 1]
    // Steps past the end stay at min_lr. With no step between warmup and the end (total = warmup
    // + 1), that one step runs at the peak.
    double lr_at(int64_t step) const;

  private:
    double peak_lr_;
    double min_lr_;
    int64_t warmup_steps_;
    int64_t total_steps_;
};

}  // namespace moetron
