// The CPU reference backend: every op of kernels/backend.h, each forwarding to its kernel in
// kernels/cpu/ (float32 compute, OpenMP over rows, GEMMs through OpenBLAS).
#include <cstring>

#include "moetron/core/arena.h"
#include "moetron/kernels/backend.h"
#include "moetron/kernels/cpu/adamw.h"
#include "moetron/kernels/cpu/attention.h"
#include "moetron/kernels/cpu/cross_entropy.h"
#include "moetron/kernels/cpu/elementwise.h"
#include "moetron/kernels/cpu/embedding.h"
#include "moetron/kernels/cpu/matmul.h"
#include "moetron/kernels/cpu/permute.h"
#include "moetron/kernels/cpu/rmsnorm.h"
#include "moetron/kernels/cpu/rope.h"
#include "moetron/kernels/cpu/router.h"
#include "moetron/kernels/cpu/swiglu.h"

namespace moetron {

namespace {

class CpuBackend final : public Backend {
  public:
    std::string_view name() const override { return "cpu"; }
    Device device() const override { return Device::cpu; }
    MemoryResource& memory() override { return host_memory(); }
    Stream stream() const override { return kHostStream; }
    void synchronize() override {}
    void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
        copy(host_dst, src, bytes);
    }
    void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
        copy(dst, host_src, bytes);
    }
    void copy(void* dst, const void* src, size_t bytes) override {
        if (bytes) std::memcpy(dst, src, bytes);
    }
    void zero(void* dst, size_t bytes) override {
        if (bytes) std::memset(dst, 0, bytes);
    }

    void add_inplace(float* y, const float* x, int64_t n) override { cpu::add_inplace(y, x, n); }
    void axpy(float* y, float alpha, const float* x, int64_t n) override {
        cpu::axpy(y, alpha, x, n);
    }
    void add(float* out, const float* a, const float* b, int64_t n) override {
        cpu::add(out, a, b, n);
    }
    void matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                bool trans_a, bool trans_b, float beta) override {
        cpu::matmul(c, a, b, m, n, k, trans_a, trans_b, beta);
    }
    void linear_forward(float* out, const float* inp, const float* weight, int64_t num_rows,
                        int64_t in_dim, int64_t out_dim) override {
        cpu::linear_forward(out, inp, weight, num_rows, in_dim, out_dim);
    }
    void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                         const float* weight, int64_t num_rows, int64_t in_dim,
                         int64_t out_dim) override {
        cpu::linear_backward(dinp, dweight, dout, inp, weight, num_rows, in_dim, out_dim);
    }
    void grouped_linear_forward(float* out, const float* inp, const float* weight,
                                const int64_t* offsets, int64_t num_experts, int64_t in_dim,
                                int64_t out_dim) override {
        cpu::grouped_linear_forward(out, inp, weight, offsets, num_experts, in_dim, out_dim);
    }
    void grouped_linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, const int64_t* offsets, int64_t num_experts,
                                 int64_t in_dim, int64_t out_dim) override {
        cpu::grouped_linear_backward(dinp, dweight, dout, inp, weight, offsets, num_experts, in_dim,
                                     out_dim);
    }
    void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                         int64_t num_rows, int64_t dim, float eps) override {
        cpu::rmsnorm_forward(out, rstd, inp, weight, num_rows, dim, eps);
    }
    void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                          const float* weight, const float* rstd, int64_t num_rows,
                          int64_t dim) override {
        cpu::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, num_rows, dim);
    }
    void swiglu_forward(float* out, const float* inp, int64_t num_rows, int64_t ffn_dim) override {
        cpu::swiglu_forward(out, inp, num_rows, ffn_dim);
    }
    void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t num_rows,
                         int64_t ffn_dim) override {
        cpu::swiglu_backward(dinp, dout, inp, num_rows, ffn_dim);
    }
    void rope_tables(float* cos, float* sin, int64_t seq_len, int64_t rope_dim,
                     float theta) override {
        cpu::rope_tables(cos, sin, seq_len, rope_dim, theta);
    }
    void rope_forward(float* x, const float* cos, const float* sin, int64_t num_tokens,
                      int64_t seq_len, int64_t num_heads, int64_t head_stride, int64_t rope_offset,
                      int64_t rope_dim) override {
        cpu::rope_forward(x, cos, sin, num_tokens, seq_len, num_heads, head_stride, rope_offset,
                          rope_dim);
    }
    void rope_backward(float* dx, const float* cos, const float* sin, int64_t num_tokens,
                       int64_t seq_len, int64_t num_heads, int64_t head_stride, int64_t rope_offset,
                       int64_t rope_dim) override {
        cpu::rope_backward(dx, cos, sin, num_tokens, seq_len, num_heads, head_stride, rope_offset,
                           rope_dim);
    }
    void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                           int64_t batch, int64_t seq_len, int64_t num_heads, int64_t qk_head_dim,
                           int64_t v_head_dim, float scale) override {
        cpu::attention_forward(out, lse, q, k, v, batch, seq_len, num_heads, qk_head_dim,
                               v_head_dim, scale);
    }
    void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, const float* out, const float* lse,
                            int64_t batch, int64_t seq_len, int64_t num_heads, int64_t qk_head_dim,
                            int64_t v_head_dim, float scale) override {
        cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, batch, seq_len, num_heads,
                                qk_head_dim, v_head_dim, scale);
    }
    void embedding_forward(float* out, const int32_t* tokens, const float* table,
                           int64_t num_tokens, int64_t vocab_size, int64_t dim) override {
        cpu::embedding_forward(out, tokens, table, num_tokens, vocab_size, dim);
    }
    void embedding_backward(float* dtable, const float* dout, const int32_t* tokens,
                            int64_t num_tokens, int64_t vocab_size, int64_t dim) override {
        cpu::embedding_backward(dtable, dout, tokens, num_tokens, vocab_size, dim);
    }
    void embedding_part_forward(float* out, const int32_t* tokens, const float* table_part,
                                int64_t num_tokens, int64_t vocab_first, int64_t part_vocab,
                                int64_t dim) override {
        cpu::embedding_part_forward(out, tokens, table_part, num_tokens, vocab_first, part_vocab,
                                    dim);
    }
    void embedding_part_backward(float* dtable_part, const float* dout, const int32_t* tokens,
                                 int64_t num_tokens, int64_t vocab_first, int64_t part_vocab,
                                 int64_t dim) override {
        cpu::embedding_part_backward(dtable_part, dout, tokens, num_tokens, vocab_first, part_vocab,
                                     dim);
    }
    CrossEntropyResult cross_entropy_forward(float* losses, float* lse, const float* logits,
                                             const int32_t* targets, int64_t num_tokens,
                                             int64_t vocab_size, int32_t ignore_index) override {
        return cpu::cross_entropy_forward(losses, lse, logits, targets, num_tokens, vocab_size,
                                          ignore_index);
    }
    void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                const int32_t* targets, int64_t num_tokens, int64_t vocab_size,
                                int32_t ignore_index, float dloss_per_token) override {
        cpu::cross_entropy_backward(dlogits, logits, lse, targets, num_tokens, vocab_size,
                                    ignore_index, dloss_per_token);
    }
    void cross_entropy_part_max(float* row_max, const float* logits, int64_t num_tokens,
                                int64_t part_vocab) override {
        cpu::cross_entropy_part_max(row_max, logits, num_tokens, part_vocab);
    }
    void cross_entropy_part_sums(double* sum_exp, double* target_logit, const float* logits,
                                 const float* row_max, const int32_t* targets, int64_t num_tokens,
                                 int64_t part_vocab, int64_t vocab_first,
                                 int32_t ignore_index) override {
        cpu::cross_entropy_part_sums(sum_exp, target_logit, logits, row_max, targets, num_tokens,
                                     part_vocab, vocab_first, ignore_index);
    }
    void cross_entropy_part_backward(float* dlogits, const float* logits, const float* lse,
                                     const int32_t* targets, int64_t num_tokens, int64_t part_vocab,
                                     int64_t vocab_first, int32_t ignore_index,
                                     float dloss_per_token) override {
        cpu::cross_entropy_part_backward(dlogits, logits, lse, targets, num_tokens, part_vocab,
                                         vocab_first, ignore_index, dloss_per_token);
    }
    void router_forward(int32_t* topk_ids, float* topk_weights, float* scores, const float* logits,
                        const float* bias, const RouterShape& shape) override {
        cpu::router_forward(topk_ids, topk_weights, scores, logits, bias, shape);
    }
    void router_backward(float* dlogits, const float* dtopk_weights, const float* dscores_extra,
                         const float* scores, const int32_t* topk_ids,
                         const RouterShape& shape) override {
        cpu::router_backward(dlogits, dtopk_weights, dscores_extra, scores, topk_ids, shape);
    }
    void moe_permute_layout(int32_t* copy_to_row, int64_t* expert_offsets, const int32_t* topk_ids,
                            int64_t num_tokens, int64_t top_k, int64_t num_experts) override {
        cpu::moe_permute_layout(copy_to_row, expert_offsets, topk_ids, num_tokens, top_k,
                                num_experts);
    }
    void permute_forward(float* out, const float* inp, const int32_t* copy_to_row,
                         int64_t num_tokens, int64_t top_k, int64_t dim) override {
        cpu::permute_forward(out, inp, copy_to_row, num_tokens, top_k, dim);
    }
    void permute_backward(float* dinp, const float* dout, const int32_t* copy_to_row,
                          int64_t num_tokens, int64_t top_k, int64_t dim) override {
        cpu::permute_backward(dinp, dout, copy_to_row, num_tokens, top_k, dim);
    }
    void unpermute_forward(float* out, const float* inp, const float* weights,
                           const int32_t* copy_to_row, int64_t num_tokens, int64_t top_k,
                           int64_t dim) override {
        cpu::unpermute_forward(out, inp, weights, copy_to_row, num_tokens, top_k, dim);
    }
    void unpermute_backward(float* dinp, float* dweights, const float* dout, const float* inp,
                            const float* weights, const int32_t* copy_to_row, int64_t num_tokens,
                            int64_t top_k, int64_t dim) override {
        cpu::unpermute_backward(dinp, dweights, dout, inp, weights, copy_to_row, num_tokens, top_k,
                                dim);
    }
    void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                      const AdamWParams& hp) override {
        cpu::adamw_update(params, m, v, grads, n, hp);
    }
    double sum_squares(const float* x, int64_t n) override { return cpu::sum_squares(x, n); }
    void scale_inplace(float* x, int64_t n, float factor) override {
        cpu::scale_inplace(x, n, factor);
    }
};

}  // namespace

Backend& cpu_backend() {
    static CpuBackend backend;  // stateless: nothing in it changes after construction
    return backend;
}

}  // namespace moetron
