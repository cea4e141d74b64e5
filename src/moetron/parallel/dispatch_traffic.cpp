#include "moetron/parallel/dispatch_traffic.h"

#include <algorithm>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/cpu/quantize.h"

namespace moetron::parallel {

DispatchPayload parse_dispatch_payload(std::string_view name) {
    if (name == "activation") return DispatchPayload::activation;
    if (name == "recipe") return DispatchPayload::recipe;
    if (name == "fp32")
        MT_USER_THROW(
            "dispatch payload 'fp32' is now spelled 'activation' (the tokens as the activations "
            "are: float32 in the engine)");
    MT_USER_THROW("unknown dispatch payload '{}'; use activation or recipe", name);
}

std::string_view dispatch_payload_name(DispatchPayload payload) {
    return payload == DispatchPayload::recipe ? "recipe" : "activation";
}

Precision engine_token_format(DispatchPayload payload, Precision recipe) {
    return payload == DispatchPayload::recipe ? recipe : Precision::fp32;
}

double payload_bytes_per_element(Precision format) {
    switch (format) {
        case Precision::fp32:
            return 4;
        case Precision::bf16:
            return 2;
        case Precision::mxfp8:
            return 1 + 1.0 / 32;  // E4M3 element + an E8M0 byte per 32
        case Precision::fp8_blockwise:
            return 1 + 4.0 / 128;  // E4M3 element + a float32 scale per 128
        case Precision::nvfp4:
            break;  // no engine payload: the cluster model prices its own
    }
    require_engine_recipe(format);
    MT_THROW("[dispatch] unknown payload format {}", static_cast<int>(format));
}

int64_t payload_row_bytes(Precision format, int64_t hidden) {
    switch (format) {
        case Precision::fp32:
            return 4 * hidden;
        case Precision::bf16:
            return 2 * hidden;
        case Precision::mxfp8:
            return hidden + cpu::blocks_covering(hidden, cpu::kMxfp8BlockSize);  // + E8M0 scales
        case Precision::fp8_blockwise:
            return hidden +
                   4 * cpu::blocks_covering(hidden, cpu::kDeepSeekTileSize);  // + f32 scales
        case Precision::nvfp4:
            break;
    }
    require_engine_recipe(format);
    MT_THROW("[dispatch] unknown payload format {}", static_cast<int>(format));
}

TierRows dispatch_rows(DispatchKind kind, const DispatchFanout& f) {
    if (kind == DispatchKind::flat) return {f.own_domain_ranks, f.other_domain_ranks};
    return {f.own_domain_ranks + f.other_domain_ranks - f.other_domain_landings, f.other_domains};
}

DispatchFanout count_dispatch_fanout(std::span<const int32_t> topk_ids, int64_t top_k,
                                     int64_t experts_per_rank, int64_t ranks_per_domain,
                                     int64_t self_rank) {
    MT_CHECK(top_k >= 1 && experts_per_rank >= 1 && ranks_per_domain >= 1 && self_rank >= 0 &&
                 topk_ids.size() % static_cast<size_t>(top_k) == 0,
             "[dispatch] fanout of {} ids with top_k {}, {} experts per rank, {} ranks per domain, "
             "rank {}",
             topk_ids.size(), top_k, experts_per_rank, ranks_per_domain, self_rank);
    const int64_t own_domain = self_rank / ranks_per_domain;
    const int64_t local_index = self_rank % ranks_per_domain;
    DispatchFanout f;
    std::vector<int64_t> ranks(static_cast<size_t>(top_k));
    for (size_t first = 0; first < topk_ids.size(); first += static_cast<size_t>(top_k)) {
        for (int64_t j = 0; j < top_k; ++j)
            ranks[static_cast<size_t>(j)] =
                topk_ids[first + static_cast<size_t>(j)] / experts_per_rank;
        std::sort(ranks.begin(), ranks.end());
        ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
        int64_t last_domain = -1;
        for (const int64_t rank : ranks) {
            const int64_t domain = rank / ranks_per_domain;
            if (domain == own_domain) {
                f.own_domain_ranks += rank != self_rank;
                continue;
            }
            f.other_domain_ranks += 1;
            f.other_domains += domain != last_domain;  // ranks ascend: a domain's are adjacent
            f.other_domain_landings += rank % ranks_per_domain == local_index;
            last_domain = domain;
        }
        ranks.resize(static_cast<size_t>(top_k));
    }
    return f;
}

}  // namespace moetron::parallel
