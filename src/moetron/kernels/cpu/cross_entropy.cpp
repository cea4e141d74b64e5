// Cross-entropy with the softmax fused in, max-subtracted for stability:
//   lse_t = m_t + log sum_v exp(logits[t, v] - m_t),  m_t = max_v logits[t, v]
//   loss_t = lse_t - logits[t, y_t]
//   dlogits[t, v] = (exp(logits[t, v] - lse_t) - [v == y_t]) * dloss_per_token
// The exponentials, one per logit, are exp_vectorizable (vector_exp.h): with std::exp, which does
// not vectorize, they were nearly all of the kernel's time (4 ns per logit on one core).
#include "moetron/kernels/cpu/cross_entropy.h"

#include <cmath>
#include <cstring>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/vector_exp.h"

namespace moetron::cpu {
namespace {

// Serial, before any parallel region (an exception must not leave an OpenMP region). Returns the
// number of valid targets.
int64_t check_targets(const int32_t* targets, int64_t num_tokens, int64_t vocab_size,
                      int32_t ignore_index) {
    MT_CHECK(num_tokens >= 0 && vocab_size >= 1,
             "[cross_entropy] need num_tokens >= 0 and vocab_size >= 1, got {} and {}", num_tokens,
             vocab_size);
    int64_t num_valid = 0;
    for (int64_t t = 0; t < num_tokens; ++t) {
        if (targets[t] == ignore_index) continue;
        MT_CHECK(targets[t] >= 0 && targets[t] < vocab_size,
                 "[cross_entropy] target {} at position {} is outside the vocabulary [0, "
                 "vocab_size = {}) and is not ignore_index ({})",
                 targets[t], t, vocab_size, ignore_index);
        ++num_valid;
    }
    return num_valid;
}

}  // namespace

CrossEntropyResult cross_entropy_forward(float* losses, float* lse, const float* logits,
                                         const int32_t* targets, int64_t num_tokens,
                                         int64_t vocab_size, int32_t ignore_index) {
    const int64_t num_valid = check_targets(targets, num_tokens, vocab_size, ignore_index);
    const int64_t V = vocab_size;

#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
        const float* row = logits + t * V;
        float row_max = row[0];
#pragma omp simd reduction(max : row_max)
        for (int64_t v = 1; v < V; ++v) row_max = row[v] > row_max ? row[v] : row_max;
        // Double accumulation: V is ~1e5 terms, and lse feeds both the loss and the gradient.
        double sum_exp = 0.0;
#pragma omp simd reduction(+ : sum_exp)
        for (int64_t v = 0; v < V; ++v) sum_exp += exp_vectorizable(row[v] - row_max);
        lse[t] = row_max + static_cast<float>(std::log(sum_exp));
        losses[t] = targets[t] == ignore_index ? 0.0f : lse[t] - row[targets[t]];
    }

    // Summed serially in double so the total does not depend on the thread count.
    CrossEntropyResult result{0.0, num_valid};
    for (int64_t t = 0; t < num_tokens; ++t) result.loss_sum += losses[t];
    return result;
}

void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, int64_t num_tokens, int64_t vocab_size,
                            int32_t ignore_index, float dloss_per_token) {
    check_targets(targets, num_tokens, vocab_size, ignore_index);
    cross_entropy_part_backward(dlogits, logits, lse, targets, num_tokens, vocab_size, 0,
                                ignore_index, dloss_per_token);
}

void cross_entropy_part_max(float* row_max, const float* logits, int64_t num_tokens,
                            int64_t part_vocab) {
    const int64_t V = part_vocab;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
        const float* row = logits + t * V;
        float m = row[0];
#pragma omp simd reduction(max : m)
        for (int64_t v = 1; v < V; ++v) m = row[v] > m ? row[v] : m;
        row_max[t] = m;
    }
}

void cross_entropy_part_sums(double* sum_exp, double* target_logit, const float* logits,
                             const float* row_max, const int32_t* targets, int64_t num_tokens,
                             int64_t part_vocab, int64_t vocab_first, int32_t ignore_index) {
    const int64_t V = part_vocab;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
        const float* row = logits + t * V;
        const float m = row_max[t];
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int64_t v = 0; v < V; ++v) sum += exp_vectorizable(row[v] - m);
        sum_exp[t] = sum;
        const int64_t local = static_cast<int64_t>(targets[t]) - vocab_first;
        const bool here = targets[t] != ignore_index && local >= 0 && local < V;
        target_logit[t] = here ? row[local] : 0.0;
    }
}

// Elementwise in v, so dlogits may alias logits (each element is read before it is written).
void cross_entropy_part_backward(float* dlogits, const float* logits, const float* lse,
                                 const int32_t* targets, int64_t num_tokens, int64_t part_vocab,
                                 int64_t vocab_first, int32_t ignore_index, float dloss_per_token) {
    const int64_t V = part_vocab;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
        float* drow = dlogits + t * V;
        if (targets[t] == ignore_index) {
            std::memset(drow, 0, static_cast<size_t>(V) * sizeof(float));
            continue;
        }
        const float* row = logits + t * V;
        const float row_lse = lse[t];
#pragma omp simd
        for (int64_t v = 0; v < V; ++v) {
            drow[v] = exp_vectorizable(row[v] - row_lse) * dloss_per_token;
        }
        const int64_t local = static_cast<int64_t>(targets[t]) - vocab_first;
        if (local >= 0 && local < V) drow[local] -= dloss_per_token;
    }
}

}  // namespace moetron::cpu
