#include "moetron/model/vocab_parallel.h"

#include "moetron/kernels/backend.h"

namespace moetron {

void bind_vocab_parallel_scratch(BufferBinder& b, VocabParallelScratch& s,
                                 const std::string& prefix, int tp_size, int64_t num_tokens) {
    if (tp_size == 1) return;
    b(s.row_max, prefix + "row_max", {num_tokens});
    b(s.part_max, prefix + "part_max", {tp_size, num_tokens});
    b(s.sums, prefix + "sums", {2, num_tokens});
}

void vocab_parallel_embedding_forward(Backend& ops, float* out, const int32_t* tokens,
                                      const float* table_part, float* full, int64_t num_tokens,
                                      int64_t vocab_size, int64_t dim,
                                      const parallel::TensorParallel& tp) {
    if (!tp.enabled()) {
        ops.embedding_forward(out, tokens, table_part, num_tokens, vocab_size, dim);
        return;
    }
    const parallel::RowRange part = tp.row_share(vocab_size, "vocabulary rows");
    ops.embedding_part_forward(full, tokens, table_part, num_tokens, part.first, part.count, dim);
    tp.reduce_scatter_rows(out, full, tp.local_rows(num_tokens) * dim);
}

void vocab_parallel_embedding_backward(Backend& ops, float* dtable_part, const float* dout,
                                       const int32_t* tokens, float* full, int64_t num_tokens,
                                       int64_t vocab_size, int64_t dim,
                                       const parallel::TensorParallel& tp) {
    if (!tp.enabled()) {
        ops.embedding_backward(dtable_part, dout, tokens, num_tokens, vocab_size, dim);
        return;
    }
    const parallel::RowRange part = tp.row_share(vocab_size, "vocabulary rows");
    const float* dout_all = tp.gather_rows(full, dout, tp.local_rows(num_tokens) * dim);
    ops.embedding_part_backward(dtable_part, dout_all, tokens, num_tokens, part.first, part.count,
                                dim);
}

CrossEntropyResult vocab_parallel_cross_entropy_forward(
    Backend& ops, float* losses, float* lse, const float* logits_part, const int32_t* targets,
    const VocabParallelScratch& scratch, int64_t num_tokens, int64_t vocab_size,
    int32_t ignore_index, const parallel::TensorParallel& tp) {
    if (!tp.enabled()) {
        return ops.cross_entropy_forward(losses, lse, logits_part, targets, num_tokens, vocab_size,
                                         ignore_index);
    }
    const int64_t n = num_tokens;
    const parallel::RowRange part = tp.row_share(vocab_size, "vocabulary rows");
    ops.cross_entropy_part_max(scratch.row_max, logits_part, n, part.count);
    tp.all_gather(scratch.part_max, scratch.row_max, n);
    ops.cross_entropy_combine_max(scratch.row_max, scratch.part_max, tp.size(), n);
    double* sum_exp = scratch.sums;
    double* target_logit = scratch.sums + n;
    ops.cross_entropy_part_sums(sum_exp, target_logit, logits_part, scratch.row_max, targets, n,
                                part.count, part.first, ignore_index);
    tp.sum(scratch.sums, 2 * n);

    return ops.cross_entropy_combine_losses(losses, lse, sum_exp, target_logit, scratch.row_max,
                                            targets, n, ignore_index);
}

void vocab_parallel_cross_entropy_backward(Backend& ops, float* dlogits_part,
                                           const float* logits_part, const float* lse,
                                           const int32_t* targets, int64_t num_tokens,
                                           int64_t vocab_size, int32_t ignore_index,
                                           float dloss_per_token,
                                           const parallel::TensorParallel& tp) {
    if (!tp.enabled()) {
        ops.cross_entropy_backward(dlogits_part, logits_part, lse, targets, num_tokens, vocab_size,
                                   ignore_index, dloss_per_token);
        return;
    }
    const parallel::RowRange part = tp.row_share(vocab_size, "vocabulary rows");
    ops.cross_entropy_part_backward(dlogits_part, logits_part, lse, targets, num_tokens, part.count,
                                    part.first, ignore_index, dloss_per_token);
}

}  // namespace moetron
