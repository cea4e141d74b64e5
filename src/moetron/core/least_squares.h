// The weighted least-squares line through measured points: the one fit that the calibration (a
// collective's alpha-beta line, calibrate/fit.cpp) and the cluster file's reader (the slowest
// rank's excess against the block duration on log axes, sim/hardware.cpp) both need.
#pragma once

#include <span>

namespace moetron {

// y = intercept + slope x, minimizing sum w_i (y_i - intercept - slope x_i)^2. mean_x and mean_y
// are the weighted means: the line passes through them, and a caller that clamps the slope keeps
// its line through that point.
struct LineFit {
    double intercept = 0, slope = 0;
    double mean_x = 0, mean_y = 0;
};

// weights: one per point, positive; empty for all 1. Throws moetron::Error when the sizes differ,
// a weight is not positive, or fewer than two distinct x leave the slope undefined.
LineFit fit_line(std::span<const double> x, std::span<const double> y,
                 std::span<const double> weights = {});

}  // namespace moetron
