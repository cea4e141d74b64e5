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
// Work is done in tiles of kBlock queries x kBlock keys, each product of a tile a small GEMM on
// the register-tiled kernels of small_gemm.h (AVX2 or AVX-512). Tiles are held transposed, keys
// by queries (S^T, P^T, dS^T), so that their products read the strided q, k, v, dout rows in
// place and only a query block's q (and dout) is packed, transposed, once per block; the
// softmax's per-query steps then run along the tile's contiguous rows. Exponentials use
// exp_vectorizable (vector_exp.h). One OpenMP task per (batch, head) pair: each owns its rows of
// out/lse and of dq/dk/dv, so there are no races and nothing to reduce.
#include "moetron/kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/small_gemm.h"
#include "moetron/kernels/cpu/vector_exp.h"

namespace moetron::cpu {

namespace {

// Queries and keys per tile: the (keys x queries) tiles of scores, probabilities and their
// gradients (16 KiB each) stay in L1/L2 while the k and v rows of a key block (80 KiB at
// Dqk = 192, Dv = 128) are reused from L2 by every tile of queries. Query and key blocks are
// aligned, so only the diagonal tile needs the causal mask.
constexpr int64_t kBlock = 64;
// A block's query rows (q, or dout) are packed transposed (head dim x kBlock) once per query
// block when the head dim is at most kMaxPackedHeadDim (64 KiB on the stack); larger head dims
// are packed kHeadChunk dims at a time for every tile instead, so any head dim works.
constexpr int64_t kMaxPackedHeadDim = 256;
constexpr int64_t kHeadChunk = 64;

const float kNegInf = -std::numeric_limits<float>::infinity();

// The strided rows of one (batch, head) pair: token s of that head starts at offset + s * stride.
struct HeadRows {
    int64_t stride;  // H * head_dim
    int64_t offset;  // ((b * S) * H + h) * head_dim
};

inline HeadRows head_rows(int64_t b, int64_t h, int64_t seq_len, int64_t num_heads,
                          int64_t head_dim) {
    return {num_heads * head_dim, (b * seq_len * num_heads + h) * head_dim};
}

// A block of query rows (q or dout, strided by their heads' stride) as the packed operand of
// transposed_dots: packed[d * kBlock + q] = row q's element d, for the whole head when it fits.
struct QueryBlock {
    alignas(64) float packed[kMaxPackedHeadDim * kBlock];
    const float* rows = nullptr;
    int64_t stride = 0, num_queries = 0, head_dim = 0;
    bool fits = false;

    void set(const float* first_row, int64_t row_stride, int64_t count, int64_t dim) {
        rows = first_row;
        stride = row_stride;
        num_queries = count;
        head_dim = dim;
        fits = dim <= kMaxPackedHeadDim;
        if (fits) pack(packed, 0, dim);
    }
    // Dims [d0, d0 + chunk) of every row into out (chunk x kBlock).
    void pack(float* out, int64_t d0, int64_t chunk) const {
        for (int64_t q = 0; q < num_queries; ++q) {
            const float* row = rows + q * stride + d0;
            for (int64_t d = 0; d < chunk; ++d) out[d * kBlock + q] = row[d];
        }
    }
};

// tile_t (num_keys x num_queries, rows kBlock apart) = keys . queries^T over the head dim: the
// transposed dot products of a block of key rows (k or v, strided) with a block of query rows.
void transposed_dots(float* tile_t, const float* keys, int64_t key_stride, int64_t num_keys,
                     const QueryBlock& queries) {
    if (queries.fits) {
        small_gemm({tile_t, kBlock, false, keys, key_stride, 1, queries.packed, kBlock, num_keys,
                    queries.num_queries, queries.head_dim});
        return;
    }
    alignas(64) float chunk_packed[kHeadChunk * kBlock];
    for (int64_t d0 = 0; d0 < queries.head_dim; d0 += kHeadChunk) {
        const int64_t chunk = std::min(kHeadChunk, queries.head_dim - d0);
        queries.pack(chunk_packed, d0, chunk);
        small_gemm({tile_t, kBlock, d0 > 0, keys + d0, key_stride, 1, chunk_packed, kBlock,
                    num_keys, queries.num_queries, chunk});
    }
}

// Scores of the keys a query may not see become -inf: in row kk (key k0 + kk) of a transposed
// tile, the queries q0 + q < k0 + kk. With aligned blocks only the diagonal tile has any.
void mask_future_keys(float* scores_t, int64_t q0, int64_t k0, int64_t num_keys,
                      int64_t num_queries) {
    for (int64_t kk = 0; kk < num_keys; ++kk) {
        const int64_t num_hidden = std::clamp<int64_t>(k0 + kk - q0, 0, num_queries);
        std::fill_n(scores_t + kk * kBlock, num_hidden, kNegInf);
    }
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

        for (int64_t q0 = 0; q0 < seq_len; q0 += kBlock) {
            const int64_t num_queries = std::min(kBlock, seq_len - q0);
            // Online softmax state per query; the output rows themselves are the accumulator.
            float row_max[kBlock], row_sum[kBlock], correction[kBlock];
            std::fill_n(row_max, kBlock, kNegInf);
            std::fill_n(row_sum, kBlock, 0.0f);
            for (int64_t qi = 0; qi < num_queries; ++qi) {
                std::fill_n(out_bh + (q0 + qi) * vo.stride, v_head_dim, 0.0f);
            }
            QueryBlock queries;
            queries.set(q_bh + q0 * qk.stride, qk.stride, num_queries, qk_head_dim);
            // Scores, then probabilities, keys x queries.
            alignas(64) float probs_t[kBlock * kBlock];
            // Causal: no query of this block sees a key past its last, so k0 <= q0.
            for (int64_t k0 = 0; k0 <= q0; k0 += kBlock) {
                const int64_t num_keys = std::min(kBlock, seq_len - k0);
                transposed_dots(probs_t, k_bh + k0 * qk.stride, qk.stride, num_keys, queries);
                mask_future_keys(probs_t, q0, k0, num_keys, num_queries);
                // A new maximum rescales what was summed so far (exp(-inf) = 0 the first time);
                // every query sees key k0, so each block has a finite maximum.
                float block_max[kBlock];
                std::fill_n(block_max, kBlock, kNegInf);
                for (int64_t kk = 0; kk < num_keys; ++kk) {
                    const float* row = probs_t + kk * kBlock;
#pragma omp simd
                    for (int64_t qi = 0; qi < num_queries; ++qi) {
                        block_max[qi] = std::max(block_max[qi], scale * row[qi]);
                    }
                }
#pragma omp simd
                for (int64_t qi = 0; qi < num_queries; ++qi) {
                    const float new_max = std::max(row_max[qi], block_max[qi]);
                    correction[qi] = exp_vectorizable(row_max[qi] - new_max);
                    row_max[qi] = new_max;
                    row_sum[qi] *= correction[qi];
                }
                for (int64_t kk = 0; kk < num_keys; ++kk) {
                    float* row = probs_t + kk * kBlock;
#pragma omp simd
                    for (int64_t qi = 0; qi < num_queries; ++qi) {
                        row[qi] = exp_vectorizable(scale * row[qi] - row_max[qi]);
                        row_sum[qi] += row[qi];
                    }
                }
                for (int64_t qi = 0; qi < num_queries; ++qi) {
                    if (correction[qi] == 1.0f) continue;
                    float* out_i = out_bh + (q0 + qi) * vo.stride;
#pragma omp simd
                    for (int64_t d = 0; d < v_head_dim; ++d) out_i[d] *= correction[qi];
                }
                // out_i += sum_kk P[qi][kk] v_kk: op(A) = P, read from P^T.
                small_gemm({out_bh + q0 * vo.stride, vo.stride, true, probs_t, 1, kBlock,
                            v_bh + k0 * vo.stride, vo.stride, num_queries, v_head_dim, num_keys});
            }
            for (int64_t qi = 0; qi < num_queries; ++qi) {
                float* out_i = out_bh + (q0 + qi) * vo.stride;
                const float inv_sum = 1.0f / row_sum[qi];
#pragma omp simd
                for (int64_t d = 0; d < v_head_dim; ++d) out_i[d] *= inv_sum;
                lse_bh[q0 + qi] = row_max[qi] + std::log(row_sum[qi]);
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

        // Query blocks outside, so that each block's q and dout are packed and its D_i computed
        // once; the key blocks it sees (k0 <= q0) inside. dk, dv and dq all accumulate in place.
        QueryBlock queries, douts;
        alignas(64) float probs_t[kBlock * kBlock];   // P^T (keys x queries)
        alignas(64) float dscore_t[kBlock * kBlock];  // dP^T, then dS^T (scale folded in)
        for (int64_t q0 = 0; q0 < seq_len; q0 += kBlock) {
            const int64_t num_queries = std::min(kBlock, seq_len - q0);
            const float* q_tile = q_bh + q0 * qk.stride;
            const float* dout_tile = dout_bh + q0 * vo.stride;
            float d_row[kBlock], lse_row[kBlock];
            for (int64_t qi = 0; qi < num_queries; ++qi) {
                const float* dout_i = dout_tile + qi * vo.stride;
                const float* out_i = out_bh + (q0 + qi) * vo.stride;
                float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int64_t d = 0; d < v_head_dim; ++d) sum += dout_i[d] * out_i[d];
                d_row[qi] = sum;
                lse_row[qi] = lse_bh[q0 + qi];
            }
            queries.set(q_tile, qk.stride, num_queries, qk_head_dim);
            douts.set(dout_tile, vo.stride, num_queries, v_head_dim);
            for (int64_t k0 = 0; k0 <= q0; k0 += kBlock) {
                const int64_t num_keys = std::min(kBlock, seq_len - k0);
                const float* k_block = k_bh + k0 * qk.stride;
                const float* v_block = v_bh + k0 * vo.stride;
                transposed_dots(probs_t, k_block, qk.stride, num_keys, queries);
                mask_future_keys(probs_t, q0, k0, num_keys, num_queries);
                transposed_dots(dscore_t, v_block, vo.stride, num_keys, douts);
                for (int64_t kk = 0; kk < num_keys; ++kk) {
                    float* p = probs_t + kk * kBlock;
                    float* ds = dscore_t + kk * kBlock;
#pragma omp simd
                    for (int64_t qi = 0; qi < num_queries; ++qi) {
                        p[qi] = exp_vectorizable(scale * p[qi] - lse_row[qi]);
                        ds[qi] = p[qi] * (ds[qi] - d_row[qi]) * scale;  // scale folded in
                    }
                }
                // dv_j += sum_i P_ij dout_i;  dk_j += sum_i dS_ij q_i  (op(A) = P^T, dS^T)
                small_gemm({dv_bh + k0 * vo.stride, vo.stride, true, probs_t, kBlock, 1, dout_tile,
                            vo.stride, num_keys, v_head_dim, num_queries});
                small_gemm({dk_bh + k0 * qk.stride, qk.stride, true, dscore_t, kBlock, 1, q_tile,
                            qk.stride, num_keys, qk_head_dim, num_queries});
                // dq_i += sum_j dS_ij k_j  (op(A) = dS, read from dS^T)
                small_gemm({dq_bh + q0 * qk.stride, qk.stride, true, dscore_t, 1, kBlock, k_block,
                            qk.stride, num_queries, qk_head_dim, num_keys});
            }
        }
    }
}

}  // namespace moetron::cpu
