#include "moetron/parallel/layout.h"

#include <fmt/format.h>

#include <array>
#include <charconv>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron::parallel {

std::string Layout::str() const {
    std::string s = fmt::format("tp{}.ep{}.pp{}.cp{}", tp, ep, pp, cp);
    if (dp > 0) s += fmt::format(".dp{}", dp);
    return s;
}

Layout parse_layout(std::string_view text) {
    Layout layout;
    struct Dimension {
        std::string_view name;
        int* size;
        bool seen = false;
    };
    std::array<Dimension, 5> dims{{{"tp", &layout.tp},
                                   {"ep", &layout.ep},
                                   {"pp", &layout.pp},
                                   {"cp", &layout.cp},
                                   {"dp", &layout.dp}}};
    if (text.empty()) return layout;

    size_t begin = 0;
    while (begin <= text.size()) {
        const size_t end = std::min(text.find('.', begin), text.size());
        const std::string_view token = text.substr(begin, end - begin);
        MT_USER_CHECK(!token.empty(),
                      "[layout] empty token in layout '{}' (two dots, or a dot at an end)", text);
        size_t digits = 0;
        while (digits < token.size() && !(token[digits] >= '0' && token[digits] <= '9')) ++digits;
        const std::string_view name = token.substr(0, digits);
        const std::string_view number = token.substr(digits);

        Dimension* dim = nullptr;
        for (auto& d : dims)
            if (d.name == name) dim = &d;
        MT_USER_CHECK(
            dim != nullptr,
            "[layout] unknown dimension '{}' in token '{}' of layout '{}': expected tp, ep, "
            "pp, cp or dp followed by a size, as in tp2.ep4",
            name, token, text);
        MT_USER_CHECK(!dim->seen, "[layout] '{}' appears twice in layout '{}'", name, text);
        MT_USER_CHECK(!number.empty(), "[layout] token '{}' of layout '{}' has no size (write {}2)",
                      token, text, name);
        int value = 0;
        const auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
        MT_USER_CHECK(ec == std::errc() && ptr == number.data() + number.size() && value > 0,
                      "[layout] size '{}' of '{}' in layout '{}' is not a positive integer", number,
                      name, text);
        *dim->size = value;
        dim->seen = true;
        begin = end + 1;
    }
    return layout;
}

}  // namespace moetron::parallel
