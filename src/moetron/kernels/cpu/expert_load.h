// The expert loads behind DeepSeek-V3's auxiliary-loss-free balancing (its report, sec. 2.1.2):
// count how many token copies each expert received, and after the optimizer step move each
// expert's correction bias towards the mean load.
#pragma once

#include <cstdint>

namespace moetron::cpu {

// counts (E) += how many of the num_ids ids in topk_ids name each expert (ids in [0, E)).
void count_expert_load(int64_t* counts, const int32_t* topk_ids, int64_t num_ids,
                       int64_t num_experts);
// bias (E) += gamma * sign(mean load - counts[e]): overloaded experts (above the mean of counts)
// lose gamma, underloaded ones gain it, those exactly at the mean keep their bias.
void router_bias_update(float* bias, const int64_t* counts, int64_t num_experts, float gamma);

}  // namespace moetron::cpu
