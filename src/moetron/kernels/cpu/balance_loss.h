// DeepSeek-V3's sequence-wise balance loss (its report, eq. 17-20), per sequence of T tokens with
// router scores s (N, E) and chosen experts topk_ids (N, K):
//   f_i = E / (K T) sum_t 1[i in topk(t)],  s'_{i,t} = s_{i,t} / sum_j s_{j,t},
//   P_i = (1/T) sum_t s'_{i,t},  L_b = sum_i f_i P_i
// (the caller weighs it by alpha and averages over the B sequences). Its gradient reaches s
// through P only: f counts selections, which are piecewise constant.
#pragma once

#include <cstdint>

namespace moetron::cpu {

// load_fraction (B, E) written: f of each sequence. Returns sum over the B sequences of L_b (the
// caller multiplies by alpha / B). Ids in topk_ids are in [0, E).
double balance_loss_forward(float* load_fraction, const int32_t* topk_ids, const float* scores,
                            int64_t batch, int64_t seq_len, int64_t num_experts, int64_t top_k);
// d_scores (N, E) written: the gradient of loss_grad * (1/B) sum_b L_b with respect to s, from
// the forward's load_fraction: (loss_grad / (B T)) (f_j / Z_t - sum_i f_i s_{i,t} / Z_t^2), Z_t =
// sum_j s_{j,t}.
void balance_loss_backward(float* d_scores, const float* scores, const float* load_fraction,
                           int64_t batch, int64_t seq_len, int64_t num_experts, float loss_grad);

}  // namespace moetron::cpu
