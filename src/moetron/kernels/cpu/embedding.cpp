// Token embedding: a row gather forward, a scatter-add backward.
#include "moetron/kernels/cpu/embedding.h"

#include <algorithm>
#include <cstring>

#include "moetron/core/error.h"

namespace moetron::cpu {
namespace {

// Serial, before any parallel region: an exception must not leave an OpenMP region, and N int
// comparisons cost nothing next to N*D floats moved.
void check_token_ids(const int32_t* tokens, int64_t num_tokens, int64_t vocab_size) {
    for (int64_t t = 0; t < num_tokens; ++t)
        MT_CHECK(tokens[t] >= 0 && tokens[t] < vocab_size,
                 "[embedding] token id {} at position {} is outside the vocabulary [0, "
                 "vocab_size = {})",
                 tokens[t], t, vocab_size);
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t num_tokens,
                       int64_t vocab_size, int64_t dim) {
    check_token_ids(tokens, num_tokens, vocab_size);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t)
        std::memcpy(out + t * dim, table + static_cast<int64_t>(tokens[t]) * dim,
                    static_cast<size_t>(dim) * sizeof(float));
}

// Repeated tokens add into the same table row, so threads split the columns, not the tokens:
// no two threads touch one element, and every element sums its tokens in position order, which
// makes the result bitwise independent of the thread count.
void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int64_t num_tokens,
                        int64_t vocab_size, int64_t dim) {
    check_token_ids(tokens, num_tokens, vocab_size);
    constexpr int64_t kColumnsPerBlock = 64;  // four cache lines of one row per token visit
    const int64_t num_blocks = (dim + kColumnsPerBlock - 1) / kColumnsPerBlock;
#pragma omp parallel for schedule(static)
    for (int64_t block = 0; block < num_blocks; ++block) {
        const int64_t begin = block * kColumnsPerBlock;
        const int64_t end = std::min(dim, begin + kColumnsPerBlock);
        for (int64_t t = 0; t < num_tokens; ++t) {
            float* dtable_row = dtable + static_cast<int64_t>(tokens[t]) * dim;
            const float* dout_row = dout + t * dim;
#pragma omp simd
            for (int64_t d = begin; d < end; ++d) dtable_row[d] += dout_row[d];
        }
    }
}

void embedding_part_forward(float* out, const int32_t* tokens, const float* table_part,
                            int64_t num_tokens, int64_t vocab_first, int64_t part_vocab,
                            int64_t dim) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
        const int64_t row = static_cast<int64_t>(tokens[t]) - vocab_first;
        float* out_row = out + t * dim;
        if (row >= 0 && row < part_vocab) {
            std::memcpy(out_row, table_part + row * dim, static_cast<size_t>(dim) * sizeof(float));
        } else {
            std::fill(out_row, out_row + dim, 0.0f);
        }
    }
}

// Columns per thread, tokens in position order, as embedding_backward.
void embedding_part_backward(float* dtable_part, const float* dout, const int32_t* tokens,
                             int64_t num_tokens, int64_t vocab_first, int64_t part_vocab,
                             int64_t dim) {
    constexpr int64_t kColumnsPerBlock = 64;
    const int64_t num_blocks = (dim + kColumnsPerBlock - 1) / kColumnsPerBlock;
#pragma omp parallel for schedule(static)
    for (int64_t block = 0; block < num_blocks; ++block) {
        const int64_t begin = block * kColumnsPerBlock;
        const int64_t end = std::min(dim, begin + kColumnsPerBlock);
        for (int64_t t = 0; t < num_tokens; ++t) {
            const int64_t row = static_cast<int64_t>(tokens[t]) - vocab_first;
            if (row < 0 || row >= part_vocab) continue;
            float* dtable_row = dtable_part + row * dim;
            const float* dout_row = dout + t * dim;
#pragma omp simd
            for (int64_t d = begin; d < end; ++d) dtable_row[d] += dout_row[d];
        }
    }
}

}  // namespace moetron::cpu
