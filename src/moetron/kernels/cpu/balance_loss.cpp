// Sequence-wise balance loss: OpenMP over sequences (forward) and tokens (backward), sums in
// double.
#include "moetron/kernels/cpu/balance_loss.h"

namespace moetron::cpu {

namespace {

// Per token: Z_t = sum_j s_{j,t} and sum_i f_i s_{i,t}, the two sums eq. 19-20 need.
struct TokenBalanceSums {
    double score_sum = 0;
    double weighted_score_sum = 0;
};

TokenBalanceSums token_balance_sums(const float* scores, const float* load_fraction,
                                    int64_t num_experts) {
    TokenBalanceSums s;
    for (int64_t i = 0; i < num_experts; ++i) {
        s.score_sum += scores[i];
        s.weighted_score_sum += static_cast<double>(load_fraction[i]) * scores[i];
    }
    return s;
}

}  // namespace

double balance_loss_forward(float* load_fraction, const int32_t* topk_ids, const float* scores,
                            int64_t batch, int64_t seq_len, int64_t num_experts, int64_t top_k) {
    const int64_t E = num_experts, K = top_k;
    const double count_to_fraction =
        static_cast<double>(E) / (static_cast<double>(K) * static_cast<double>(seq_len));
    double loss_sum = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : loss_sum)
    for (int64_t b = 0; b < batch; ++b) {
        float* f = load_fraction + b * E;
        for (int64_t i = 0; i < E; ++i) f[i] = 0.0f;
        const int64_t first = b * seq_len;
        for (int64_t t = first; t < first + seq_len; ++t)
            for (int64_t j = 0; j < K; ++j) f[topk_ids[t * K + j]] += 1.0f;
        for (int64_t i = 0; i < E; ++i) f[i] = static_cast<float>(f[i] * count_to_fraction);
        // sum_i f_i P_i = (1/T) sum_t (sum_i f_i s_{i,t}) / Z_t
        double sequence_sum = 0.0;
        for (int64_t t = first; t < first + seq_len; ++t) {
            const TokenBalanceSums s = token_balance_sums(scores + t * E, f, E);
            sequence_sum += s.weighted_score_sum / s.score_sum;
        }
        loss_sum += sequence_sum / static_cast<double>(seq_len);
    }
    return loss_sum;
}

void balance_loss_backward(float* d_scores, const float* scores, const float* load_fraction,
                           int64_t batch, int64_t seq_len, int64_t num_experts, float loss_grad) {
    const int64_t E = num_experts, n = batch * seq_len;
    const double coeff = static_cast<double>(loss_grad) /
                         (static_cast<double>(batch) * static_cast<double>(seq_len));
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
        const float* f = load_fraction + (t / seq_len) * E;
        const float* s = scores + t * E;
        const TokenBalanceSums sums = token_balance_sums(s, f, E);
        const double inv_z = 1.0 / sums.score_sum;
        const double common = sums.weighted_score_sum * inv_z * inv_z;
        float* ds = d_scores + t * E;
        for (int64_t j = 0; j < E; ++j) ds[j] = static_cast<float>(coeff * (f[j] * inv_z - common));
    }
}

}  // namespace moetron::cpu
