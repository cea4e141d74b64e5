// What one expert dispatch sends between ranks, by tier, counted the way the dispatchers send it
// (dispatch_stage.h): a token's row travels once to each rank that holds at least one of its
// experts (flat), or once over the rail to each other domain that does and then once inside each
// domain to each such rank (two-tier); combine sends the same rows back. One formula for the
// engine, which counts a concrete routing (count_dispatch_fanout), and for the cluster model,
// which feeds it the expected fanout of its routing model (sim/routing.h).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "moetron/core/precision.h"

namespace moetron::parallel {

// How tokens cross the EP group (--dispatch): once per destination rank (flat), or once per
// destination domain over the rail and then inside the domain (two_tier).
enum class DispatchKind { flat, two_tier };

// What a dispatched token travels as (--dispatch-payload, for the engine and the cluster model
// alike): as the activations are (activation: the engine's float32; bf16 on the GPUs the cluster
// model prices, float32 under its fp32 recipe), quantized at the experts' GEMM; or already in the
// recipe's GEMM format (recipe: quantized before the send, dispatch_payload.h, so that the
// experts consume it as it arrives, as DeepSeek-V3 dispatches FP8). The combine and every
// gradient travel as activations either way.
enum class DispatchPayload : uint8_t { activation, recipe };
// "activation" | "recipe"; a user error otherwise (train's old "fp32" names "activation").
DispatchPayload parse_dispatch_payload(std::string_view name);
std::string_view dispatch_payload_name(DispatchPayload payload);
// The format the engine's dispatcher sends under `recipe` (MoeSettings::token_format): the
// recipe's with DispatchPayload::recipe, else float32 (the engine's activations).
Precision engine_token_format(DispatchPayload payload, Precision recipe);

// Where one token's experts are, seen from the rank that dispatches it (summed over tokens when
// counted, or expected per token): the ranks holding at least one of them.
struct DispatchFanout {
    double own_domain_ranks = 0;    // in the token's own domain, its own rank excluded
    double other_domain_ranks = 0;  // in other domains
    double other_domains = 0;       // other domains with at least one such rank
    // Of those domains, the ones whose rank with the token's local index holds one: the two-tier
    // dispatch lands there over the rail and needs no NVLink hop for that rank.
    double other_domain_landings = 0;
};

// Rows one rank sends to other ranks in one dispatch (or one combine), by tier.
struct TierRows {
    double intra_domain = 0;  // over the scale-up tier (NVLink)
    double inter_domain = 0;  // over the scale-out tier (NIC)
};

// Flat: a row to every rank holding an expert (own domain: intra, others: inter). Two-tier: a row
// to every other domain holding one (inter), then inside each domain to every holding rank but
// the one it landed on (intra).
TierRows dispatch_rows(DispatchKind kind, const DispatchFanout& fanout);

// The fanout of a concrete routing, summed over its tokens: topk_ids (num_tokens x top_k global
// expert ids) dispatched by rank self_rank of an EP group whose experts sit experts_per_rank per
// rank in order and whose ranks sit ranks_per_domain per domain in order.
DispatchFanout count_dispatch_fanout(std::span<const int32_t> topk_ids, int64_t top_k,
                                     int64_t experts_per_rank, int64_t ranks_per_domain,
                                     int64_t self_rank);

// A dispatched token's hidden row travels in one of the recipes' formats (core/precision.h).
// Bytes per hidden element of a dispatched row, scales included: float32 4, bfloat16 2, MXFP8 one
// E4M3 byte per element plus one E8M0 scale byte per 32 elements, DeepSeek-V3's FP8 one byte per
// element plus a float32 scale per 1 x 128 tile (both 1 + 1/32). The one definition of the
// engine's low-precision formats (kernels/cpu/quantize.h) and the cluster model's dispatch bytes.
double payload_bytes_per_element(Precision format);

// Bytes of one hidden row of `hidden` elements as it travels (dispatch_payload.h): the elements,
// then the scales of its blocks, a partial last block counted whole. Equal to
// payload_bytes_per_element(format) * hidden when the blocks divide the row (32 for MXFP8, 128
// for DeepSeek-V3's FP8).
int64_t payload_row_bytes(Precision format, int64_t hidden);

}  // namespace moetron::parallel
