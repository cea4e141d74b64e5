#include "moetron/kernels/profiling_backend.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "moetron/core/error.h"

namespace moetron {
namespace {

constexpr std::array<ProfiledOp, kNumProfiledOps> kProfiledOps{{
    {"memory", OpCategory::other},
    {"synchronize", OpCategory::other},
    {"copy_to_host", OpCategory::other},
    {"copy_from_host", OpCategory::other},
    {"copy", OpCategory::other},
    {"zero", OpCategory::other},
    {"add_inplace", OpCategory::other},
    {"axpy", OpCategory::other},
    {"add", OpCategory::other},
    {"matmul", OpCategory::gemm},
    {"linear_forward", OpCategory::gemm},
    {"linear_backward", OpCategory::gemm},
    {"grouped_linear_forward", OpCategory::grouped_gemm},
    {"grouped_linear_backward", OpCategory::grouped_gemm},
    {"rmsnorm_forward", OpCategory::norm},
    {"rmsnorm_backward", OpCategory::norm},
    {"swiglu_forward", OpCategory::activation},
    {"swiglu_backward", OpCategory::activation},
    {"rope_tables", OpCategory::attention},
    {"rope_forward", OpCategory::attention},
    {"rope_backward", OpCategory::attention},
    {"attention_forward", OpCategory::attention},
    {"attention_backward", OpCategory::attention},
    {"embedding_forward", OpCategory::embedding},
    {"embedding_backward", OpCategory::embedding},
    {"embedding_part_forward", OpCategory::embedding},
    {"embedding_part_backward", OpCategory::embedding},
    {"cross_entropy_forward", OpCategory::cross_entropy},
    {"cross_entropy_backward", OpCategory::cross_entropy},
    {"cross_entropy_part_max", OpCategory::cross_entropy},
    {"cross_entropy_part_sums", OpCategory::cross_entropy},
    {"cross_entropy_part_backward", OpCategory::cross_entropy},
    {"router_forward", OpCategory::router},
    {"router_backward", OpCategory::router},
    {"moe_permute_layout", OpCategory::permute_dispatch},
    {"permute_forward", OpCategory::permute_dispatch},
    {"permute_backward", OpCategory::permute_dispatch},
    {"unpermute_forward", OpCategory::permute_dispatch},
    {"unpermute_backward", OpCategory::permute_dispatch},
    {"adamw_update", OpCategory::optimizer},
    {"sum_squares", OpCategory::optimizer},
    {"scale_inplace", OpCategory::optimizer},
    {"dispatch_fan_out", OpCategory::permute_dispatch},
    {"dispatch_fan_in", OpCategory::permute_dispatch},
    {"dispatch_expand", OpCategory::permute_dispatch},
    {"dispatch_reduce", OpCategory::permute_dispatch},
    {"dispatch_weight_grads", OpCategory::permute_dispatch},
    {"unpermute_add", OpCategory::permute_dispatch},
    {"dispatch_route_records", OpCategory::permute_dispatch},
    {"dispatch_layout", OpCategory::permute_dispatch},
    {"dispatch_split_rounds", OpCategory::permute_dispatch},
    {"dispatch_hop_layout", OpCategory::permute_dispatch},
    {"dispatch_expert_layout", OpCategory::permute_dispatch},
    {"mla_kv_forward", OpCategory::attention},
    {"mla_kv_backward", OpCategory::attention},
    {"copy_rows_strided", OpCategory::other},
    {"shift_sequences", OpCategory::other},
    {"balance_loss_forward", OpCategory::router},
    {"balance_loss_backward", OpCategory::router},
    {"count_expert_load", OpCategory::router},
    {"router_bias_update", OpCategory::router},
    {"cross_entropy_combine_max", OpCategory::cross_entropy},
    {"cross_entropy_combine_losses", OpCategory::cross_entropy},
    {"init_normal", OpCategory::other},
    {"fill", OpCategory::other},
    {"stream_triad", OpCategory::other},
    {"exp_elementwise", OpCategory::other},
    {"empty_launch", OpCategory::other},
    {"quantize_mxfp8", OpCategory::quantize},
    {"dequantize_mxfp8", OpCategory::quantize},
    {"quantize_fp8_blocks", OpCategory::quantize},
    {"dequantize_fp8_blocks", OpCategory::quantize},
    {"round_to_bf16", OpCategory::quantize},
}};

// The index of an op in kProfiledOps, at compile time: a forwarding member whose name is missing
// from the table does not compile.
consteval size_t op_index(std::string_view op) {
    for (size_t i = 0; i < kProfiledOps.size(); ++i) {
        if (kProfiledOps[i].name == op) return i;
    }
    throw "op missing from kProfiledOps";
}

}  // namespace

std::string_view op_category_name(OpCategory category) {
    switch (category) {
        case OpCategory::attention:
            return "attention";
        case OpCategory::gemm:
            return "GEMMs";
        case OpCategory::grouped_gemm:
            return "grouped GEMMs";
        case OpCategory::router:
            return "router";
        case OpCategory::permute_dispatch:
            return "permute/dispatch";
        case OpCategory::norm:
            return "norms";
        case OpCategory::activation:
            return "activations";
        case OpCategory::embedding:
            return "embedding";
        case OpCategory::cross_entropy:
            return "cross-entropy";
        case OpCategory::optimizer:
            return "optimizer";
        case OpCategory::quantize:
            return "quantize";
        case OpCategory::other:
            return "other";
    }
    return "?";
}

std::span<const ProfiledOp> profiled_ops() {
    return kProfiledOps;
}

ProfilingBackend::ProfilingBackend(Backend& inner)
    : inner_(inner), synchronize_around_ops_(inner.device() != Device::cpu) {}

int64_t ProfilingBackend::calls(std::string_view op) const {
    for (size_t i = 0; i < kProfiledOps.size(); ++i) {
        if (kProfiledOps[i].name == op) return totals_[i].calls;
    }
    throw std::invalid_argument(fmt::format("'{}' is not a Backend op", op));
}

void ProfilingBackend::reset() {
    totals_.fill(OpTotals{});
}

template <typename Call>
decltype(auto) ProfilingBackend::timed(size_t op_index, Call&& call) {
    if (synchronize_around_ops_) inner_.synchronize();
    const auto start = std::chrono::steady_clock::now();
    const auto account = [&] {
        if (synchronize_around_ops_) inner_.synchronize();
        OpTotals& t = totals_[op_index];
        t.calls += 1;
        t.seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    if constexpr (std::is_void_v<decltype(call())>) {
        call();
        account();
    } else {
        auto result = call();
        account();
        return result;
    }
}

// Handing out the memory resource is no op to time; counted only.
MemoryResource& ProfilingBackend::memory() {
    totals_[op_index("memory")].calls += 1;
    return inner_.memory();
}

void ProfilingBackend::synchronize() {
    timed(op_index("synchronize"), [&] { inner_.synchronize(); });
}

void ProfilingBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
    timed(op_index("copy_to_host"), [&] { inner_.copy_to_host(host_dst, src, bytes); });
}

void ProfilingBackend::copy_from_host(void* dst, const void* host_src, size_t bytes) {
    timed(op_index("copy_from_host"), [&] { inner_.copy_from_host(dst, host_src, bytes); });
}

void ProfilingBackend::copy(void* dst, const void* src, size_t bytes) {
    timed(op_index("copy"), [&] { inner_.copy(dst, src, bytes); });
}

void ProfilingBackend::zero(void* dst, size_t bytes) {
    timed(op_index("zero"), [&] { inner_.zero(dst, bytes); });
}

void ProfilingBackend::add_inplace(float* y, const float* x, int64_t n) {
    timed(op_index("add_inplace"), [&] { inner_.add_inplace(y, x, n); });
}

void ProfilingBackend::axpy(float* y, float alpha, const float* x, int64_t n) {
    timed(op_index("axpy"), [&] { inner_.axpy(y, alpha, x, n); });
}

void ProfilingBackend::add(float* out, const float* a, const float* b, int64_t n) {
    timed(op_index("add"), [&] { inner_.add(out, a, b, n); });
}

void ProfilingBackend::matmul(float* c, const float* a, const float* b, int64_t m, int64_t n,
                              int64_t k, bool trans_a, bool trans_b, float beta) {
    timed(op_index("matmul"), [&] { inner_.matmul(c, a, b, m, n, k, trans_a, trans_b, beta); });
}

void ProfilingBackend::linear_forward(float* out, const float* inp, const float* weight,
                                      int64_t num_rows, int64_t in_dim, int64_t out_dim) {
    timed(op_index("linear_forward"),
          [&] { inner_.linear_forward(out, inp, weight, num_rows, in_dim, out_dim); });
}

void ProfilingBackend::linear_backward(float* dinp, float* dweight, const float* dout,
                                       const float* inp, const float* weight, int64_t num_rows,
                                       int64_t in_dim, int64_t out_dim) {
    timed(op_index("linear_backward"), [&] {
        inner_.linear_backward(dinp, dweight, dout, inp, weight, num_rows, in_dim, out_dim);
    });
}

void ProfilingBackend::grouped_linear_forward(float* out, const float* inp, const float* weight,
                                              const int64_t* offsets, int64_t num_experts,
                                              int64_t in_dim, int64_t out_dim) {
    timed(op_index("grouped_linear_forward"), [&] {
        inner_.grouped_linear_forward(out, inp, weight, offsets, num_experts, in_dim, out_dim);
    });
}

void ProfilingBackend::grouped_linear_backward(float* dinp, float* dweight, const float* dout,
                                               const float* inp, const float* weight,
                                               const int64_t* offsets, int64_t num_experts,
                                               int64_t in_dim, int64_t out_dim) {
    timed(op_index("grouped_linear_backward"), [&] {
        inner_.grouped_linear_backward(dinp, dweight, dout, inp, weight, offsets, num_experts,
                                       in_dim, out_dim);
    });
}

void ProfilingBackend::rmsnorm_forward(float* out, float* rstd, const float* inp,
                                       const float* weight, int64_t num_rows, int64_t dim,
                                       float eps) {
    timed(op_index("rmsnorm_forward"),
          [&] { inner_.rmsnorm_forward(out, rstd, inp, weight, num_rows, dim, eps); });
}

void ProfilingBackend::rmsnorm_backward(float* dinp, float* dweight, const float* dout,
                                        const float* inp, const float* weight, const float* rstd,
                                        int64_t num_rows, int64_t dim) {
    timed(op_index("rmsnorm_backward"),
          [&] { inner_.rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, num_rows, dim); });
}

void ProfilingBackend::swiglu_forward(float* out, const float* inp, int64_t num_rows,
                                      int64_t ffn_dim) {
    timed(op_index("swiglu_forward"), [&] { inner_.swiglu_forward(out, inp, num_rows, ffn_dim); });
}

void ProfilingBackend::swiglu_backward(float* dinp, const float* dout, const float* inp,
                                       int64_t num_rows, int64_t ffn_dim) {
    timed(op_index("swiglu_backward"),
          [&] { inner_.swiglu_backward(dinp, dout, inp, num_rows, ffn_dim); });
}

void ProfilingBackend::rope_tables(float* cos, float* sin, int64_t seq_len, int64_t rope_dim,
                                   float theta) {
    timed(op_index("rope_tables"), [&] { inner_.rope_tables(cos, sin, seq_len, rope_dim, theta); });
}

void ProfilingBackend::rope_forward(float* x, const float* cos, const float* sin,
                                    int64_t num_tokens, int64_t seq_len, int64_t num_heads,
                                    int64_t head_stride, int64_t rope_offset, int64_t rope_dim) {
    timed(op_index("rope_forward"), [&] {
        inner_.rope_forward(x, cos, sin, num_tokens, seq_len, num_heads, head_stride, rope_offset,
                            rope_dim);
    });
}

void ProfilingBackend::rope_backward(float* dx, const float* cos, const float* sin,
                                     int64_t num_tokens, int64_t seq_len, int64_t num_heads,
                                     int64_t head_stride, int64_t rope_offset, int64_t rope_dim) {
    timed(op_index("rope_backward"), [&] {
        inner_.rope_backward(dx, cos, sin, num_tokens, seq_len, num_heads, head_stride, rope_offset,
                             rope_dim);
    });
}

void ProfilingBackend::attention_forward(float* out, float* lse, const float* q, const float* k,
                                         const float* v, int64_t batch, int64_t seq_len,
                                         int64_t num_heads, int64_t qk_head_dim, int64_t v_head_dim,
                                         float scale) {
    timed(op_index("attention_forward"), [&] {
        inner_.attention_forward(out, lse, q, k, v, batch, seq_len, num_heads, qk_head_dim,
                                 v_head_dim, scale);
    });
}

void ProfilingBackend::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                          const float* q, const float* k, const float* v,
                                          const float* out, const float* lse, int64_t batch,
                                          int64_t seq_len, int64_t num_heads, int64_t qk_head_dim,
                                          int64_t v_head_dim, float scale) {
    timed(op_index("attention_backward"), [&] {
        inner_.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, batch, seq_len, num_heads,
                                  qk_head_dim, v_head_dim, scale);
    });
}

void ProfilingBackend::embedding_forward(float* out, const int32_t* tokens, const float* table,
                                         int64_t num_tokens, int64_t vocab_size, int64_t dim) {
    timed(op_index("embedding_forward"),
          [&] { inner_.embedding_forward(out, tokens, table, num_tokens, vocab_size, dim); });
}

void ProfilingBackend::embedding_backward(float* dtable, const float* dout, const int32_t* tokens,
                                          int64_t num_tokens, int64_t vocab_size, int64_t dim) {
    timed(op_index("embedding_backward"),
          [&] { inner_.embedding_backward(dtable, dout, tokens, num_tokens, vocab_size, dim); });
}

void ProfilingBackend::embedding_part_forward(float* out, const int32_t* tokens,
                                              const float* table_part, int64_t num_tokens,
                                              int64_t vocab_first, int64_t part_vocab,
                                              int64_t dim) {
    timed(op_index("embedding_part_forward"), [&] {
        inner_.embedding_part_forward(out, tokens, table_part, num_tokens, vocab_first, part_vocab,
                                      dim);
    });
}

void ProfilingBackend::embedding_part_backward(float* dtable_part, const float* dout,
                                               const int32_t* tokens, int64_t num_tokens,
                                               int64_t vocab_first, int64_t part_vocab,
                                               int64_t dim) {
    timed(op_index("embedding_part_backward"), [&] {
        inner_.embedding_part_backward(dtable_part, dout, tokens, num_tokens, vocab_first,
                                       part_vocab, dim);
    });
}

CrossEntropyResult ProfilingBackend::cross_entropy_forward(float* losses, float* lse,
                                                           const float* logits,
                                                           const int32_t* targets,
                                                           int64_t num_tokens, int64_t vocab_size,
                                                           int32_t ignore_index) {
    return timed(op_index("cross_entropy_forward"), [&] {
        return inner_.cross_entropy_forward(losses, lse, logits, targets, num_tokens, vocab_size,
                                            ignore_index);
    });
}

void ProfilingBackend::cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                              const int32_t* targets, int64_t num_tokens,
                                              int64_t vocab_size, int32_t ignore_index,
                                              float dloss_per_token) {
    timed(op_index("cross_entropy_backward"), [&] {
        inner_.cross_entropy_backward(dlogits, logits, lse, targets, num_tokens, vocab_size,
                                      ignore_index, dloss_per_token);
    });
}

void ProfilingBackend::cross_entropy_part_max(float* row_max, const float* logits,
                                              int64_t num_tokens, int64_t part_vocab) {
    timed(op_index("cross_entropy_part_max"),
          [&] { inner_.cross_entropy_part_max(row_max, logits, num_tokens, part_vocab); });
}

void ProfilingBackend::cross_entropy_part_sums(double* sum_exp, double* target_logit,
                                               const float* logits, const float* row_max,
                                               const int32_t* targets, int64_t num_tokens,
                                               int64_t part_vocab, int64_t vocab_first,
                                               int32_t ignore_index) {
    timed(op_index("cross_entropy_part_sums"), [&] {
        inner_.cross_entropy_part_sums(sum_exp, target_logit, logits, row_max, targets, num_tokens,
                                       part_vocab, vocab_first, ignore_index);
    });
}

void ProfilingBackend::cross_entropy_part_backward(float* dlogits, const float* logits,
                                                   const float* lse, const int32_t* targets,
                                                   int64_t num_tokens, int64_t part_vocab,
                                                   int64_t vocab_first, int32_t ignore_index,
                                                   float dloss_per_token) {
    timed(op_index("cross_entropy_part_backward"), [&] {
        inner_.cross_entropy_part_backward(dlogits, logits, lse, targets, num_tokens, part_vocab,
                                           vocab_first, ignore_index, dloss_per_token);
    });
}

void ProfilingBackend::router_forward(int32_t* topk_ids, float* topk_weights, float* scores,
                                      const float* logits, const float* bias,
                                      const RouterShape& shape) {
    timed(op_index("router_forward"),
          [&] { inner_.router_forward(topk_ids, topk_weights, scores, logits, bias, shape); });
}

void ProfilingBackend::router_backward(float* dlogits, const float* dtopk_weights,
                                       const float* dscores_extra, const float* scores,
                                       const int32_t* topk_ids, const RouterShape& shape) {
    timed(op_index("router_backward"), [&] {
        inner_.router_backward(dlogits, dtopk_weights, dscores_extra, scores, topk_ids, shape);
    });
}

void ProfilingBackend::moe_permute_layout(int32_t* copy_to_row, int64_t* expert_offsets,
                                          const int32_t* topk_ids, int64_t num_tokens,
                                          int64_t top_k, int64_t num_experts) {
    timed(op_index("moe_permute_layout"), [&] {
        inner_.moe_permute_layout(copy_to_row, expert_offsets, topk_ids, num_tokens, top_k,
                                  num_experts);
    });
}

void ProfilingBackend::permute_forward(float* out, const float* inp, const int32_t* copy_to_row,
                                       int64_t num_tokens, int64_t top_k, int64_t dim) {
    timed(op_index("permute_forward"),
          [&] { inner_.permute_forward(out, inp, copy_to_row, num_tokens, top_k, dim); });
}

void ProfilingBackend::permute_backward(float* dinp, const float* dout, const int32_t* copy_to_row,
                                        int64_t num_tokens, int64_t top_k, int64_t dim) {
    timed(op_index("permute_backward"),
          [&] { inner_.permute_backward(dinp, dout, copy_to_row, num_tokens, top_k, dim); });
}

void ProfilingBackend::unpermute_forward(float* out, const float* inp, const float* weights,
                                         const int32_t* copy_to_row, int64_t num_tokens,
                                         int64_t top_k, int64_t dim) {
    timed(op_index("unpermute_forward"), [&] {
        inner_.unpermute_forward(out, inp, weights, copy_to_row, num_tokens, top_k, dim);
    });
}

void ProfilingBackend::unpermute_backward(float* dinp, float* dweights, const float* dout,
                                          const float* inp, const float* weights,
                                          const int32_t* copy_to_row, int64_t num_tokens,
                                          int64_t top_k, int64_t dim) {
    timed(op_index("unpermute_backward"), [&] {
        inner_.unpermute_backward(dinp, dweights, dout, inp, weights, copy_to_row, num_tokens,
                                  top_k, dim);
    });
}

void ProfilingBackend::adamw_update(float* params, float* m, float* v, const float* grads,
                                    int64_t n, const AdamWParams& hp) {
    timed(op_index("adamw_update"), [&] { inner_.adamw_update(params, m, v, grads, n, hp); });
}

double ProfilingBackend::sum_squares(const float* x, int64_t n) {
    return timed(op_index("sum_squares"), [&] { return inner_.sum_squares(x, n); });
}

void ProfilingBackend::scale_inplace(float* x, int64_t n, float factor) {
    timed(op_index("scale_inplace"), [&] { inner_.scale_inplace(x, n, factor); });
}

void ProfilingBackend::dispatch_fan_out(void* send, void* recv, const void* input,
                                        const int32_t* slot_begin, const int32_t* row_slots,
                                        int64_t num_inputs, int64_t row_bytes,
                                        const SlotPlacement& own) {
    timed(op_index("dispatch_fan_out"), [&] {
        inner_.dispatch_fan_out(send, recv, input, slot_begin, row_slots, num_inputs, row_bytes,
                                own);
    });
}

void ProfilingBackend::dispatch_fan_in(float* input, const float* send, const float* recv,
                                       const int32_t* slot_begin, const int32_t* row_slots,
                                       int64_t num_inputs, int64_t width, const SlotPlacement& own,
                                       bool accumulate) {
    timed(op_index("dispatch_fan_in"), [&] {
        inner_.dispatch_fan_in(input, send, recv, slot_begin, row_slots, num_inputs, width, own,
                               accumulate);
    });
}

void ProfilingBackend::dispatch_expand(float* expert_rows, const float* staging,
                                       const int32_t* copy_begin, const int32_t* copy_row,
                                       const float* copy_weight, int64_t num_staging, int64_t dim) {
    timed(op_index("dispatch_expand"), [&] {
        inner_.dispatch_expand(expert_rows, staging, copy_begin, copy_row, copy_weight, num_staging,
                               dim);
    });
}

void ProfilingBackend::dispatch_reduce(float* staging, const float* expert_rows,
                                       const int32_t* copy_begin, const int32_t* copy_row,
                                       const float* copy_weight, int64_t num_staging, int64_t dim) {
    timed(op_index("dispatch_reduce"), [&] {
        inner_.dispatch_reduce(staging, expert_rows, copy_begin, copy_row, copy_weight, num_staging,
                               dim);
    });
}

void ProfilingBackend::dispatch_weight_grads(float* dweights, const float* dout,
                                             const float* expert_out, const int32_t* copy_begin,
                                             const int32_t* copy_row, const int32_t* copy_choice,
                                             int64_t num_staging, int64_t top_k, int64_t dim) {
    timed(op_index("dispatch_weight_grads"), [&] {
        inner_.dispatch_weight_grads(dweights, dout, expert_out, copy_begin, copy_row, copy_choice,
                                     num_staging, top_k, dim);
    });
}

void ProfilingBackend::unpermute_add(float* out, const float* inp, const float* weights,
                                     const int32_t* copy_to_row, int64_t num_tokens, int64_t top_k,
                                     int64_t dim) {
    timed(op_index("unpermute_add"),
          [&] { inner_.unpermute_add(out, inp, weights, copy_to_row, num_tokens, top_k, dim); });
}

void ProfilingBackend::dispatch_route_records(int32_t* records, const int32_t* topk_ids,
                                              const float* topk_weights, int64_t num_tokens,
                                              int64_t top_k, int64_t num_experts,
                                              int32_t source_rank) {
    timed(op_index("dispatch_route_records"), [&] {
        inner_.dispatch_route_records(records, topk_ids, topk_weights, num_tokens, top_k,
                                      num_experts, source_rank);
    });
}

RoutingSpread ProfilingBackend::dispatch_layout(int64_t* copies_per_rank, const int32_t* topk_ids,
                                                int64_t num_tokens, int64_t top_k,
                                                int64_t experts_per_rank, int64_t ranks_per_domain,
                                                int64_t num_ranks) {
    return timed(op_index("dispatch_layout"), [&] {
        return inner_.dispatch_layout(copies_per_rank, topk_ids, num_tokens, top_k,
                                      experts_per_rank, ranks_per_domain, num_ranks);
    });
}

int64_t ProfilingBackend::dispatch_split_rounds(int64_t* ends, int64_t* copies_per_rank,
                                                const int32_t* topk_ids, int64_t num_tokens,
                                                int64_t top_k, int64_t experts_per_rank,
                                                int64_t num_ranks, int64_t max_copies_per_rank) {
    return timed(op_index("dispatch_split_rounds"), [&] {
        return inner_.dispatch_split_rounds(ends, copies_per_rank, topk_ids, num_tokens, top_k,
                                            experts_per_rank, num_ranks, max_copies_per_rank);
    });
}

void ProfilingBackend::dispatch_hop_layout(int32_t* slot_begin, int32_t* row_slots,
                                           int32_t* rows_per_peer, int32_t* first_slot_of_peer,
                                           const int32_t* records, int64_t num_inputs,
                                           int64_t top_k, int64_t first_expert,
                                           int64_t num_hop_experts, int64_t experts_per_peer,
                                           int64_t num_peers) {
    timed(op_index("dispatch_hop_layout"), [&] {
        inner_.dispatch_hop_layout(slot_begin, row_slots, rows_per_peer, first_slot_of_peer,
                                   records, num_inputs, top_k, first_expert, num_hop_experts,
                                   experts_per_peer, num_peers);
    });
}

int64_t ProfilingBackend::dispatch_expert_layout(int64_t* expert_offsets, int32_t* copy_begin,
                                                 int32_t* copy_row, int32_t* copy_choice,
                                                 float* copy_weight, int64_t* rows_by_source,
                                                 const int32_t* records, int64_t num_staging,
                                                 int64_t top_k, int64_t first_expert,
                                                 int64_t num_local_experts, int64_t num_sources,
                                                 int64_t capacity) {
    return timed(op_index("dispatch_expert_layout"), [&] {
        return inner_.dispatch_expert_layout(
            expert_offsets, copy_begin, copy_row, copy_choice, copy_weight, rows_by_source, records,
            num_staging, top_k, first_expert, num_local_experts, num_sources, capacity);
    });
}

void ProfilingBackend::mla_kv_forward(float* k, float* v, const float* kv, const float* k_rope,
                                      int64_t num_tokens, int64_t num_heads, int64_t nope_dim,
                                      int64_t rope_dim, int64_t v_dim) {
    timed(op_index("mla_kv_forward"), [&] {
        inner_.mla_kv_forward(k, v, kv, k_rope, num_tokens, num_heads, nope_dim, rope_dim, v_dim);
    });
}

void ProfilingBackend::mla_kv_backward(float* d_kv, float* d_k_rope, const float* dk,
                                       const float* dv, int64_t num_tokens, int64_t num_heads,
                                       int64_t nope_dim, int64_t rope_dim, int64_t v_dim) {
    timed(op_index("mla_kv_backward"), [&] {
        inner_.mla_kv_backward(d_kv, d_k_rope, dk, dv, num_tokens, num_heads, nope_dim, rope_dim,
                               v_dim);
    });
}

void ProfilingBackend::copy_rows_strided(float* dst, const float* src, int64_t num_rows,
                                         int64_t width, int64_t dst_stride, int64_t src_stride) {
    timed(op_index("copy_rows_strided"),
          [&] { inner_.copy_rows_strided(dst, src, num_rows, width, dst_stride, src_stride); });
}

void ProfilingBackend::shift_sequences(int32_t* out, const int32_t* inp, int64_t batch,
                                       int64_t seq_len, int64_t shift, int32_t fill) {
    timed(op_index("shift_sequences"),
          [&] { inner_.shift_sequences(out, inp, batch, seq_len, shift, fill); });
}

double ProfilingBackend::balance_loss_forward(float* load_fraction, const int32_t* topk_ids,
                                              const float* scores, int64_t batch, int64_t seq_len,
                                              int64_t num_experts, int64_t top_k) {
    return timed(op_index("balance_loss_forward"), [&] {
        return inner_.balance_loss_forward(load_fraction, topk_ids, scores, batch, seq_len,
                                           num_experts, top_k);
    });
}

void ProfilingBackend::balance_loss_backward(float* d_scores, const float* scores,
                                             const float* load_fraction, int64_t batch,
                                             int64_t seq_len, int64_t num_experts,
                                             float loss_grad) {
    timed(op_index("balance_loss_backward"), [&] {
        inner_.balance_loss_backward(d_scores, scores, load_fraction, batch, seq_len, num_experts,
                                     loss_grad);
    });
}

void ProfilingBackend::count_expert_load(int64_t* counts, const int32_t* topk_ids, int64_t num_ids,
                                         int64_t num_experts) {
    timed(op_index("count_expert_load"),
          [&] { inner_.count_expert_load(counts, topk_ids, num_ids, num_experts); });
}

void ProfilingBackend::router_bias_update(float* bias, const int64_t* counts, int64_t num_experts,
                                          float gamma) {
    timed(op_index("router_bias_update"),
          [&] { inner_.router_bias_update(bias, counts, num_experts, gamma); });
}

void ProfilingBackend::cross_entropy_combine_max(float* row_max, const float* part_max,
                                                 int64_t num_parts, int64_t num_tokens) {
    timed(op_index("cross_entropy_combine_max"),
          [&] { inner_.cross_entropy_combine_max(row_max, part_max, num_parts, num_tokens); });
}

CrossEntropyResult ProfilingBackend::cross_entropy_combine_losses(
    float* losses, float* lse, const double* sum_exp, const double* target_logit,
    const float* row_max, const int32_t* targets, int64_t num_tokens, int32_t ignore_index) {
    return timed(op_index("cross_entropy_combine_losses"), [&] {
        return inner_.cross_entropy_combine_losses(losses, lse, sum_exp, target_logit, row_max,
                                                   targets, num_tokens, ignore_index);
    });
}

void ProfilingBackend::init_normal(float* out, uint64_t seed, uint64_t name_hash, int64_t num_runs,
                                   int64_t run_length, int64_t first_index, int64_t run_stride,
                                   float stddev) {
    timed(op_index("init_normal"), [&] {
        inner_.init_normal(out, seed, name_hash, num_runs, run_length, first_index, run_stride,
                           stddev);
    });
}

void ProfilingBackend::fill(float* x, int64_t n, float value) {
    timed(op_index("fill"), [&] { inner_.fill(x, n, value); });
}

void ProfilingBackend::stream_triad(float* a, const float* b, const float* c, float s, int64_t n) {
    timed(op_index("stream_triad"), [&] { inner_.stream_triad(a, b, c, s, n); });
}

void ProfilingBackend::exp_elementwise(float* out, const float* inp, int64_t n) {
    timed(op_index("exp_elementwise"), [&] { inner_.exp_elementwise(out, inp, n); });
}

void ProfilingBackend::empty_launch() {
    timed(op_index("empty_launch"), [&] { inner_.empty_launch(); });
}

void ProfilingBackend::quantize_mxfp8(uint8_t* elements, uint8_t* scales, const float* x,
                                      int64_t rows, int64_t cols, bool down_columns) {
    timed(op_index("quantize_mxfp8"),
          [&] { inner_.quantize_mxfp8(elements, scales, x, rows, cols, down_columns); });
}

void ProfilingBackend::dequantize_mxfp8(float* x, const uint8_t* elements, const uint8_t* scales,
                                        int64_t rows, int64_t cols, bool down_columns) {
    timed(op_index("dequantize_mxfp8"),
          [&] { inner_.dequantize_mxfp8(x, elements, scales, rows, cols, down_columns); });
}

void ProfilingBackend::quantize_fp8_blocks(uint8_t* elements, float* scales, const float* x,
                                           int64_t rows, int64_t cols, int64_t block_rows,
                                           int64_t block_cols) {
    timed(op_index("quantize_fp8_blocks"), [&] {
        inner_.quantize_fp8_blocks(elements, scales, x, rows, cols, block_rows, block_cols);
    });
}

void ProfilingBackend::dequantize_fp8_blocks(float* x, const uint8_t* elements, const float* scales,
                                             int64_t rows, int64_t cols, int64_t block_rows,
                                             int64_t block_cols) {
    timed(op_index("dequantize_fp8_blocks"), [&] {
        inner_.dequantize_fp8_blocks(x, elements, scales, rows, cols, block_rows, block_cols);
    });
}

void ProfilingBackend::round_to_bf16(float* out, const float* x, int64_t n) {
    timed(op_index("round_to_bf16"), [&] { inner_.round_to_bf16(out, x, n); });
}

std::string format_op_profile(const ProfilingBackend& profile, int64_t steps, double step_seconds) {
    MT_CHECK(steps > 0 && step_seconds > 0, "[profile] {} steps in {} s", steps, step_seconds);
    const double ms_per_step = 1e3 * step_seconds / static_cast<double>(steps);
    const auto per_step = [&](double total) { return total / static_cast<double>(steps); };
    std::array<ProfilingBackend::OpTotals, kNumOpCategories> by_category{};
    double ops_seconds = 0;
    for (size_t i = 0; i < kProfiledOps.size(); ++i) {
        ProfilingBackend::OpTotals& c = by_category[static_cast<size_t>(kProfiledOps[i].category)];
        c.calls += profile.totals(i).calls;
        c.seconds += profile.totals(i).seconds;
        ops_seconds += profile.totals(i).seconds;
    }
    std::vector<size_t> categories(kNumOpCategories);
    std::iota(categories.begin(), categories.end(), size_t{0});
    std::stable_sort(categories.begin(), categories.end(), [&](size_t a, size_t b) {
        return by_category[a].seconds > by_category[b].seconds;
    });

    std::string out =
        fmt::format("{:<34} {:>10} {:>7} {:>11}\n", "op (per step)", "ms", "% step", "calls");
    const auto row = [&](std::string_view label, const ProfilingBackend::OpTotals& t) {
        const double ms = 1e3 * per_step(t.seconds);
        out += fmt::format("{:<34} {:>10.2f} {:>6.1f}% {:>11.1f}\n", label, ms,
                           100.0 * ms / ms_per_step, per_step(static_cast<double>(t.calls)));
    };
    for (size_t c : categories) {
        if (by_category[c].calls == 0) continue;
        row(op_category_name(static_cast<OpCategory>(c)), by_category[c]);
        std::vector<size_t> ops;
        for (size_t i = 0; i < kProfiledOps.size(); ++i) {
            if (static_cast<size_t>(kProfiledOps[i].category) == c && profile.totals(i).calls > 0)
                ops.push_back(i);
        }
        std::stable_sort(ops.begin(), ops.end(), [&](size_t a, size_t b) {
            return profile.totals(a).seconds > profile.totals(b).seconds;
        });
        for (size_t i : ops) row(fmt::format("  {}", kProfiledOps[i].name), profile.totals(i));
    }
    const double rest_ms = ms_per_step - 1e3 * per_step(ops_seconds);
    out += fmt::format("{:<34} {:>10.2f} {:>6.1f}%\n", "outside the backend's ops", rest_ms,
                       100.0 * rest_ms / ms_per_step);
    out += fmt::format("{:<34} {:>10.2f} {:>6.1f}%\n", "step", ms_per_step, 100.0);
    return out;
}

}  // namespace moetron
