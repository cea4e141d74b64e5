// The op seam: every piece of math and data movement on tensors that model/, parallel/ and train/
// do goes through a Backend, and a Backend owns the memory its tensors live in. The CPU backend
// (kernels/cpu/cpu_backend.h) implements every op and is the reference; the CUDA backend
// (kernels/cuda/cuda_backend.h) implements what it has kernels for and throws
// OpNotImplemented for the rest, which the op-parity harness (tests/) reports as skipped.
//
// Conventions (kernels/README.md): pointers are into this backend's memory; outputs first, then
// inputs, then saved statistics, then dimensions; parameter gradients accumulate, activation
// gradients are written; a null output gradient skips its computation. Each op's semantics are
// documented once, at the CPU reference named beside it. Work is ordered by stream(): on the CPU
// every call has finished when it returns; on a GPU it runs in issue order on the stream, and
// the communicator calls that touch the same buffers take the same stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "moetron/core/stream.h"
#include "moetron/core/tensor.h"
#include "moetron/kernels/op_types.h"

namespace moetron {

class MemoryResource;  // core/arena.h

// Thrown by a backend for an op it has no kernel for (the CUDA backend, for now, for several).
class OpNotImplemented : public std::runtime_error {
  public:
    OpNotImplemented(std::string_view backend, std::string_view op);
};

class Backend {
  public:
    virtual ~Backend() = default;

    // ---- identity, memory, ordering ----
    virtual std::string_view name() const = 0;  // "cpu", "cuda"
    virtual Device device() const = 0;
    // One line for a run's header: what computes ("cpu: OpenBLAS 0.3.21 ... kernels Haswell",
    // "cuda: NVIDIA H200 (device 0, 139.8 GiB)"), plus a warning when the setup is known slow.
    virtual std::string describe() const = 0;
    // Where this backend's arenas come from (core/arena.h): host memory or cudaMalloc.
    virtual MemoryResource& memory() = 0;
    virtual Stream stream() const = 0;
    // Waits until every op issued so far has finished (nothing to wait for on the CPU).
    virtual void synchronize() = 0;
    // Copies between this backend's memory and the host, for set-up, checkpoints and tests (not
    // the step loop); on the CPU both are memcpy.
    virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
    virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;

    // ---- data movement (cpu/elementwise.h) ----
    virtual void copy(void* dst, const void* src, size_t bytes) = 0;
    virtual void zero(void* dst, size_t bytes) = 0;

    // ---- elementwise (cpu/elementwise.h) ----
    virtual void add_inplace(float* y, const float* x, int64_t n) = 0;
    virtual void axpy(float* y, float alpha, const float* x, int64_t n) = 0;
    virtual void add(float* out, const float* a, const float* b, int64_t n) = 0;

    // ---- GEMMs (cpu/matmul.h) ----
    virtual void matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                        bool trans_a, bool trans_b, float beta) = 0;
    virtual void linear_forward(float* out, const float* inp, const float* weight, int64_t num_rows,
                                int64_t in_dim, int64_t out_dim) = 0;
    // The backwards compute dinp (written) and dweight (accumulated); either may be null and is
    // then skipped (a zero-bubble schedule computes them apart: split_backward_backend.h).
    virtual void linear_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, int64_t num_rows, int64_t in_dim,
                                 int64_t out_dim) = 0;
    virtual void grouped_linear_forward(float* out, const float* inp, const float* weight,
                                        const int64_t* offsets, int64_t num_experts, int64_t in_dim,
                                        int64_t out_dim) = 0;
    virtual void grouped_linear_backward(float* dinp, float* dweight, const float* dout,
                                         const float* inp, const float* weight,
                                         const int64_t* offsets, int64_t num_experts,
                                         int64_t in_dim, int64_t out_dim) = 0;

    // ---- norms, activations, positions (cpu/rmsnorm.h, cpu/swiglu.h, cpu/rope.h) ----
    virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight,
                                 int64_t num_rows, int64_t dim, float eps) = 0;
    virtual void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                  const float* weight, const float* rstd, int64_t num_rows,
                                  int64_t dim) = 0;
    virtual void swiglu_forward(float* out, const float* inp, int64_t num_rows,
                                int64_t ffn_dim) = 0;
    virtual void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t num_rows,
                                 int64_t ffn_dim) = 0;
    virtual void rope_tables(float* cos, float* sin, int64_t seq_len, int64_t rope_dim,
                             float theta) = 0;
    virtual void rope_forward(float* x, const float* cos, const float* sin, int64_t num_tokens,
                              int64_t seq_len, int64_t num_heads, int64_t head_stride,
                              int64_t rope_offset, int64_t rope_dim) = 0;
    virtual void rope_backward(float* dx, const float* cos, const float* sin, int64_t num_tokens,
                               int64_t seq_len, int64_t num_heads, int64_t head_stride,
                               int64_t rope_offset, int64_t rope_dim) = 0;

    // ---- attention (cpu/attention.h) ----
    virtual void attention_forward(float* out, float* lse, const float* q, const float* k,
                                   const float* v, int64_t batch, int64_t seq_len,
                                   int64_t num_heads, int64_t qk_head_dim, int64_t v_head_dim,
                                   float scale) = 0;
    virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                    const float* q, const float* k, const float* v,
                                    const float* out, const float* lse, int64_t batch,
                                    int64_t seq_len, int64_t num_heads, int64_t qk_head_dim,
                                    int64_t v_head_dim, float scale) = 0;

    // ---- embedding and loss (cpu/embedding.h, cpu/cross_entropy.h) ----
    virtual void embedding_forward(float* out, const int32_t* tokens, const float* table,
                                   int64_t num_tokens, int64_t vocab_size, int64_t dim) = 0;
    virtual void embedding_backward(float* dtable, const float* dout, const int32_t* tokens,
                                    int64_t num_tokens, int64_t vocab_size, int64_t dim) = 0;
    virtual void embedding_part_forward(float* out, const int32_t* tokens, const float* table_part,
                                        int64_t num_tokens, int64_t vocab_first, int64_t part_vocab,
                                        int64_t dim) = 0;
    virtual void embedding_part_backward(float* dtable_part, const float* dout,
                                         const int32_t* tokens, int64_t num_tokens,
                                         int64_t vocab_first, int64_t part_vocab, int64_t dim) = 0;
    virtual CrossEntropyResult cross_entropy_forward(float* losses, float* lse, const float* logits,
                                                     const int32_t* targets, int64_t num_tokens,
                                                     int64_t vocab_size, int32_t ignore_index) = 0;
    virtual void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                        const int32_t* targets, int64_t num_tokens,
                                        int64_t vocab_size, int32_t ignore_index,
                                        float dloss_per_token) = 0;
    virtual void cross_entropy_part_max(float* row_max, const float* logits, int64_t num_tokens,
                                        int64_t part_vocab) = 0;
    virtual void cross_entropy_part_sums(double* sum_exp, double* target_logit, const float* logits,
                                         const float* row_max, const int32_t* targets,
                                         int64_t num_tokens, int64_t part_vocab,
                                         int64_t vocab_first, int32_t ignore_index) = 0;
    virtual void cross_entropy_part_backward(float* dlogits, const float* logits, const float* lse,
                                             const int32_t* targets, int64_t num_tokens,
                                             int64_t part_vocab, int64_t vocab_first,
                                             int32_t ignore_index, float dloss_per_token) = 0;

    // ---- routing and token permutation (cpu/router.h, cpu/permute.h) ----
    virtual void router_forward(int32_t* topk_ids, float* topk_weights, float* scores,
                                const float* logits, const float* bias,
                                const RouterShape& shape) = 0;
    virtual void router_backward(float* dlogits, const float* dtopk_weights,
                                 const float* dscores_extra, const float* scores,
                                 const int32_t* topk_ids, const RouterShape& shape) = 0;
    virtual void moe_permute_layout(int32_t* copy_to_row, int64_t* expert_offsets,
                                    const int32_t* topk_ids, int64_t num_tokens, int64_t top_k,
                                    int64_t num_experts) = 0;
    virtual void permute_forward(float* out, const float* inp, const int32_t* copy_to_row,
                                 int64_t num_tokens, int64_t top_k, int64_t dim) = 0;
    virtual void permute_backward(float* dinp, const float* dout, const int32_t* copy_to_row,
                                  int64_t num_tokens, int64_t top_k, int64_t dim) = 0;
    virtual void unpermute_forward(float* out, const float* inp, const float* weights,
                                   const int32_t* copy_to_row, int64_t num_tokens, int64_t top_k,
                                   int64_t dim) = 0;
    virtual void unpermute_backward(float* dinp, float* dweights, const float* dout,
                                    const float* inp, const float* weights,
                                    const int32_t* copy_to_row, int64_t num_tokens, int64_t top_k,
                                    int64_t dim) = 0;

    // ---- optimizer (cpu/adamw.h) ----
    virtual void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                              const AdamWParams& hp) = 0;
    // Sum of squares in double, returned to the host (the global norm adds these over buffers and
    // ranks).
    virtual double sum_squares(const float* x, int64_t n) = 0;
    virtual void scale_inplace(float* x, int64_t n, float factor) = 0;

    // ---- dispatch ops (cpu/dispatch_rows.h, cpu/dispatch_layout.h): the expert dispatch's row
    // movements around its all_to_all_v and the routing metadata before them ----
    virtual void dispatch_fan_out(void* send, void* recv, const void* input,
                                  const int32_t* slot_begin, const int32_t* row_slots,
                                  int64_t num_inputs, int64_t row_bytes,
                                  const SlotPlacement& own) = 0;
    virtual void dispatch_fan_in(float* input, const float* send, const float* recv,
                                 const int32_t* slot_begin, const int32_t* row_slots,
                                 int64_t num_inputs, int64_t width, const SlotPlacement& own,
                                 bool accumulate) = 0;
    virtual void dispatch_expand(float* expert_rows, const float* staging,
                                 const int32_t* copy_begin, const int32_t* copy_row,
                                 const float* copy_weight, int64_t num_staging, int64_t dim) = 0;
    virtual void dispatch_reduce(float* staging, const float* expert_rows,
                                 const int32_t* copy_begin, const int32_t* copy_row,
                                 const float* copy_weight, int64_t num_staging, int64_t dim) = 0;
    virtual void dispatch_weight_grads(float* dweights, const float* dout, const float* expert_out,
                                       const int32_t* copy_begin, const int32_t* copy_row,
                                       const int32_t* copy_choice, int64_t num_staging,
                                       int64_t top_k, int64_t dim) = 0;
    virtual void unpermute_add(float* out, const float* inp, const float* weights,
                               const int32_t* copy_to_row, int64_t num_tokens, int64_t top_k,
                               int64_t dim) = 0;
    virtual void dispatch_route_records(int32_t* records, const int32_t* topk_ids,
                                        const float* topk_weights, int64_t num_tokens,
                                        int64_t top_k, int64_t num_experts,
                                        int32_t source_rank) = 0;
    // Returned to the host (the dispatcher's statistics).
    virtual RoutingSpread dispatch_layout(int64_t* copies_per_rank, const int32_t* topk_ids,
                                          int64_t num_tokens, int64_t top_k,
                                          int64_t experts_per_rank, int64_t ranks_per_domain,
                                          int64_t num_ranks) = 0;
    // The number of rounds, returned to the host (it agrees on it with the other ranks).
    virtual int64_t dispatch_split_rounds(int64_t* ends, int64_t* copies_per_rank,
                                          const int32_t* topk_ids, int64_t num_tokens,
                                          int64_t top_k, int64_t experts_per_rank,
                                          int64_t num_ranks, int64_t max_copies_per_rank) = 0;
    virtual void dispatch_hop_layout(int32_t* slot_begin, int32_t* row_slots,
                                     int32_t* rows_per_peer, int32_t* first_slot_of_peer,
                                     const int32_t* records, int64_t num_inputs, int64_t top_k,
                                     int64_t first_expert, int64_t num_hop_experts,
                                     int64_t experts_per_peer, int64_t num_peers) = 0;
    // The number of expert rows R, returned to the host (it checks it against the capacity).
    virtual int64_t dispatch_expert_layout(int64_t* expert_offsets, int32_t* copy_begin,
                                           int32_t* copy_row, int32_t* copy_choice,
                                           float* copy_weight, int64_t* rows_by_source,
                                           const int32_t* records, int64_t num_staging,
                                           int64_t top_k, int64_t first_expert,
                                           int64_t num_local_experts, int64_t num_sources,
                                           int64_t capacity) = 0;

    // ---- model ops (cpu/mla_kv.h, cpu/row_copy.h, cpu/balance_loss.h, cpu/expert_load.h,
    // cpu/cross_entropy_combine.h, cpu/param_init.h) ----
    virtual void mla_kv_forward(float* k, float* v, const float* kv, const float* k_rope,
                                int64_t num_tokens, int64_t num_heads, int64_t nope_dim,
                                int64_t rope_dim, int64_t v_dim) = 0;
    virtual void mla_kv_backward(float* d_kv, float* d_k_rope, const float* dk, const float* dv,
                                 int64_t num_tokens, int64_t num_heads, int64_t nope_dim,
                                 int64_t rope_dim, int64_t v_dim) = 0;
    virtual void copy_rows_strided(float* dst, const float* src, int64_t num_rows, int64_t width,
                                   int64_t dst_stride, int64_t src_stride) = 0;
    virtual void shift_sequences(int32_t* out, const int32_t* inp, int64_t batch, int64_t seq_len,
                                 int64_t shift, int32_t fill) = 0;
    // Returns the sum over sequences to the host, as sum_squares.
    virtual double balance_loss_forward(float* load_fraction, const int32_t* topk_ids,
                                        const float* scores, int64_t batch, int64_t seq_len,
                                        int64_t num_experts, int64_t top_k) = 0;
    virtual void balance_loss_backward(float* d_scores, const float* scores,
                                       const float* load_fraction, int64_t batch, int64_t seq_len,
                                       int64_t num_experts, float loss_grad) = 0;
    virtual void count_expert_load(int64_t* counts, const int32_t* topk_ids, int64_t num_ids,
                                   int64_t num_experts) = 0;
    virtual void router_bias_update(float* bias, const int64_t* counts, int64_t num_experts,
                                    float gamma) = 0;
    virtual void cross_entropy_combine_max(float* row_max, const float* part_max, int64_t num_parts,
                                           int64_t num_tokens) = 0;
    virtual CrossEntropyResult cross_entropy_combine_losses(
        float* losses, float* lse, const double* sum_exp, const double* target_logit,
        const float* row_max, const int32_t* targets, int64_t num_tokens, int32_t ignore_index) = 0;
    virtual void init_normal(float* out, uint64_t seed, uint64_t name_hash, int64_t num_runs,
                             int64_t run_length, int64_t first_index, int64_t run_stride,
                             float stddev) = 0;
    virtual void fill(float* x, int64_t n, float value) = 0;

    // ---- machine probes (cpu/machine_probes.h): what `moetron calibrate` measures ----
    virtual void stream_triad(float* a, const float* b, const float* c, float s, int64_t n) = 0;
    virtual void exp_elementwise(float* out, const float* inp, int64_t n) = 0;
    virtual void empty_launch() = 0;

    // ---- low precision (cpu/quantize.h): the training recipes' FP8 block formats (E4M3
    // elements with E8M0 or float32 scales per tile) and bfloat16 rounding ----
    virtual void quantize_mxfp8(uint8_t* elements, uint8_t* scales, const float* x, int64_t rows,
                                int64_t cols, bool down_columns) = 0;
    virtual void dequantize_mxfp8(float* x, const uint8_t* elements, const uint8_t* scales,
                                  int64_t rows, int64_t cols, bool down_columns) = 0;
    virtual void quantize_fp8_blocks(uint8_t* elements, float* scales, const float* x, int64_t rows,
                                     int64_t cols, int64_t block_rows, int64_t block_cols) = 0;
    virtual void dequantize_fp8_blocks(float* x, const uint8_t* elements, const float* scales,
                                       int64_t rows, int64_t cols, int64_t block_rows,
                                       int64_t block_cols) = 0;
    virtual void round_to_bf16(float* out, const float* x, int64_t n) = 0;
};

// The CPU reference backend: stateless, so one shared instance serves every caller.
Backend& cpu_backend();

}  // namespace moetron
