// Token permutation for the experts: the layout (a stable counting sort of the token copies by
// expert), then permute and unpermute, each written beside its backward (they are each other's
// adjoint).
#include "moetron/kernels/cpu/permute.h"

#include <cstring>

#include "moetron/core/error.h"

namespace moetron::cpu {

void moe_permute_layout(int32_t* copy_to_row, int64_t* expert_offsets, const int32_t* topk_ids,
                        int64_t num_tokens, int64_t top_k, int64_t num_experts) {
    MT_CHECK(num_tokens >= 0 && top_k >= 1 && num_experts >= 1,
             "[permute] need num_tokens >= 0, num_experts_per_tok >= 1 and n_routed_experts >= "
             "1, got {}, {}, {}",
             num_tokens, top_k, num_experts);
    const int64_t num_copies = num_tokens * top_k;
    MT_CHECK(num_copies <= INT32_MAX, "[permute] {} token copies overflow the int32 row index",
             num_copies);

    // Counting sort, serial: it is O(N*K) integer work next to O(N*K*D) data movement, and a
    // serial pass keeps the order within each expert stable without per-thread histograms.
    // Pass 1: counts into expert_offsets[e + 1], then a prefix sum gives each segment's start.
    for (int64_t e = 0; e <= num_experts; ++e) expert_offsets[e] = 0;
    for (int64_t c = 0; c < num_copies; ++c) {
        const int32_t e = topk_ids[c];
        MT_CHECK(e >= 0 && e < num_experts,
                 "[permute] token {} chose expert {}, outside [0, n_routed_experts = {})",
                 c / top_k, e, num_experts);
        ++expert_offsets[e + 1];
    }
    for (int64_t e = 0; e < num_experts; ++e) expert_offsets[e + 1] += expert_offsets[e];

    // Pass 2: expert_offsets[e] serves as the cursor of segment e; walking copies in order keeps
    // the sort stable. Afterwards each cursor sits at its segment's end, i.e. the next segment's
    // start, so shifting the array right by one restores the starts without scratch memory.
    for (int64_t c = 0; c < num_copies; ++c)
        copy_to_row[c] = static_cast<int32_t>(expert_offsets[topk_ids[c]]++);
    for (int64_t e = num_experts; e > 0; --e) expert_offsets[e] = expert_offsets[e - 1];
    expert_offsets[0] = 0;
}

// permute: out[copy_to_row[t*K + j]] = inp[t]
void permute_forward(float* out, const float* inp, const int32_t* copy_to_row, int64_t num_tokens,
                     int64_t top_k, int64_t dim) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t)
        for (int64_t j = 0; j < top_k; ++j)
            std::memcpy(out + copy_to_row[t * top_k + j] * dim, inp + t * dim,
                        static_cast<size_t>(dim) * sizeof(float));
}

// Backward of permute: each token gathers the gradients of its K copies.
void permute_backward(float* dinp, const float* dout, const int32_t* copy_to_row,
                      int64_t num_tokens, int64_t top_k, int64_t dim) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
        float* dinp_row = dinp + t * dim;
        std::memset(dinp_row, 0, static_cast<size_t>(dim) * sizeof(float));
        for (int64_t j = 0; j < top_k; ++j) {
            const float* dout_row = dout + copy_to_row[t * top_k + j] * dim;
#pragma omp simd
            for (int64_t d = 0; d < dim; ++d) dinp_row[d] += dout_row[d];
        }
    }
}

// unpermute (the combine): out[t] = sum_j weights[t, j] * inp[copy_to_row[t*K + j]]
void unpermute_forward(float* out, const float* inp, const float* weights,
                       const int32_t* copy_to_row, int64_t num_tokens, int64_t top_k, int64_t dim) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
        float* out_row = out + t * dim;
        std::memset(out_row, 0, static_cast<size_t>(dim) * sizeof(float));
        for (int64_t j = 0; j < top_k; ++j) {
            const float w = weights[t * top_k + j];
            const float* inp_row = inp + copy_to_row[t * top_k + j] * dim;
#pragma omp simd
            for (int64_t d = 0; d < dim; ++d) out_row[d] += w * inp_row[d];
        }
    }
}

// Backward of unpermute: dinp[row(t, j)] = w[t, j] * dout[t] (a weighted permute), and
// dweights[t, j] = <dout[t], inp[row(t, j)]>. Either output may be null to skip it.
void unpermute_backward(float* dinp, float* dweights, const float* dout, const float* inp,
                        const float* weights, const int32_t* copy_to_row, int64_t num_tokens,
                        int64_t top_k, int64_t dim) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
        const float* dout_row = dout + t * dim;
        for (int64_t j = 0; j < top_k; ++j) {
            const int64_t row = copy_to_row[t * top_k + j];
            if (dinp) {
                const float w = weights[t * top_k + j];
                float* dinp_row = dinp + row * dim;
#pragma omp simd
                for (int64_t d = 0; d < dim; ++d) dinp_row[d] = w * dout_row[d];
            }
            if (dweights) {
                const float* inp_row = inp + row * dim;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < dim; ++d) dot += dout_row[d] * inp_row[d];
                dweights[t * top_k + j] = dot;
            }
        }
    }
}

}  // namespace moetron::cpu
