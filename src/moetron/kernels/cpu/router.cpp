// DeepSeek-V3 routing ("noaux_tc" top-k method, DeepSeek-V3 report sec. 2.1.2 and the Hugging
// Face DeepseekV3TopkRouter): sigmoid scores, bias-corrected selection, group-limited top-k.
#include "moetron/kernels/cpu/router.h"

#include <cmath>
#include <limits>

#include "moetron/core/error.h"

namespace moetron::cpu {
namespace {

// Per-token scratch lives on the stack (kernels never allocate): E floats of `choice` plus G
// group scores. DeepSeek-V3 has E = 256, so this bound leaves ample room.
constexpr int64_t kMaxExperts = 1024;

void check_router_shape(const RouterShape& shape) {
    MT_CHECK(shape.num_tokens >= 0, "[router] num_tokens must be >= 0, got {}", shape.num_tokens);
    MT_CHECK(shape.num_experts >= 1 && shape.num_experts <= kMaxExperts,
             "[router] n_routed_experts must be in [1, {}], got {}", kMaxExperts,
             shape.num_experts);
    MT_CHECK(shape.num_groups >= 1 && shape.num_experts % shape.num_groups == 0,
             "[router] n_routed_experts ({}) must be a positive multiple of n_group ({})",
             shape.num_experts, shape.num_groups);
    MT_CHECK(shape.topk_groups >= 1 && shape.topk_groups <= shape.num_groups,
             "[router] topk_group ({}) must be in [1, n_group = {}]", shape.topk_groups,
             shape.num_groups);
    const int64_t eligible_experts = shape.topk_groups * (shape.num_experts / shape.num_groups);
    MT_CHECK(shape.top_k >= 1 && shape.top_k <= eligible_experts,
             "[router] num_experts_per_tok ({}) must be in [1, topk_group * n_routed_experts / "
             "n_group = {} * {} / {} = {}]",
             shape.top_k, shape.topk_groups, shape.num_experts, shape.num_groups, eligible_experts);
}

float sigmoid(float x) {
    return 1.0f / (1.0f + std::exp(-x));
}

// Offers candidate `index` with `value` to a list kept sorted by descending value, holding `count`
// of at most `capacity` entries. Candidates arrive in increasing index order and only a strictly
// larger value moves ahead, so ties keep the lower index first. A NaN value is appended while the
// list has room, so the list always fills: the output holds valid, distinct ids even for bad input
// (the NaN then shows in the weights instead of as an out-of-range id).
void offer_top(int32_t* ids, float* values, int64_t& count, int64_t capacity, int32_t index,
               float value) {
    if (count == capacity) {
        if (!(value > values[count - 1])) return;
        --count;  // the current last entry drops out
    }
    int64_t pos = count;
    while (pos > 0 && value > values[pos - 1]) {
        ids[pos] = ids[pos - 1];
        values[pos] = values[pos - 1];
        --pos;
    }
    ids[pos] = index;
    values[pos] = value;
    ++count;
}

}  // namespace

void router_forward(int32_t* topk_ids, float* topk_weights, float* scores, const float* logits,
                    const float* bias, const RouterShape& shape) {
    check_router_shape(shape);
    const int64_t E = shape.num_experts, K = shape.top_k, G = shape.num_groups;
    const int64_t experts_per_group = E / G;
    // HF takes the top-2 of each group; a group of one expert has only its own value.
    const int64_t values_per_group_score = experts_per_group < 2 ? experts_per_group : 2;

#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < shape.num_tokens; ++t) {
        const float* logit_row = logits + t * E;
        float* score_row = scores + t * E;
        int32_t* id_row = topk_ids + t * K;
        float* weight_row = topk_weights + t * K;

        // s = sigmoid(logits) (scoring_func = "sigmoid"); choice = s + b
        // (e_score_correction_bias: steers selection toward balance, never enters the weights).
        float choice[kMaxExperts];
        for (int64_t e = 0; e < E; ++e) {
            score_row[e] = sigmoid(logit_row[e]);
            choice[e] = score_row[e] + (bias ? bias[e] : 0.0f);
        }

        // Group score = sum of the top-2 choices in the group; keep the topk_group best groups
        // (node-limited routing: a token reaches at most topk_group groups of devices).
        int32_t kept_group_ids[kMaxExperts];
        float kept_group_scores[kMaxExperts];
        int64_t num_kept_groups = 0;
        for (int64_t g = 0; g < G; ++g) {
            int32_t unused_ids[2];
            float top_values[2];
            int64_t num_top = 0;
            for (int64_t e = g * experts_per_group; e < (g + 1) * experts_per_group; ++e)
                offer_top(unused_ids, top_values, num_top, values_per_group_score,
                          static_cast<int32_t>(e), choice[e]);
            float group_score = 0.0f;
            for (int64_t i = 0; i < num_top; ++i) group_score += top_values[i];
            offer_top(kept_group_ids, kept_group_scores, num_kept_groups, shape.topk_groups,
                      static_cast<int32_t>(g), group_score);
        }
        bool group_is_kept[kMaxExperts] = {};
        for (int64_t i = 0; i < num_kept_groups; ++i) group_is_kept[kept_group_ids[i]] = true;

        // Top-K of choice among the experts of the kept groups. Experts outside them are excluded
        // outright (as if their choice were -inf). Hugging Face instead masks them to 0.0, which
        // differs only when some s + b < 0 inside the kept groups: HF could then pick an expert
        // from a dropped group, breaking the topk_group limit the dispatcher relies on.
        float chosen_values[kMaxExperts];
        int64_t num_chosen = 0;
        for (int64_t e = 0; e < E; ++e) {
            if (!group_is_kept[e / experts_per_group]) continue;
            offer_top(id_row, chosen_values, num_chosen, K, static_cast<int32_t>(e), choice[e]);
        }

        // Weights from the unbiased scores; normalized with HF's 1e-20 guard, then scaled by
        // routed_scaling_factor (2.5 in DeepSeek-V3).
        float score_sum = 0.0f;
        for (int64_t j = 0; j < K; ++j) {
            weight_row[j] = score_row[id_row[j]];
            score_sum += weight_row[j];
        }
        // Divide, then scale, in HF's order so the rounding matches the PyTorch reference.
        for (int64_t j = 0; j < K; ++j) {
            if (shape.norm_topk_prob) weight_row[j] /= score_sum + 1e-20f;
            weight_row[j] *= shape.routed_scaling_factor;
        }
    }
}

void router_backward(float* dlogits, const float* dtopk_weights, const float* dscores_extra,
                     const float* scores, const int32_t* topk_ids, const RouterShape& shape) {
    check_router_shape(shape);
    const int64_t E = shape.num_experts, K = shape.top_k;
    // Checked before the parallel loop: an exception must not leave an OpenMP region.
    for (int64_t i = 0; i < shape.num_tokens * K; ++i)
        MT_CHECK(topk_ids[i] >= 0 && topk_ids[i] < E,
                 "[router] topk_ids[{}] = {} is outside [0, n_routed_experts = {})", i, topk_ids[i],
                 E);

#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < shape.num_tokens; ++t) {
        const float* score_row = scores + t * E;
        const float* dweight_row = dtopk_weights + t * K;
        const int32_t* id_row = topk_ids + t * K;
        float* dlogit_row = dlogits + t * E;

        // Start from the extra score gradient (balance loss); the selection has no gradient.
        for (int64_t e = 0; e < E; ++e)
            dlogit_row[e] = dscores_extra ? dscores_extra[t * E + e] : 0;

        // w_j = c * s_j / D with D = sum_k s_k + 1e-20 (or w_j = c * s_j without normalization):
        //   dL/ds_i = (c / D) * (dw_i - sum_j dw_j s_j / D)
        const float c = shape.routed_scaling_factor;
        if (shape.norm_topk_prob) {
            float score_sum = 0.0f, weighted_dw = 0.0f;
            for (int64_t j = 0; j < K; ++j) {
                score_sum += score_row[id_row[j]];
                weighted_dw += dweight_row[j] * score_row[id_row[j]];
            }
            const float denom = score_sum + 1e-20f;
            for (int64_t j = 0; j < K; ++j)
                dlogit_row[id_row[j]] += c / denom * (dweight_row[j] - weighted_dw / denom);
        } else {
            for (int64_t j = 0; j < K; ++j) dlogit_row[id_row[j]] += c * dweight_row[j];
        }

        // Through the sigmoid: ds/dlogit = s (1 - s).
        for (int64_t e = 0; e < E; ++e) dlogit_row[e] *= score_row[e] * (1.0f - score_row[e]);
    }
}

}  // namespace moetron::cpu
