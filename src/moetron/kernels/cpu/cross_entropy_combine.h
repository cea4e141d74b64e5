// The last steps of the vocabulary-parallel cross-entropy (cross_entropy.h, "Vocabulary-parallel
// parts"), once the caller has gathered every part's row maxima and summed the parts' sums over
// the ranks: the global row maxima, then the losses.
#pragma once

#include <cstdint>

#include "moetron/kernels/op_types.h"

namespace moetron::cpu {

// row_max (N) written: the max over the P parts of part_max (P, N), part by part.
void cross_entropy_combine_max(float* row_max, const float* part_max, int64_t num_parts,
                               int64_t num_tokens);
// lse (N) written: row_max + log(sum_exp); losses (N) written: lse - target_logit, 0 for ignored
// targets. Returns their sum and the valid count, summed serially in double (as
// cross_entropy_forward). sum_exp and target_logit (N) are the sums over every part.
CrossEntropyResult cross_entropy_combine_losses(float* losses, float* lse, const double* sum_exp,
                                                const double* target_logit, const float* row_max,
                                                const int32_t* targets, int64_t num_tokens,
                                                int32_t ignore_index);

}  // namespace moetron::cpu
