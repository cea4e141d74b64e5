// Numbers on the command line, checked before CLI11 converts them. CLI11's own checks print
// their bounds as doubles (a 309-digit number for "no upper limit") and its integer conversion
// saturates a value too large for the type; these validators parse the text strictly and answer
// "--steps: 99999999999999999999 is out of range: allowed 1 to 1000000000000". Every command uses
// them for every numeric option.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>

namespace moetron::cli {

inline constexpr int64_t kNoUpperLimit = std::numeric_limits<int64_t>::max();

// A whole number (decimal digits, optional sign) in [min, max].
CLI::Validator whole_number(int64_t min, int64_t max = kNoUpperLimit);

// A finite number (no nan or inf) in [min, max].
CLI::Validator finite_number(double min, double max);

// A finite number in (0, max]: for rates, sizes and durations that must be positive.
CLI::Validator positive_number(double max);

}  // namespace moetron::cli
