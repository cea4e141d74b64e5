#include "moetron/cli/number_options.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <string>
#include <system_error>

namespace moetron::cli {

namespace {

std::string describe_range(int64_t min, int64_t max) {
    if (max == kNoUpperLimit) return fmt::format("allowed: {} or more", min);
    return fmt::format("allowed: {} to {}", min, max);
}

// "1e+300" reads worse than "1e300"; {:g} keeps small bounds readable (0.5, 65536).
std::string describe_bound(double x) {
    return fmt::format("{:g}", x);
}

}  // namespace

CLI::Validator whole_number(int64_t min, int64_t max) {
    const std::string range = describe_range(min, max);
    return CLI::Validator(
        [min, max, range](std::string& text) -> std::string {
            int64_t value = 0;
            const char* end = text.data() + text.size();
            const char* begin = text.data();
            if (begin != end && *begin == '+') ++begin;  // from_chars takes '-' but not '+'
            const auto [stop, error] = std::from_chars(begin, end, value);
            if (error == std::errc::result_out_of_range)
                return fmt::format("{} is out of range ({})", text, range);
            if (error != std::errc() || stop != end || begin == end)
                return fmt::format("'{}' is not a whole number ({})", text, range);
            if (value < min || value > max)
                return fmt::format("{} is out of range ({})", text, range);
            return {};
        },
        max == kNoUpperLimit ? fmt::format("INT >= {}", min)
                             : fmt::format("INT in [{}, {}]", min, max));
}

namespace {

CLI::Validator checked_finite(double min, double max, bool min_exclusive) {
    const std::string range =
        min_exclusive ? fmt::format("allowed: more than {}, at most {}", describe_bound(min),
                                    describe_bound(max))
                      : fmt::format("allowed: {} to {}", describe_bound(min), describe_bound(max));
    return CLI::Validator(
        [min, max, min_exclusive, range](std::string& text) -> std::string {
            double value = 0;
            const char* end = text.data() + text.size();
            const char* begin = text.data();
            if (begin != end && *begin == '+') ++begin;
            const auto [stop, error] = std::from_chars(begin, end, value);
            if (error == std::errc::result_out_of_range)
                return fmt::format("{} is out of range ({})", text, range);
            if (error != std::errc() || stop != end || begin == end)
                return fmt::format("'{}' is not a number ({})", text, range);
            if (!std::isfinite(value))
                return fmt::format("{} is not a finite number ({})", text, range);
            if (value < min || (min_exclusive && value == min) || value > max)
                return fmt::format("{} is out of range ({})", text, range);
            return {};
        },
        fmt::format("NUMBER in {}{}, {}]", min_exclusive ? "(" : "[", describe_bound(min),
                    describe_bound(max)));
}

}  // namespace

CLI::Validator finite_number(double min, double max) {
    return checked_finite(min, max, /*min_exclusive=*/false);
}

CLI::Validator positive_number(double max) {
    return checked_finite(0.0, max, /*min_exclusive=*/true);
}

}  // namespace moetron::cli
