#include "moetron/core/strings.h"

#include <fmt/format.h>

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

namespace {

// The length of the valid UTF-8 sequence starting at text[i] (2 to 4), or 0 when there is none
// (ASCII is handled by the callers).
size_t utf8_sequence_length(std::string_view text, size_t i) {
    const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
    const unsigned char lead = byte(i);
    size_t length = 0;
    if (lead >= 0xC2 && lead <= 0xDF)
        length = 2;
    else if (lead >= 0xE0 && lead <= 0xEF)
        length = 3;
    else if (lead >= 0xF0 && lead <= 0xF4)
        length = 4;
    else
        return 0;
    if (i + length > text.size()) return 0;
    for (size_t k = 1; k < length; ++k)
        if ((byte(i + k) & 0xC0) != 0x80) return 0;
    // Overlong forms, UTF-16 surrogates and code points above U+10FFFF.
    if (lead == 0xE0 && byte(i + 1) < 0xA0) return 0;
    if (lead == 0xED && byte(i + 1) > 0x9F) return 0;
    if (lead == 0xF0 && byte(i + 1) < 0x90) return 0;
    if (lead == 0xF4 && byte(i + 1) > 0x8F) return 0;
    return length;
}

}  // namespace

std::string printable(std::string_view text, size_t max_shown_bytes) {
    std::string out = "'";
    for (size_t i = 0; i < text.size() && i < max_shown_bytes; ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c >= 0x20 && c < 0x7f && c != '\\')
            out += static_cast<char>(c);
        else
            out += fmt::format("\\x{:02x}", c);
    }
    out += "'";
    if (text.size() > max_shown_bytes) out += fmt::format(" (cut, {} bytes in all)", text.size());
    return out;
}

size_t first_binary_byte(std::string_view text) {
    for (size_t i = 0; i < text.size();) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c == 0) return i;
        if (c < 0x80) {
            ++i;
            continue;
        }
        const size_t n = utf8_sequence_length(text, i);
        if (n == 0) return i;
        i += n;
    }
    return std::string_view::npos;
}

}  // namespace moetron
