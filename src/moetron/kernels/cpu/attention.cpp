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
// the register-tiled kernels of small_gemm.h (AVX2 or AVX-512). The forward holds its tiles
// transposed, keys by queries (S^T, P^T), so that their products read the strided k and v rows in
// place and only a query block's q is packed, transposed, once per block; the softmax's
// per-query steps then run along the tile's contiguous rows. The backward walks key blocks
// outside and query blocks inside (FlashAttention-2's order), with tiles queries by keys: a key
// block's k and v are packed transposed once, the rows its GEMMs reuse are copied contiguous, and
// the diagonal tile computes only the products causality keeps. Exponentials use
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

// Queries and keys per tile: the tiles of scores, probabilities and their gradients (16 KiB
// each) stay in L1/L2 while the k and v rows of a key block (80 KiB at Dqk = 192, Dv = 128) are
// reused from L2 by every tile of queries. Query and key blocks are aligned, so only the diagonal
// tile needs the causal mask.
constexpr int64_t kBlock = 64;
// A block's rows (the forward's q, the backward's k and v) are packed transposed (head dim x
// kBlock) once per block when the head dim is at most kMaxPackedHeadDim (64 KiB on the stack);
// larger head dims are packed kHeadChunk dims at a time for every tile instead, so any head dim
// works.
constexpr int64_t kMaxPackedHeadDim = 256;
constexpr int64_t kHeadChunk = 64;
// The backward's queries per span: their D_i (16 KiB) are computed once per span.
constexpr int64_t kQuerySpan = 4096;
static_assert(kQuerySpan % kBlock == 0, "spans must end on block boundaries");
// The backward's diagonal tile goes in groups of this many rows (a multiple of both builds' tile
// heights), each computed only over the keys its queries see, rounded up to whole vectors of
// kColumnRounding (one 512-bit vector, two 256-bit ones): about 70% of the tile's products.
constexpr int64_t kDiagonalGroupRows = 24;
constexpr int64_t kColumnRounding = 16;

int64_t round_up_to_columns(int64_t count) {
    return (count + kColumnRounding - 1) / kColumnRounding * kColumnRounding;
}

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

// A block of rows (q or dout in the forward, k or v in the backward; strided by their heads'
// stride) as the packed operand of packed_dots: packed[d * kBlock + j] = row j's element d, for
// the whole head when it fits.
struct PackedRows {
    alignas(64) float packed[kMaxPackedHeadDim * kBlock];
    const float* rows = nullptr;
    int64_t stride = 0, count = 0, head_dim = 0;
    bool fits = false;

    void set(const float* first_row, int64_t row_stride, int64_t num_rows, int64_t dim) {
        rows = first_row;
        stride = row_stride;
        count = num_rows;
        head_dim = dim;
        fits = dim <= kMaxPackedHeadDim;
        if (fits) pack(packed, 0, dim);
    }
    // Dims [d0, d0 + chunk) of every row into out (chunk x kBlock).
    void pack(float* out, int64_t d0, int64_t chunk) const {
        for (int64_t j = 0; j < count; ++j) {
            const float* row = rows + j * stride + d0;
            for (int64_t d = 0; d < chunk; ++d) out[d * kBlock + j] = row[d];
        }
    }
};

// A block of rows (strided by their heads' stride) as a GEMM reads them: copied into contiguous
// rows when the head dim fits, else in place. Rows H * head_dim floats apart (4 or 6 KiB in the
// benchmark's shape) map to the same few L1 sets, so a GEMM that reuses a panel of them as its B
// operand evicts its own panel; the copies made the MLA backward about 2% faster. With the two
// PackedRows, three RowBlocks hold the backward's ~370 KiB of stack per thread.
struct RowBlock {
    alignas(64) float copy[kMaxPackedHeadDim * kBlock];
    const float* rows = nullptr;
    int64_t stride = 0;

    void set(const float* first_row, int64_t row_stride, int64_t num_rows, int64_t dim) {
        if (dim > kMaxPackedHeadDim) {
            rows = first_row;
            stride = row_stride;
            return;
        }
        for (int64_t j = 0; j < num_rows; ++j) {
            std::copy_n(first_row + j * row_stride, dim, copy + j * dim);
        }
        rows = copy;
        stride = dim;
    }
};

// tile (num_rows x num_cols, rows kBlock apart) = rows . packed^T over the head dim: the dot
// products of a block of strided rows with the first num_cols rows of a packed block.
void packed_dots(float* tile, const float* rows, int64_t row_stride, int64_t num_rows,
                 const PackedRows& packed, int64_t num_cols) {
    if (packed.fits) {
        small_gemm({tile, kBlock, false, rows, row_stride, 1, packed.packed, kBlock, num_rows,
                    num_cols, packed.head_dim});
        return;
    }
    alignas(64) float chunk_packed[kHeadChunk * kBlock];
    for (int64_t d0 = 0; d0 < packed.head_dim; d0 += kHeadChunk) {
        const int64_t chunk = std::min(kHeadChunk, packed.head_dim - d0);
        packed.pack(chunk_packed, d0, chunk);
        small_gemm({tile, kBlock, d0 > 0, rows + d0, row_stride, 1, chunk_packed, kBlock, num_rows,
                    num_cols, chunk});
    }
}

// Scores of the keys a query may not see become -inf: in row kk (key k0 + kk) of a transposed
// tile, the queries q0 + q < k0 + kk. With aligned blocks only the diagonal tile has any.
void mask_future_keys_transposed(float* scores_t, int64_t q0, int64_t k0, int64_t num_keys,
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
            PackedRows queries;
            queries.set(q_bh + q0 * qk.stride, qk.stride, num_queries, qk_head_dim);
            // Scores, then probabilities, keys x queries.
            alignas(64) float probs_t[kBlock * kBlock];
            // Causal: no query of this block sees a key past its last, so k0 <= q0.
            for (int64_t k0 = 0; k0 <= q0; k0 += kBlock) {
                const int64_t num_keys = std::min(kBlock, seq_len - k0);
                packed_dots(probs_t, k_bh + k0 * qk.stride, qk.stride, num_keys, queries,
                            queries.count);
                mask_future_keys_transposed(probs_t, q0, k0, num_keys, num_queries);
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

        // Queries in spans of kQuerySpan, whose D_i are computed once (out is read nowhere else);
        // within a span, key blocks outside (FlashAttention-2's order): a block's k and v are
        // packed once, its dk and dv accumulate in place over the query blocks that see it
        // (q0 >= k0), and dq is read and written per tile. Nothing is cleared first: the first
        // product into each row writes it (dk, dv: the diagonal tile; dq: key block 0).
        PackedRows keys_t, values_t;
        RowBlock keys, queries, douts;
        alignas(64) float probs[kBlock * kBlock];    // P (queries x keys)
        alignas(64) float dscores[kBlock * kBlock];  // dP, then dS (scale folded in)
        float d_span[kQuerySpan];                    // D_i = dout_i . out_i
        for (int64_t span0 = 0; span0 < seq_len; span0 += kQuerySpan) {
            const int64_t span_end = std::min(seq_len, span0 + kQuerySpan);
            for (int64_t i = span0; i < span_end; ++i) {
                const float* dout_i = dout_bh + i * vo.stride;
                const float* out_i = out_bh + i * vo.stride;
                float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int64_t d = 0; d < v_head_dim; ++d) sum += dout_i[d] * out_i[d];
                d_span[i - span0] = sum;
            }
            for (int64_t k0 = 0; k0 < span_end; k0 += kBlock) {
                const int64_t num_keys = std::min(kBlock, seq_len - k0);
                float* dk_block = dk_bh + k0 * qk.stride;
                float* dv_block = dv_bh + k0 * vo.stride;
                keys_t.set(k_bh + k0 * qk.stride, qk.stride, num_keys, qk_head_dim);
                values_t.set(v_bh + k0 * vo.stride, vo.stride, num_keys, v_head_dim);
                keys.set(k_bh + k0 * qk.stride, qk.stride, num_keys, qk_head_dim);
                for (int64_t q0 = std::max(k0, span0); q0 < span_end; q0 += kBlock) {
                    const int64_t num_queries = std::min(kBlock, span_end - q0);
                    // On the diagonal tile (num_queries == num_keys) query qi sees keys kk <= qi
                    // only: its rows go in groups, each computed only as far as they see.
                    const bool diagonal = q0 == k0;
                    const int64_t group_rows = diagonal ? kDiagonalGroupRows : kBlock;
                    queries.set(q_bh + q0 * qk.stride, qk.stride, num_queries, qk_head_dim);
                    douts.set(dout_bh + q0 * vo.stride, vo.stride, num_queries, v_head_dim);
                    // S = q k^T and dP = dout v^T, queries by keys.
                    for (int64_t g = 0; g < num_queries; g += group_rows) {
                        const int64_t group_end = std::min(num_queries, g + group_rows);
                        const int64_t num_cols =
                            diagonal ? std::min(num_keys, round_up_to_columns(group_end))
                                     : num_keys;
                        packed_dots(probs + g * kBlock, queries.rows + g * queries.stride,
                                    queries.stride, group_end - g, keys_t, num_cols);
                        packed_dots(dscores + g * kBlock, douts.rows + g * douts.stride,
                                    douts.stride, group_end - g, values_t, num_cols);
                    }
                    // P and dS; zero where a query may not see the key (read by the products
                    // below, never computed above).
                    for (int64_t qi = 0; qi < num_queries; ++qi) {
                        float* p = probs + qi * kBlock;
                        float* ds = dscores + qi * kBlock;
                        const float lse_i = lse_bh[q0 + qi], d_i = d_span[q0 + qi - span0];
                        const int64_t num_visible = diagonal ? qi + 1 : num_keys;
#pragma omp simd
                        for (int64_t kk = 0; kk < num_visible; ++kk) {
                            p[kk] = exp_vectorizable(scale * p[kk] - lse_i);
                            ds[kk] = p[kk] * (ds[kk] - d_i) * scale;  // scale folded in
                        }
                        std::fill(p + num_visible, p + num_keys, 0.0f);
                        std::fill(ds + num_visible, ds + num_keys, 0.0f);
                    }
                    // dv_j += sum_i P_ij dout_i;  dk_j += sum_i dS_ij q_i  (op(A) = P^T, dS^T),
                    // in groups of keys; queries before a group's first key see none of it.
                    for (int64_t g = 0; g < num_keys; g += group_rows) {
                        const int64_t group_end = std::min(num_keys, g + group_rows);
                        const int64_t first_query = diagonal ? g : 0;
                        const int64_t num_seeing = num_queries - first_query;
                        small_gemm({dv_block + g * vo.stride, vo.stride, !diagonal,
                                    probs + first_query * kBlock + g, 1, kBlock,
                                    douts.rows + first_query * douts.stride, douts.stride,
                                    group_end - g, v_head_dim, num_seeing});
                        small_gemm({dk_block + g * qk.stride, qk.stride, !diagonal,
                                    dscores + first_query * kBlock + g, 1, kBlock,
                                    queries.rows + first_query * queries.stride, queries.stride,
                                    group_end - g, qk_head_dim, num_seeing});
                    }
                    // dq_i += sum_j dS_ij k_j, in groups of queries, each over the keys it sees.
                    for (int64_t g = 0; g < num_queries; g += group_rows) {
                        const int64_t group_end = std::min(num_queries, g + group_rows);
                        const int64_t num_seen = diagonal ? group_end : num_keys;
                        small_gemm({dq_bh + (q0 + g) * qk.stride, qk.stride, k0 > 0,
                                    dscores + g * kBlock, kBlock, 1, keys.rows, keys.stride,
                                    group_end - g, qk_head_dim, num_seen});
                    }
                }
            }
        }
    }
}

}  // namespace moetron::cpu
