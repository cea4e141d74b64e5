// The median and spread (min..max) of a ratio measured as interleaved pairs (A B A B ...): the
// C++ benches' side of bench/ratio_stats.py, printing the same line. One pair says little on a
// shared machine; the spread says how far to trust the median.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace moetron::bench {

// At least this many pairs before a ratio is worth printing.
inline constexpr size_t kMinRatioPairs = 5;

struct RatioSpread {
    double median = 0;
    double min = 0;
    double max = 0;
    size_t pairs = 0;
};

inline RatioSpread ratio_spread(std::vector<double> ratios) {
    RatioSpread s;
    s.pairs = ratios.size();
    if (ratios.empty()) return s;
    std::sort(ratios.begin(), ratios.end());
    const size_t n = ratios.size();
    s.median = n % 2 == 1 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]);
    s.min = ratios.front();
    s.max = ratios.back();
    return s;
}

// "LABEL: median M (min..max L..H over N interleaved pairs)", as bench/ratio_stats.py prints it.
inline std::string format_ratio_spread(std::string_view label, const RatioSpread& s) {
    return fmt::format("{}: median {:.3f} (min..max {:.3f}..{:.3f} over {} interleaved pairs)",
                       label, s.median, s.min, s.max, s.pairs);
}

}  // namespace moetron::bench
