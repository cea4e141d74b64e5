// Combining the vocabulary parts: a pass over N tokens each, serial (the loss sum's order is
// fixed so that it matches cross_entropy_forward's).
#include "moetron/kernels/cpu/cross_entropy_combine.h"

#include <algorithm>
#include <cmath>

namespace moetron::cpu {

void cross_entropy_combine_max(float* row_max, const float* part_max, int64_t num_parts,
                               int64_t num_tokens) {
    for (int64_t t = 0; t < num_tokens; ++t) {
        float m = part_max[t];
        for (int64_t r = 1; r < num_parts; ++r) m = std::max(m, part_max[r * num_tokens + t]);
        row_max[t] = m;
    }
}

CrossEntropyResult cross_entropy_combine_losses(float* losses, float* lse, const double* sum_exp,
                                                const double* target_logit, const float* row_max,
                                                const int32_t* targets, int64_t num_tokens,
                                                int32_t ignore_index) {
    CrossEntropyResult result{0.0, 0};
    for (int64_t t = 0; t < num_tokens; ++t) {
        lse[t] = row_max[t] + static_cast<float>(std::log(sum_exp[t]));
        const bool valid = targets[t] != ignore_index;
        losses[t] = valid ? lse[t] - static_cast<float>(target_logit[t]) : 0.0f;
        result.num_valid += valid;
        result.loss_sum += losses[t];
    }
    return result;
}

}  // namespace moetron::cpu
