// Causal softmax attention, flash-attention style (Dao et al. 2022; FlashAttention-2, Dao 2023):
// the S x S probability matrix is never stored. The forward keeps a running max and sum per query
// (online softmax) and saves only lse = log sum_j exp(scale q.k_j); the backward recomputes each
// probability from lse.
//
// Forward, for query i and keys j <= i:
//   P_ij = exp(scale q_i.k_j - lse_i),   out_i = sum_j P_ij v_j
// Backward, with D_i = sum_j P_ij dP_ij = dout_i . out_i:
//   dP_ij = dout_i . v_j,   dS_ij = P_ij (dP_ij - D_i),
//   dv_j = sum_i P_ij dout_i,   dq_i = scale sum_j dS_ij k_j,   dk_j = scale sum_i dS_ij q_i.
//
// One OpenMP task per (batch, head) pair: each owns its rows of out/lse and of dq/dk/dv, so there
// are no races and nothing to reduce. Inner loops are contiguous over Dqk and Dv, which the
// compiler vectorizes, and handle four keys (dot products) or four rows (accumulations) per pass.
#include "moetron/kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "moetron/core/error.h"

namespace moetron::cpu {

namespace {

// Tiles of kQueryBlock queries x kKeyBlock keys: a key block's k and v rows (40 KiB at Dqk = 192,
// Dv = 128) stay in L1/L2 while the queries of a block pass over it, and the backward's
// probability and dS tiles (2 x 4 KiB) live on the stack.
constexpr int64_t kKeyBlock = 32;
constexpr int64_t kQueryBlock = 32;

inline float dot(const float* a, const float* b, int64_t n) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

// out[r] = scale * (a . rows[r]) for num_rows rows spaced row_stride apart. Four rows at a time
// share each load of a: 1.25 loads per multiply-add instead of a plain dot product's 2.
inline void dot_rows(float* out, const float* a, const float* rows, int64_t row_stride,
                     int64_t num_rows, int64_t n, float scale) {
    int64_t r = 0;
    for (; r + 4 <= num_rows; r += 4) {
        const float* b0 = rows + r * row_stride;
        const float* b1 = b0 + row_stride;
        const float* b2 = b1 + row_stride;
        const float* b3 = b2 + row_stride;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t i = 0; i < n; ++i) {
            s0 += a[i] * b0[i];
            s1 += a[i] * b1[i];
            s2 += a[i] * b2[i];
            s3 += a[i] * b3[i];
        }
        out[r] = scale * s0;
        out[r + 1] = scale * s1;
        out[r + 2] = scale * s2;
        out[r + 3] = scale * s3;
    }
    for (; r < num_rows; ++r) out[r] = scale * dot(a, rows + r * row_stride, n);
}

// y += sum_r coeff[r * coeff_stride] * rows[r * row_stride, 0..n): a small matrix-vector product.
// Four rows per pass over y: one load and store of y per four multiply-adds, where a plain axpy
// per row pays a load and a store of y for each.
inline void accumulate_rows(float* y, const float* coeff, int64_t coeff_stride, const float* rows,
                            int64_t row_stride, int64_t num_rows, int64_t n) {
    int64_t r = 0;
    for (; r + 4 <= num_rows; r += 4) {
        const float c0 = coeff[r * coeff_stride], c1 = coeff[(r + 1) * coeff_stride];
        const float c2 = coeff[(r + 2) * coeff_stride], c3 = coeff[(r + 3) * coeff_stride];
        const float* x0 = rows + r * row_stride;
        const float* x1 = x0 + row_stride;
        const float* x2 = x1 + row_stride;
        const float* x3 = x2 + row_stride;
#pragma omp simd
        for (int64_t d = 0; d < n; ++d) y[d] += c0 * x0[d] + c1 * x1[d] + c2 * x2[d] + c3 * x3[d];
    }
    for (; r < num_rows; ++r) {
        const float c = coeff[r * coeff_stride];
        const float* x = rows + r * row_stride;
#pragma omp simd
        for (int64_t d = 0; d < n; ++d) y[d] += c * x[d];
    }
}

inline void scale_inplace(float* y, float alpha, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] *= alpha;
}

// The strided rows of one (batch, head) pair: token s of that head starts at offset + s * stride.
struct HeadRows {
    int64_t stride;  // H * head_dim
    int64_t offset;  // ((b * S) * H + h) * head_dim
};

inline HeadRows head_rows(int64_t b, int64_t h, int64_t seq_len, int64_t num_heads,
                          int64_t head_dim) {
    return {num_heads * head_dim, (b * seq_len * num_heads + h) * head_dim};
}

void check_attention_args(const char* op, int64_t batch, int64_t seq_len, int64_t num_heads,
                          int64_t qk_head_dim, int64_t v_head_dim, float scale) {
    MT_CHECK(batch >= 0 && seq_len >= 0 && num_heads > 0,
             "[{}] need batch >= 0, seq_len >= 0, num_heads > 0, got B={} S={} H={}", op, batch,
             seq_len, num_heads);
    MT_CHECK(qk_head_dim > 0 && v_head_dim > 0, "[{}] head dims must be > 0, got Dqk={} Dv={}", op,
             qk_head_dim, v_head_dim);
    MT_CHECK(std::isfinite(scale) && scale > 0.0f,
             "[{}] softmax scale must be finite and > 0, got {}", op, scale);
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t batch, int64_t seq_len, int64_t num_heads, int64_t qk_head_dim,
                       int64_t v_head_dim, float scale) {
    check_attention_args("attention_forward", batch, seq_len, num_heads, qk_head_dim, v_head_dim,
                         scale);
    const float neg_inf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static)
    for (int64_t pair = 0; pair < batch * num_heads; ++pair) {
        const int64_t b = pair / num_heads, h = pair % num_heads;
        const HeadRows qk = head_rows(b, h, seq_len, num_heads, qk_head_dim);
        const HeadRows vo = head_rows(b, h, seq_len, num_heads, v_head_dim);
        const float* q_bh = q + qk.offset;
        const float* k_bh = k + qk.offset;
        const float* v_bh = v + vo.offset;
        float* out_bh = out + vo.offset;
        float* lse_bh = lse + pair * seq_len;  // lse is (B, H, S) and pair = b * H + h

        for (int64_t q_start = 0; q_start < seq_len; q_start += kQueryBlock) {
            const int64_t num_queries = std::min(kQueryBlock, seq_len - q_start);
            // Online softmax state per query; the output row itself is the accumulator.
            float row_max[kQueryBlock], row_sum[kQueryBlock];
            for (int64_t qi = 0; qi < num_queries; ++qi) {
                row_max[qi] = neg_inf;
                row_sum[qi] = 0.0f;
                std::fill_n(out_bh + (q_start + qi) * vo.stride, v_head_dim, 0.0f);
            }
            const int64_t key_end = q_start + num_queries;  // causal: no query here sees past it
            for (int64_t k_start = 0; k_start < key_end; k_start += kKeyBlock) {
                const int64_t block_keys = std::min(kKeyBlock, key_end - k_start);
                const float* k_block = k_bh + k_start * qk.stride;
                const float* v_block = v_bh + k_start * vo.stride;
                for (int64_t qi = 0; qi < num_queries; ++qi) {
                    const int64_t i = q_start + qi;
                    const int64_t num_keys = std::min(block_keys, i - k_start + 1);
                    if (num_keys <= 0) continue;
                    float* out_i = out_bh + i * vo.stride;

                    float probs[kKeyBlock];  // scores first, then exp(score - running max)
                    dot_rows(probs, q_bh + i * qk.stride, k_block, qk.stride, num_keys, qk_head_dim,
                             scale);
                    const float block_max = *std::max_element(probs, probs + num_keys);
                    // A new maximum rescales what was summed so far (exp(-inf) = 0 the first time).
                    if (block_max > row_max[qi]) {
                        const float correction = std::exp(row_max[qi] - block_max);
                        row_sum[qi] *= correction;
                        scale_inplace(out_i, correction, v_head_dim);
                        row_max[qi] = block_max;
                    }
                    for (int64_t kj = 0; kj < num_keys; ++kj) {
                        probs[kj] = std::exp(probs[kj] - row_max[qi]);
                        row_sum[qi] += probs[kj];
                    }
                    accumulate_rows(out_i, probs, 1, v_block, vo.stride, num_keys, v_head_dim);
                }
            }
            for (int64_t qi = 0; qi < num_queries; ++qi) {
                const int64_t i = q_start + qi;
                scale_inplace(out_bh + i * vo.stride, 1.0f / row_sum[qi], v_head_dim);
                lse_bh[i] = row_max[qi] + std::log(row_sum[qi]);
            }
        }
    }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        int64_t batch, int64_t seq_len, int64_t num_heads, int64_t qk_head_dim,
                        int64_t v_head_dim, float scale) {
    check_attention_args("attention_backward", batch, seq_len, num_heads, qk_head_dim, v_head_dim,
                         scale);
#pragma omp parallel for schedule(static)
    for (int64_t pair = 0; pair < batch * num_heads; ++pair) {
        const int64_t b = pair / num_heads, h = pair % num_heads;
        const HeadRows qk = head_rows(b, h, seq_len, num_heads, qk_head_dim);
        const HeadRows vo = head_rows(b, h, seq_len, num_heads, v_head_dim);
        const float* q_bh = q + qk.offset;
        const float* k_bh = k + qk.offset;
        const float* v_bh = v + vo.offset;
        const float* out_bh = out + vo.offset;
        const float* dout_bh = dout + vo.offset;
        const float* lse_bh = lse + pair * seq_len;
        float* dq_bh = dq + qk.offset;
        float* dk_bh = dk + qk.offset;
        float* dv_bh = dv + vo.offset;

        // Activation gradients are written: clear this pair's rows, then accumulate into them.
        for (int64_t s = 0; s < seq_len; ++s) {
            std::fill_n(dq_bh + s * qk.stride, qk_head_dim, 0.0f);
            std::fill_n(dk_bh + s * qk.stride, qk_head_dim, 0.0f);
            std::fill_n(dv_bh + s * vo.stride, v_head_dim, 0.0f);
        }

        // FlashAttention-2's order: a block of keys (and its dk, dv rows) stays hot while the
        // queries that can see it (i >= k_start) pass over it, one tile of queries at a time.
        for (int64_t k_start = 0; k_start < seq_len; k_start += kKeyBlock) {
            const int64_t block_keys = std::min(kKeyBlock, seq_len - k_start);
            const float* k_block = k_bh + k_start * qk.stride;
            const float* v_block = v_bh + k_start * vo.stride;
            for (int64_t q_start = k_start; q_start < seq_len; q_start += kQueryBlock) {
                const int64_t num_queries = std::min(kQueryBlock, seq_len - q_start);
                // P and dS for this tile; entries above the causal diagonal stay 0.
                float p_tile[kQueryBlock][kKeyBlock] = {};
                float ds_tile[kQueryBlock][kKeyBlock] = {};
                for (int64_t qi = 0; qi < num_queries; ++qi) {
                    const int64_t i = q_start + qi;
                    const int64_t num_keys = std::min(block_keys, i - k_start + 1);
                    const float* dout_i = dout_bh + i * vo.stride;
                    float* p = p_tile[qi];
                    float* ds = ds_tile[qi];
                    dot_rows(p, q_bh + i * qk.stride, k_block, qk.stride, num_keys, qk_head_dim,
                             scale);
                    dot_rows(ds, dout_i, v_block, vo.stride, num_keys, v_head_dim, 1.0f);  // dP
                    // D_i is recomputed per key block: Dv flops against ~5 (Dqk + Dv) per key.
                    const float d_i = dot(dout_i, out_bh + i * vo.stride, v_head_dim);
                    for (int64_t kj = 0; kj < num_keys; ++kj) {
                        p[kj] = std::exp(p[kj] - lse_bh[i]);
                        ds[kj] = p[kj] * (ds[kj] - d_i) * scale;  // scale folded in for dq, dk
                    }
                    // dq_i += sum_j dS_ij k_j
                    accumulate_rows(dq_bh + i * qk.stride, ds, 1, k_block, qk.stride, num_keys,
                                    qk_head_dim);
                }
                const float* q_tile = q_bh + q_start * qk.stride;
                const float* dout_tile = dout_bh + q_start * vo.stride;
                for (int64_t kj = 0; kj < block_keys; ++kj) {
                    const int64_t j = k_start + kj;
                    // dv_j += sum_i P_ij dout_i,  dk_j += sum_i dS_ij q_i  (a column of each tile)
                    accumulate_rows(dv_bh + j * vo.stride, &p_tile[0][kj], kKeyBlock, dout_tile,
                                    vo.stride, num_queries, v_head_dim);
                    accumulate_rows(dk_bh + j * qk.stride, &ds_tile[0][kj], kKeyBlock, q_tile,
                                    qk.stride, num_queries, qk_head_dim);
                }
            }
        }
    }
}

}  // namespace moetron::cpu
