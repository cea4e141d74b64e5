// The CPU reference backend: every op of kernels/backend.h, each forwarding to its kernel in
// kernels/cpu/ (float32 compute, OpenMP over rows, GEMMs through OpenBLAS).
#include <cstring>

#include "moetron/core/arena.h"
#include "moetron/kernels/backend.h"
#include "moetron/kernels/cpu/adamw.h"
#include "moetron/kernels/cpu/attention.h"
#include "moetron/kernels/cpu/balance_loss.h"
#include "moetron/kernels/cpu/blas_info.h"
#include "moetron/kernels/cpu/cross_entropy.h"
#include "moetron/kernels/cpu/cross_entropy_combine.h"
#include "moetron/kernels/cpu/dispatch_layout.h"
#include "moetron/kernels/cpu/dispatch_rows.h"
#include "moetron/kernels/cpu/elementwise.h"
#include "moetron/kernels/cpu/embedding.h"
#include "moetron/kernels/cpu/expert_load.h"
#include "moetron/kernels/cpu/machine_probes.h"
#include "moetron/kernels/cpu/matmul.h"
#include "moetron/kernels/cpu/mla_kv.h"
#include "moetron/kernels/cpu/param_init.h"
#include "moetron/kernels/cpu/permute.h"
#include "moetron/kernels/cpu/quantize.h"
#include "moetron/kernels/cpu/rmsnorm.h"
#include "moetron/kernels/cpu/rope.h"
#include "moetron/kernels/cpu/router.h"
#include "moetron/kernels/cpu/row_copy.h"
#include "moetron/kernels/cpu/swiglu.h"
#include "moetron/kernels/cpu/vector_isa.h"

namespace moetron {

namespace {

class CpuBackend final : public Backend {
  public:
    std::string_view name() const override { return "cpu"; }
    Device device() const override { return Device::cpu; }
    std::string describe() const override {
        return std::string("cpu: vector kernels ") + cpu::describe_vector_isa() + ", " +
               cpu::describe_blas();
    }
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

    // ---- dispatch ops ----
    void dispatch_fan_out(void* send, void* recv, const void* input, const int32_t* slot_begin,
                          const int32_t* row_slots, int64_t num_inputs, int64_t row_bytes,
                          const SlotPlacement& own) override {
        cpu::dispatch_fan_out(send, recv, input, slot_begin, row_slots, num_inputs, row_bytes, own);
    }
    void dispatch_fan_in(float* input, const float* send, const float* recv,
                         const int32_t* slot_begin, const int32_t* row_slots, int64_t num_inputs,
                         int64_t width, const SlotPlacement& own, bool accumulate) override {
        cpu::dispatch_fan_in(input, send, recv, slot_begin, row_slots, num_inputs, width, own,
                             accumulate);
    }
    void dispatch_expand(float* expert_rows, const float* staging, const int32_t* copy_begin,
                         const int32_t* copy_row, const float* copy_weight, int64_t num_staging,
                         int64_t dim) override {
        cpu::dispatch_expand(expert_rows, staging, copy_begin, copy_row, copy_weight, num_staging,
                             dim);
    }
    void dispatch_reduce(float* staging, const float* expert_rows, const int32_t* copy_begin,
                         const int32_t* copy_row, const float* copy_weight, int64_t num_staging,
                         int64_t dim) override {
        cpu::dispatch_reduce(staging, expert_rows, copy_begin, copy_row, copy_weight, num_staging,
                             dim);
    }
    void dispatch_weight_grads(float* dweights, const float* dout, const float* expert_out,
                               const int32_t* copy_begin, const int32_t* copy_row,
                               const int32_t* copy_choice, int64_t num_staging, int64_t top_k,
                               int64_t dim) override {
        cpu::dispatch_weight_grads(dweights, dout, expert_out, copy_begin, copy_row, copy_choice,
                                   num_staging, top_k, dim);
    }
    void unpermute_add(float* out, const float* inp, const float* weights,
                       const int32_t* copy_to_row, int64_t num_tokens, int64_t top_k,
                       int64_t dim) override {
        cpu::unpermute_add(out, inp, weights, copy_to_row, num_tokens, top_k, dim);
    }
    void dispatch_route_records(int32_t* records, const int32_t* topk_ids,
                                const float* topk_weights, int64_t num_tokens, int64_t top_k,
                                int64_t num_experts, int32_t source_rank) override {
        cpu::dispatch_route_records(records, topk_ids, topk_weights, num_tokens, top_k, num_experts,
                                    source_rank);
    }
    RoutingSpread dispatch_layout(int64_t* copies_per_rank, const int32_t* topk_ids,
                                  int64_t num_tokens, int64_t top_k, int64_t experts_per_rank,
                                  int64_t ranks_per_domain, int64_t num_ranks) override {
        return cpu::dispatch_layout(copies_per_rank, topk_ids, num_tokens, top_k, experts_per_rank,
                                    ranks_per_domain, num_ranks);
    }
    int64_t dispatch_split_rounds(int64_t* ends, int64_t* copies_per_rank, const int32_t* topk_ids,
                                  int64_t num_tokens, int64_t top_k, int64_t experts_per_rank,
                                  int64_t num_ranks, int64_t max_copies_per_rank) override {
        return cpu::dispatch_split_rounds(ends, copies_per_rank, topk_ids, num_tokens, top_k,
                                          experts_per_rank, num_ranks, max_copies_per_rank);
    }
    void dispatch_hop_layout(int32_t* slot_begin, int32_t* row_slots, int32_t* rows_per_peer,
                             int32_t* first_slot_of_peer, const int32_t* records,
                             int64_t num_inputs, int64_t top_k, int64_t first_expert,
                             int64_t num_hop_experts, int64_t experts_per_peer,
                             int64_t num_peers) override {
        cpu::dispatch_hop_layout(slot_begin, row_slots, rows_per_peer, first_slot_of_peer, records,
                                 num_inputs, top_k, first_expert, num_hop_experts, experts_per_peer,
                                 num_peers);
    }
    int64_t dispatch_expert_layout(int64_t* expert_offsets, int32_t* copy_begin, int32_t* copy_row,
                                   int32_t* copy_choice, float* copy_weight,
                                   int64_t* rows_by_source, const int32_t* records,
                                   int64_t num_staging, int64_t top_k, int64_t first_expert,
                                   int64_t num_local_experts, int64_t num_sources,
                                   int64_t capacity) override {
        return cpu::dispatch_expert_layout(expert_offsets, copy_begin, copy_row, copy_choice,
                                           copy_weight, rows_by_source, records, num_staging, top_k,
                                           first_expert, num_local_experts, num_sources, capacity);
    }

    // ---- model ops ----
    void mla_kv_forward(float* k, float* v, const float* kv, const float* k_rope,
                        int64_t num_tokens, int64_t num_heads, int64_t nope_dim, int64_t rope_dim,
                        int64_t v_dim) override {
        cpu::mla_kv_forward(k, v, kv, k_rope, num_tokens, num_heads, nope_dim, rope_dim, v_dim);
    }
    void mla_kv_backward(float* d_kv, float* d_k_rope, const float* dk, const float* dv,
                         int64_t num_tokens, int64_t num_heads, int64_t nope_dim, int64_t rope_dim,
                         int64_t v_dim) override {
        cpu::mla_kv_backward(d_kv, d_k_rope, dk, dv, num_tokens, num_heads, nope_dim, rope_dim,
                             v_dim);
    }
    void copy_rows_strided(float* dst, const float* src, int64_t num_rows, int64_t width,
                           int64_t dst_stride, int64_t src_stride) override {
        cpu::copy_rows_strided(dst, src, num_rows, width, dst_stride, src_stride);
    }
    void shift_sequences(int32_t* out, const int32_t* inp, int64_t batch, int64_t seq_len,
                         int64_t shift, int32_t fill) override {
        cpu::shift_sequences(out, inp, batch, seq_len, shift, fill);
    }
    double balance_loss_forward(float* load_fraction, const int32_t* topk_ids, const float* scores,
                                int64_t batch, int64_t seq_len, int64_t num_experts,
                                int64_t top_k) override {
        return cpu::balance_loss_forward(load_fraction, topk_ids, scores, batch, seq_len,
                                         num_experts, top_k);
    }
    void balance_loss_backward(float* d_scores, const float* scores, const float* load_fraction,
                               int64_t batch, int64_t seq_len, int64_t num_experts,
                               float loss_grad) override {
        cpu::balance_loss_backward(d_scores, scores, load_fraction, batch, seq_len, num_experts,
                                   loss_grad);
    }
    void count_expert_load(int64_t* counts, const int32_t* topk_ids, int64_t num_ids,
                           int64_t num_experts) override {
        cpu::count_expert_load(counts, topk_ids, num_ids, num_experts);
    }
    void router_bias_update(float* bias, const int64_t* counts, int64_t num_experts,
                            float gamma) override {
        cpu::router_bias_update(bias, counts, num_experts, gamma);
    }
    void cross_entropy_combine_max(float* row_max, const float* part_max, int64_t num_parts,
                                   int64_t num_tokens) override {
        cpu::cross_entropy_combine_max(row_max, part_max, num_parts, num_tokens);
    }
    CrossEntropyResult cross_entropy_combine_losses(float* losses, float* lse,
                                                    const double* sum_exp,
                                                    const double* target_logit,
                                                    const float* row_max, const int32_t* targets,
                                                    int64_t num_tokens,
                                                    int32_t ignore_index) override {
        return cpu::cross_entropy_combine_losses(losses, lse, sum_exp, target_logit, row_max,
                                                 targets, num_tokens, ignore_index);
    }
    void init_normal(float* out, uint64_t seed, uint64_t name_hash, int64_t num_runs,
                     int64_t run_length, int64_t first_index, int64_t run_stride,
                     float stddev) override {
        cpu::init_normal(out, seed, name_hash, num_runs, run_length, first_index, run_stride,
                         stddev);
    }
    void fill(float* x, int64_t n, float value) override { cpu::fill(x, n, value); }

    // ---- machine probes ----
    void stream_triad(float* a, const float* b, const float* c, float s, int64_t n) override {
        cpu::stream_triad(a, b, c, s, n);
    }
    void exp_elementwise(float* out, const float* inp, int64_t n) override {
        cpu::exp_elementwise(out, inp, n);
    }
    void empty_launch() override { cpu::empty_launch(); }

    void quantize_mxfp8(uint8_t* elements, uint8_t* scales, const float* x, int64_t rows,
                        int64_t cols, bool down_columns) override {
        cpu::quantize_mxfp8(elements, scales, x, rows, cols, down_columns);
    }
    void dequantize_mxfp8(float* x, const uint8_t* elements, const uint8_t* scales, int64_t rows,
                          int64_t cols, bool down_columns) override {
        cpu::dequantize_mxfp8(x, elements, scales, rows, cols, down_columns);
    }
    void quantize_fp8_blocks(uint8_t* elements, float* scales, const float* x, int64_t rows,
                             int64_t cols, int64_t block_rows, int64_t block_cols) override {
        cpu::quantize_fp8_blocks(elements, scales, x, rows, cols, block_rows, block_cols);
    }
    void dequantize_fp8_blocks(float* x, const uint8_t* elements, const float* scales, int64_t rows,
                               int64_t cols, int64_t block_rows, int64_t block_cols) override {
        cpu::dequantize_fp8_blocks(x, elements, scales, rows, cols, block_rows, block_cols);
    }
    void round_to_bf16(float* out, const float* x, int64_t n) override {
        cpu::round_to_bf16(out, x, n);
    }
};

}  // namespace

Backend& cpu_backend() {
    // Chosen here, so that a bad MOETRON_CPU_ISA is reported before a kernel first asks for it
    // inside an OpenMP region, where an exception cannot leave.
    cpu::vector_isa();
    static CpuBackend backend;  // stateless: nothing in it changes after construction
    return backend;
}

}  // namespace moetron
