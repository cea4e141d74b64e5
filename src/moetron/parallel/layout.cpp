#include "moetron/parallel/layout.h"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <initializer_list>

#include "moetron/core/user_error.h"

namespace moetron::parallel {

std::string Layout::str() const {
    std::string s = fmt::format("tp{}.pp{}.vpp{}.ep{}.cp{}", tp, pp, vpp, ep, cp);
    if (dp > 0) s += fmt::format(".dp{}", dp);
    return s;
}

Layout parse_layout(std::string_view text) {
    Layout layout;
    struct Dimension {
        std::string_view name;
        int64_t* size;
        bool seen = false;
    };
    std::array<Dimension, 6> dims{{{"tp", &layout.tp},
                                   {"pp", &layout.pp},
                                   {"vpp", &layout.vpp},
                                   {"ep", &layout.ep},
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
            "[layout] unknown dimension '{}' in token '{}' of layout '{}': expected tp, pp, vpp, "
            "ep, cp or dp followed by a size, as in tp2.ep4",
            name, token, text);
        MT_USER_CHECK(!dim->seen, "[layout] '{}' appears twice in layout '{}'", name, text);
        MT_USER_CHECK(!number.empty(), "[layout] token '{}' of layout '{}' has no size (write {}2)",
                      token, text, name);
        // Sizes stay below 2^31 so that every product of a resolved layout's sizes (each at most
        // the world) fits the int ranks of the engine's topology.
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

Layout resolve_layout(const Layout& layout, int64_t world_size) {
    MT_USER_CHECK(world_size >= 1, "[layout] the world size (ranks or GPUs) must be >= 1, got {}",
                  world_size);
    MT_USER_CHECK(layout.tp >= 1 && layout.pp >= 1 && layout.vpp >= 1 && layout.ep >= 1 &&
                      layout.cp >= 1 && layout.dp >= 0,
                  "[layout] sizes must be positive in layout {}", layout.str());
    MT_USER_CHECK(layout.vpp == 1 || layout.pp > 1,
                  "[layout] layout {}: vpp {} needs pp > 1 (virtual stages split a pipeline)",
                  layout.str(), layout.vpp);
    Layout l = layout;
    // Each size is below 2^31 (parse_layout), but a product of three may not fit 64 bits.
    const auto product = [&](std::initializer_list<int64_t> sizes) {
        int64_t p = 1;
        for (const int64_t size : sizes)
            MT_USER_CHECK(!__builtin_mul_overflow(p, size, &p),
                          "[layout] layout {}: the sizes multiply to more than any world",
                          layout.str());
        return p;
    };
    const int64_t model_parallel = product({l.tp, l.cp, l.pp});
    MT_USER_CHECK(world_size % model_parallel == 0,
                  "[layout] the world of {} ranks is not divisible by tp*cp*pp = {}*{}*{} = {}",
                  world_size, l.tp, l.cp, l.pp, model_parallel);
    MT_USER_CHECK(world_size % product({l.ep, l.pp}) == 0,
                  "[layout] expert side: the world of {} ranks is not divisible by ep*pp = {}*{} "
                  "= {} (the ranks of a pipeline stage must hold whole expert groups)",
                  world_size, l.ep, l.pp, l.ep * l.pp);
    l.dp = world_size / model_parallel;
    if (layout.dp != 0 && layout.dp != l.dp) {
        const int64_t edp = world_size / (l.ep * l.pp);
        // The one spelling that used to mean something else: dp counting the expert side.
        MT_USER_CHECK(
            !(layout.dp == edp && l.ep > 1),
            "[layout] layout {} on {} ranks: dp counts the attention side's data-parallel "
            "replicas, world/(tp*cp*pp) = {}, as Megatron-LM's data-parallel size does; dp{} is "
            "the expert side's replicas (edp = world/(ep*pp) = {}), which follows from ep. Write "
            "dp{} or leave dp out",
            layout.str(), world_size, l.dp, layout.dp, edp, l.dp);
        MT_USER_THROW(
            "[layout] layout {} does not fit a world of {} ranks: dp{} needs dp*tp*cp*pp = {} "
            "ranks, but world/(tp*cp*pp) = {}; write dp{} or leave dp out (it is what remains)",
            layout.str(), world_size, layout.dp, product({layout.dp, model_parallel}), l.dp, l.dp);
    }
    return l;
}

Layout parse_layout(std::string_view text, int64_t world_size) {
    return resolve_layout(parse_layout(text), world_size);
}

}  // namespace moetron::parallel
