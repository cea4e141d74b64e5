// Small string helpers for error messages that help a person fix their input.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace moetron {

// Levenshtein distance (insertions, deletions, substitutions each cost 1).
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `name` by edit distance (the first of equals); empty when there are
// no candidates. For "unknown key 'hiden_size' (did you mean 'hidden_size'?)".
std::string_view closest_match(std::string_view name,
                               const std::vector<std::string_view>& candidates);

// Text read from a file (a tensor name, a key), made safe to echo in a message: quoted, every
// byte outside printable ASCII (control characters, terminal escape sequences, DEL, non-ASCII) and
// the backslash shown as \xNN, and cut after max_shown_bytes so that an error stays one line.
std::string printable(std::string_view text, size_t max_shown_bytes = 120);

// The offset of the first byte that shows `text` is not a text file (a NUL byte, or bytes that
// are not UTF-8), or std::string_view::npos when it may be text.
size_t first_binary_byte(std::string_view text);

}  // namespace moetron
