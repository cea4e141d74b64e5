// ProfilingBackend: a decorator over any Backend that forwards every op to it unchanged, counts the
// calls per op and accumulates each op's wall time, so that a training step's time can be broken
// down by op and by category (attention, GEMMs, grouped GEMMs, ...) with format_op_profile().
//
// Timing: on the CPU every op has finished when it returns, so the time around the call is the
// op's. On a device backend ops only enqueue work; there the decorator synchronizes before and
// after each op to time it, which serializes the stream (no overlap of compute with
// communication) -- profile for the breakdown, not for the step time.
//
// Nothing allocates while profiling: the totals live in a fixed array indexed by op. The numbers
// are read (format_op_profile) after the measured steps, never printed inside them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "moetron/kernels/backend.h"

namespace moetron {

// The groups a step's time is reported in.
enum class OpCategory : uint8_t {
    attention,         // attention, MLA's key/value assembly, RoPE
    gemm,              // dense linears and matmuls
    grouped_gemm,      // the experts' grouped linears
    router,            // routing, balance loss, expert loads, router bias
    permute_dispatch,  // token permutation and the expert dispatcher's row movements and layouts
    norm,              // RMSNorm
    activation,        // SwiGLU
    embedding,         // embedding lookups and their gradients
    cross_entropy,     // the loss, whole or vocabulary-parallel
    optimizer,         // AdamW, gradient norm and clipping
    quantize,          // the low-precision recipes' quantization and dequantization
    other,             // copies, fills, initialization, host transfers, machine probes
};
inline constexpr size_t kNumOpCategories = static_cast<size_t>(OpCategory::other) + 1;
std::string_view op_category_name(OpCategory category);

struct ProfiledOp {
    std::string_view name;  // the Backend member's name
    OpCategory category;
};
// Every op of Backend that the decorator forwards, once each, with its category (the identity
// members name, device, describe and stream are not ops).
inline constexpr size_t kNumProfiledOps = 73;
std::span<const ProfiledOp> profiled_ops();

class ProfilingBackend final : public Backend {
  public:
    struct OpTotals {
        int64_t calls = 0;
        double seconds = 0;
    };

    explicit ProfilingBackend(Backend& inner = cpu_backend());

    // Calls of `op` since the last reset (0 for one never called); throws for a name that is no
    // Backend op.
    int64_t calls(std::string_view op) const;
    // Totals of profiled_ops()[i].
    const OpTotals& totals(size_t op_index) const { return totals_[op_index]; }
    void reset();
    Backend& inner() const { return inner_; }

    std::string_view name() const override { return inner_.name(); }
    Device device() const override { return inner_.device(); }
    std::string describe() const override { return inner_.describe(); }
    Stream stream() const override { return inner_.stream(); }
    MemoryResource& memory() override;
    void synchronize() override;
    void copy_to_host(void* host_dst, const void* src, size_t bytes) override;
    void copy_from_host(void* dst, const void* host_src, size_t bytes) override;
    void copy(void* dst, const void* src, size_t bytes) override;
    void zero(void* dst, size_t bytes) override;
    void add_inplace(float* y, const float* x, int64_t n) override;
    void axpy(float* y, float alpha, const float* x, int64_t n) override;
    void add(float* out, const float* a, const float* b, int64_t n) override;
    void matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                bool trans_a, bool trans_b, float beta) override;
    void linear_forward(float* out, const float* inp, const float* weight, int64_t num_rows,
                        int64_t in_dim, int64_t out_dim) override;
    void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                         const float* weight, int64_t num_rows, int64_t in_dim,
                         int64_t out_dim) override;
    void grouped_linear_forward(float* out, const float* inp, const float* weight,
                                const int64_t* offsets, int64_t num_experts, int64_t in_dim,
                                int64_t out_dim) override;
    void grouped_linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, const int64_t* offsets, int64_t num_experts,
                                 int64_t in_dim, int64_t out_dim) override;
    void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                         int64_t num_rows, int64_t dim, float eps) override;
    void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                          const float* weight, const float* rstd, int64_t num_rows,
                          int64_t dim) override;
    void swiglu_forward(float* out, const float* inp, int64_t num_rows, int64_t ffn_dim) override;
    void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t num_rows,
                         int64_t ffn_dim) override;
    void rope_tables(float* cos, float* sin, int64_t seq_len, int64_t rope_dim,
                     float theta) override;
    void rope_forward(float* x, const float* cos, const float* sin, int64_t num_tokens,
                      int64_t seq_len, int64_t num_heads, int64_t head_stride, int64_t rope_offset,
                      int64_t rope_dim) override;
    void rope_backward(float* dx, const float* cos, const float* sin, int64_t num_tokens,
                       int64_t seq_len, int64_t num_heads, int64_t head_stride, int64_t rope_offset,
                       int64_t rope_dim) override;
    void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                           int64_t batch, int64_t seq_len, int64_t num_heads, int64_t qk_head_dim,
                           int64_t v_head_dim, float scale) override;
    void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, const float* out, const float* lse,
                            int64_t batch, int64_t seq_len, int64_t num_heads, int64_t qk_head_dim,
                            int64_t v_head_dim, float scale) override;
    void embedding_forward(float* out, const int32_t* tokens, const float* table,
                           int64_t num_tokens, int64_t vocab_size, int64_t dim) override;
    void embedding_backward(float* dtable, const float* dout, const int32_t* tokens,
                            int64_t num_tokens, int64_t vocab_size, int64_t dim) override;
    void embedding_part_forward(float* out, const int32_t* tokens, const float* table_part,
                                int64_t num_tokens, int64_t vocab_first, int64_t part_vocab,
                                int64_t dim) override;
    void embedding_part_backward(float* dtable_part, const float* dout, const int32_t* tokens,
                                 int64_t num_tokens, int64_t vocab_first, int64_t part_vocab,
                                 int64_t dim) override;
    CrossEntropyResult cross_entropy_forward(float* losses, float* lse, const float* logits,
                                             const int32_t* targets, int64_t num_tokens,
                                             int64_t vocab_size, int32_t ignore_index) override;
    void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                const int32_t* targets, int64_t num_tokens, int64_t vocab_size,
                                int32_t ignore_index, float dloss_per_token) override;
    void cross_entropy_part_max(float* row_max, const float* logits, int64_t num_tokens,
                                int64_t part_vocab) override;
    void cross_entropy_part_sums(double* sum_exp, double* target_logit, const float* logits,
                                 const float* row_max, const int32_t* targets, int64_t num_tokens,
                                 int64_t part_vocab, int64_t vocab_first,
                                 int32_t ignore_index) override;
    void cross_entropy_part_backward(float* dlogits, const float* logits, const float* lse,
                                     const int32_t* targets, int64_t num_tokens, int64_t part_vocab,
                                     int64_t vocab_first, int32_t ignore_index,
                                     float dloss_per_token) override;
    void router_forward(int32_t* topk_ids, float* topk_weights, float* scores, const float* logits,
                        const float* bias, const RouterShape& shape) override;
    void router_backward(float* dlogits, const float* dtopk_weights, const float* dscores_extra,
                         const float* scores, const int32_t* topk_ids,
                         const RouterShape& shape) override;
    void moe_permute_layout(int32_t* copy_to_row, int64_t* expert_offsets, const int32_t* topk_ids,
                            int64_t num_tokens, int64_t top_k, int64_t num_experts) override;
    void permute_forward(float* out, const float* inp, const int32_t* copy_to_row,
                         int64_t num_tokens, int64_t top_k, int64_t dim) override;
    void permute_backward(float* dinp, const float* dout, const int32_t* copy_to_row,
                          int64_t num_tokens, int64_t top_k, int64_t dim) override;
    void unpermute_forward(float* out, const float* inp, const float* weights,
                           const int32_t* copy_to_row, int64_t num_tokens, int64_t top_k,
                           int64_t dim) override;
    void unpermute_backward(float* dinp, float* dweights, const float* dout, const float* inp,
                            const float* weights, const int32_t* copy_to_row, int64_t num_tokens,
                            int64_t top_k, int64_t dim) override;
    void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                      const AdamWParams& hp) override;
    double sum_squares(const float* x, int64_t n) override;
    void scale_inplace(float* x, int64_t n, float factor) override;
    void dispatch_fan_out(void* send, void* recv, const void* input, const int32_t* slot_begin,
                          const int32_t* row_slots, int64_t num_inputs, int64_t row_bytes,
                          const SlotPlacement& own) override;
    void dispatch_fan_in(float* input, const float* send, const float* recv,
                         const int32_t* slot_begin, const int32_t* row_slots, int64_t num_inputs,
                         int64_t width, const SlotPlacement& own, bool accumulate) override;
    void dispatch_expand(float* expert_rows, const float* staging, const int32_t* copy_begin,
                         const int32_t* copy_row, const float* copy_weight, int64_t num_staging,
                         int64_t dim) override;
    void dispatch_reduce(float* staging, const float* expert_rows, const int32_t* copy_begin,
                         const int32_t* copy_row, const float* copy_weight, int64_t num_staging,
                         int64_t dim) override;
    void dispatch_weight_grads(float* dweights, const float* dout, const float* expert_out,
                               const int32_t* copy_begin, const int32_t* copy_row,
                               const int32_t* copy_choice, int64_t num_staging, int64_t top_k,
                               int64_t dim) override;
    void unpermute_add(float* out, const float* inp, const float* weights,
                       const int32_t* copy_to_row, int64_t num_tokens, int64_t top_k,
                       int64_t dim) override;
    void dispatch_route_records(int32_t* records, const int32_t* topk_ids,
                                const float* topk_weights, int64_t num_tokens, int64_t top_k,
                                int64_t num_experts, int32_t source_rank) override;
    RoutingSpread dispatch_layout(int64_t* copies_per_rank, const int32_t* topk_ids,
                                  int64_t num_tokens, int64_t top_k, int64_t experts_per_rank,
                                  int64_t ranks_per_domain, int64_t num_ranks) override;
    int64_t dispatch_split_rounds(int64_t* ends, int64_t* copies_per_rank, const int32_t* topk_ids,
                                  int64_t num_tokens, int64_t top_k, int64_t experts_per_rank,
                                  int64_t num_ranks, int64_t max_copies_per_rank) override;
    void dispatch_hop_layout(int32_t* slot_begin, int32_t* row_slots, int32_t* rows_per_peer,
                             int32_t* first_slot_of_peer, const int32_t* records,
                             int64_t num_inputs, int64_t top_k, int64_t first_expert,
                             int64_t num_hop_experts, int64_t experts_per_peer,
                             int64_t num_peers) override;
    int64_t dispatch_expert_layout(int64_t* expert_offsets, int32_t* copy_begin, int32_t* copy_row,
                                   int32_t* copy_choice, float* copy_weight,
                                   int64_t* rows_by_source, const int32_t* records,
                                   int64_t num_staging, int64_t top_k, int64_t first_expert,
                                   int64_t num_local_experts, int64_t num_sources,
                                   int64_t capacity) override;
    void mla_kv_forward(float* k, float* v, const float* kv, const float* k_rope,
                        int64_t num_tokens, int64_t num_heads, int64_t nope_dim, int64_t rope_dim,
                        int64_t v_dim) override;
    void mla_kv_backward(float* d_kv, float* d_k_rope, const float* dk, const float* dv,
                         int64_t num_tokens, int64_t num_heads, int64_t nope_dim, int64_t rope_dim,
                         int64_t v_dim) override;
    void copy_rows_strided(float* dst, const float* src, int64_t num_rows, int64_t width,
                           int64_t dst_stride, int64_t src_stride) override;
    void shift_sequences(int32_t* out, const int32_t* inp, int64_t batch, int64_t seq_len,
                         int64_t shift, int32_t fill) override;
    double balance_loss_forward(float* load_fraction, const int32_t* topk_ids, const float* scores,
                                int64_t batch, int64_t seq_len, int64_t num_experts,
                                int64_t top_k) override;
    void balance_loss_backward(float* d_scores, const float* scores, const float* load_fraction,
                               int64_t batch, int64_t seq_len, int64_t num_experts,
                               float loss_grad) override;
    void count_expert_load(int64_t* counts, const int32_t* topk_ids, int64_t num_ids,
                           int64_t num_experts) override;
    void router_bias_update(float* bias, const int64_t* counts, int64_t num_experts,
                            float gamma) override;
    void cross_entropy_combine_max(float* row_max, const float* part_max, int64_t num_parts,
                                   int64_t num_tokens) override;
    CrossEntropyResult cross_entropy_combine_losses(float* losses, float* lse,
                                                    const double* sum_exp,
                                                    const double* target_logit,
                                                    const float* row_max, const int32_t* targets,
                                                    int64_t num_tokens,
                                                    int32_t ignore_index) override;
    void init_normal(float* out, uint64_t seed, uint64_t name_hash, int64_t num_runs,
                     int64_t run_length, int64_t first_index, int64_t run_stride,
                     float stddev) override;
    void fill(float* x, int64_t n, float value) override;
    void stream_triad(float* a, const float* b, const float* c, float s, int64_t n) override;
    void exp_elementwise(float* out, const float* inp, int64_t n) override;
    void empty_launch() override;
    void quantize_mxfp8(uint8_t* elements, uint8_t* scales, const float* x, int64_t rows,
                        int64_t cols, bool down_columns) override;
    void dequantize_mxfp8(float* x, const uint8_t* elements, const uint8_t* scales, int64_t rows,
                          int64_t cols, bool down_columns) override;
    void quantize_fp8_blocks(uint8_t* elements, float* scales, const float* x, int64_t rows,
                             int64_t cols, int64_t block_rows, int64_t block_cols) override;
    void dequantize_fp8_blocks(float* x, const uint8_t* elements, const float* scales, int64_t rows,
                               int64_t cols, int64_t block_rows, int64_t block_cols) override;
    void round_to_bf16(float* out, const float* x, int64_t n) override;

  private:
    template <typename Call>
    decltype(auto) timed(size_t op_index, Call&& call);

    Backend& inner_;
    const bool synchronize_around_ops_;  // a device backend: ops are asynchronous
    std::array<OpTotals, kNumProfiledOps> totals_{};
};

// The table of where a step's time goes: per category and, under each, per op, in ms per step,
// % of the step and calls per step, for totals accumulated over `steps` steps that took
// `step_seconds` in all (ops the backend does not see -- communication, host code -- make up
// the rest of the step).
std::string format_op_profile(const ProfilingBackend& profile, int64_t steps, double step_seconds);

}  // namespace moetron
