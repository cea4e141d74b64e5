// Small string helpers for error messages that help a person fix their input.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace moetron {

// Levenshtein distance (insertions, deletions, substitutions each cost 1).
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `name` by edit distance (the first of equals); empty when there are
// no candidates. For "unknown key 'hiden_size' (did you mean 'hidden_size'?)".
std::string_view closest_match(std::string_view name,
                               const std::vector<std::string_view>& candidates);

}  // namespace moetron
