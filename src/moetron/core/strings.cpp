#include "moetron/core/strings.h"

#include <algorithm>
#include <limits>

namespace moetron {

size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
            diagonal = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
        }
    }
    return row[b.size()];
}

std::string_view closest_match(std::string_view name,
                               const std::vector<std::string_view>& candidates) {
    std::string_view best;
    size_t best_distance = std::numeric_limits<size_t>::max();
    for (std::string_view candidate : candidates) {
        const size_t d = edit_distance(name, candidate);
        if (d < best_distance) best_distance = d, best = candidate;
    }
    return best;
}

}  // namespace moetron
