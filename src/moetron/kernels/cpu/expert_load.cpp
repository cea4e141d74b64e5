// Expert loads: a few thousand ids and at most 1024 experts per layer, serial (a parallel
// histogram would cost more than it saves).
#include "moetron/kernels/cpu/expert_load.h"

namespace moetron::cpu {

void count_expert_load(int64_t* counts, const int32_t* topk_ids, int64_t num_ids,
                       int64_t /*num_experts*/) {
    for (int64_t i = 0; i < num_ids; ++i) ++counts[topk_ids[i]];
}

void router_bias_update(float* bias, const int64_t* counts, int64_t num_experts, float gamma) {
    int64_t total = 0;
    for (int64_t e = 0; e < num_experts; ++e) total += counts[e];
    const double mean = static_cast<double>(total) / static_cast<double>(num_experts);
    for (int64_t e = 0; e < num_experts; ++e) {
        const double gap = mean - static_cast<double>(counts[e]);
        bias[e] += gamma * static_cast<float>((gap > 0) - (gap < 0));
    }
}

}  // namespace moetron::cpu
