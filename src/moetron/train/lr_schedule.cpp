#include "moetron/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "moetron/core/error.h"

namespace moetron {

LrSchedule::LrSchedule(double peak_lr, double min_lr, int64_t warmup_steps, int64_t total_steps)
    : peak_lr_(peak_lr), min_lr_(min_lr), warmup_steps_(warmup_steps), total_steps_(total_steps) {
    MT_CHECK(peak_lr > 0 && min_lr >= 0 && min_lr <= peak_lr,
             "[lr-schedule] need 0 <= min_lr ({}) <= lr ({}) and lr > 0", min_lr, peak_lr);
    MT_CHECK(warmup_steps >= 0 && total_steps >= 1,
             "[lr-schedule] need warmup_steps >= 0 and total_steps >= 1, got {} and {}",
             warmup_steps, total_steps);
}

double LrSchedule::lr_at(int64_t step) const {
    if (step < warmup_steps_) {
        return peak_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
    }
    const int64_t decay_span = total_steps_ - 1 - warmup_steps_;
    const double progress =
        decay_span <= 0
            ? (step > warmup_steps_ ? 1.0 : 0.0)  // no room to decay: the one step after warmup
            : std::clamp(
                  static_cast<double>(step - warmup_steps_) / static_cast<double>(decay_span), 0.0,
                  1.0);
    return min_lr_ + (peak_lr_ - min_lr_) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace moetron
