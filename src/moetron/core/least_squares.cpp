#include "moetron/core/least_squares.h"

#include "moetron/core/error.h"

namespace moetron {

LineFit fit_line(std::span<const double> x, std::span<const double> y,
                 std::span<const double> weights) {
    MT_CHECK(x.size() == y.size() && (weights.empty() || weights.size() == x.size()),
             "[fit_line] {} x, {} y and {} weights: give one of each per point", x.size(), y.size(),
             weights.size());
    auto weight = [&](size_t i) { return weights.empty() ? 1.0 : weights[i]; };
    double sum_w = 0;
    LineFit f;
    for (size_t i = 0; i < x.size(); ++i) {
        MT_CHECK(weight(i) > 0, "[fit_line] weight {} of point {} is not positive", weight(i), i);
        sum_w += weight(i);
        f.mean_x += weight(i) * x[i];
        f.mean_y += weight(i) * y[i];
    }
    MT_CHECK(sum_w > 0, "[fit_line] no point to fit");
    f.mean_x /= sum_w;
    f.mean_y /= sum_w;
    // Centered sums: exact for a line and well conditioned when x sits far from 0 (bytes).
    double sxx = 0, sxy = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double dx = x[i] - f.mean_x;
        sxx += weight(i) * dx * dx;
        sxy += weight(i) * dx * (y[i] - f.mean_y);
    }
    MT_CHECK(sxx > 0, "[fit_line] the {} points have fewer than two distinct x: no slope",
             x.size());
    f.slope = sxy / sxx;
    f.intercept = f.mean_y - f.slope * f.mean_x;
    return f;
}

}  // namespace moetron
