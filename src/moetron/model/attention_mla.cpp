#include "moetron/model/attention_mla.h"

#include <cmath>

#include "moetron/kernels/backend.h"

namespace moetron {

namespace {

// heads: this rank's, num_attention_heads / tp (the model checks that tp divides them).
struct MlaDims {
    int64_t dim, heads, q_rank, kv_rank, nope, rope, qk, v;
    MlaDims(const ModelConfig& c, int tp_size)
        : dim(c.hidden_size),
          heads(c.num_attention_heads / tp_size),
          q_rank(c.q_lora_rank),
          kv_rank(c.kv_lora_rank),
          nope(c.qk_nope_head_dim),
          rope(c.qk_rope_head_dim),
          qk(c.qk_head_dim()),
          v(c.v_head_dim) {}
    int64_t kv_b_out() const { return heads * (nope + v); }
    // DeepSeek-V3 eq. 10: scores are divided by sqrt(d_h + d_h^R).
    float softmax_scale() const { return static_cast<float>(1.0 / std::sqrt(double(qk))); }
};

}  // namespace

void bind_mla_params(ParamBinder& b, MlaParams& p, const std::string& prefix,
                     const ModelConfig& c) {
    const MlaDims d(c, 1);  // global shapes; the binder takes this rank's heads
    if (d.q_rank > 0) {
        b.weight(p.q_a_proj, prefix + "q_a_proj", {d.q_rank, d.dim});
        b.norm(p.q_a_norm, prefix + "q_a_norm", d.q_rank);
        b.column_parallel_weight(p.q_b_proj, prefix + "q_b_proj", {d.heads * d.qk, d.q_rank});
    } else {
        b.column_parallel_weight(p.q_proj, prefix + "q_proj", {d.heads * d.qk, d.dim});
    }
    b.weight(p.kv_a_proj, prefix + "kv_a_proj", {d.kv_rank + d.rope, d.dim});
    b.norm(p.kv_a_norm, prefix + "kv_a_norm", d.kv_rank);
    b.column_parallel_weight(p.kv_b_proj, prefix + "kv_b_proj", {d.kv_b_out(), d.kv_rank});
    b.row_parallel_weight(p.o_proj, prefix + "o_proj", {d.dim, d.heads * d.v});
}

void bind_mla_activations(BufferBinder& b, MlaActivations& a, const std::string& prefix,
                          const ModelConfig& c, int tp_size, int64_t batch, int64_t seq_len) {
    const MlaDims d(c, tp_size);
    const int64_t n = batch * seq_len;
    if (d.q_rank > 0) {
        b(a.q_a, prefix + "q_a", {n, d.q_rank});
        b(a.q_a_rstd, prefix + "q_a_rstd", {n});
        b(a.q_a_normed, prefix + "q_a_normed", {n, d.q_rank});
    }
    b(a.q, prefix + "q", {n, d.heads, d.qk});
    b(a.latent, prefix + "latent", {n, d.kv_rank});
    b(a.latent_rstd, prefix + "latent_rstd", {n});
    b(a.latent_normed, prefix + "latent_normed", {n, d.kv_rank});
    b(a.k, prefix + "k", {n, d.heads, d.qk});
    b(a.v, prefix + "v", {n, d.heads, d.v});
    b(a.attn, prefix + "attn", {n, d.heads, d.v});
    b(a.lse, prefix + "lse", {batch, d.heads, seq_len});
}

void bind_mla_scratch(BufferBinder& b, MlaScratch& s, const std::string& prefix,
                      const ModelConfig& c, int tp_size, int64_t num_tokens) {
    const MlaDims d(c, tp_size);
    const int64_t n = num_tokens;
    b(s.kv, prefix + "kv", {n, d.heads, d.nope + d.v});
    b(s.k_rope, prefix + "k_rope", {n, d.rope});
    b(s.d_attn, prefix + "d_attn", {n, d.heads * d.v});
    b(s.dq, prefix + "dq", {n, d.heads, d.qk});
    b(s.dk, prefix + "dk", {n, d.heads, d.qk});
    b(s.dv, prefix + "dv", {n, d.heads, d.v});
    if (d.q_rank > 0) {
        b(s.d_q_a_normed, prefix + "d_q_a_normed", {n, d.q_rank});
        b(s.d_q_a, prefix + "d_q_a", {n, d.q_rank});
    }
    b(s.d_latent_normed, prefix + "d_latent_normed", {n, d.kv_rank});
    b(s.d_latent, prefix + "d_latent", {n, d.kv_rank});
}

void mla_forward(const ModelCompute& compute, float* out, const MlaActivations& saved,
                 const float* inp, const MlaParams& w, const MlaScratch& scratch,
                 const RopeTables& rope, const ModelConfig& c, const parallel::TensorParallel& tp,
                 int64_t batch, int64_t seq_len) {
    Backend& ops = compute.ops;
    const GemmPrecision layer = compute.gemm(GemmRole::layer);
    const MlaDims d(c, tp.size());
    const int64_t n = batch * seq_len;

    // Queries (DeepSeek-V3 eq. 6-8): low-rank through a normed latent, or one projection.
    if (d.q_rank > 0) {
        ops.linear_forward(saved.q_a, inp, w.q_a_proj, n, d.dim, d.q_rank, layer);
        ops.rmsnorm_forward(saved.q_a_normed, saved.q_a_rstd, saved.q_a, w.q_a_norm, n, d.q_rank,
                            kMlaLatentNormEps);
        ops.linear_forward(saved.q, saved.q_a_normed, w.q_b_proj, n, d.q_rank, d.heads * d.qk,
                           layer);
    } else {
        ops.linear_forward(saved.q, inp, w.q_proj, n, d.dim, d.heads * d.qk, layer);
    }
    // Keys and values (eq. 1-5). kv_a_proj_with_mqa's rows split into the latent and the rope key;
    // two GEMMs over the row blocks give both contiguous without a copy.
    ops.linear_forward(saved.latent, inp, w.kv_a_proj, n, d.dim, d.kv_rank, layer);
    ops.linear_forward(scratch.k_rope, inp, w.kv_a_proj + d.kv_rank * d.dim, n, d.dim, d.rope,
                       layer);
    ops.rmsnorm_forward(saved.latent_normed, saved.latent_rstd, saved.latent, w.kv_a_norm, n,
                        d.kv_rank, kMlaLatentNormEps);
    ops.linear_forward(scratch.kv, saved.latent_normed, w.kv_b_proj, n, d.kv_rank, d.kv_b_out(),
                       layer);

    // Decoupled RoPE (eq. 3 and 8) on each query head's rope slice and on the shared rope key.
    ops.rope_forward(saved.q, rope.cos, rope.sin, n, seq_len, d.heads, d.qk, d.nope, d.rope);
    ops.rope_forward(scratch.k_rope, rope.cos, rope.sin, n, seq_len, 1, d.rope, 0, d.rope);

    // k per head = [k_nope | shared rope key] (eq. 4), v per head from kv_b_proj's second part.
    ops.mla_kv_forward(saved.k, saved.v, scratch.kv, scratch.k_rope, n, d.heads, d.nope, d.rope,
                       d.v);

    ops.attention_forward(saved.attn, saved.lse, saved.q, saved.k, saved.v, batch, seq_len, d.heads,
                          d.qk, d.v, d.softmax_scale());
    ops.linear_forward(out, saved.attn, w.o_proj, n, d.heads * d.v, d.dim, layer);
}

void mla_backward(const ModelCompute& compute, float* dinp, const MlaParams& grads,
                  const float* dout, const float* inp, const MlaActivations& saved,
                  const MlaParams& w, const MlaScratch& scratch, const RopeTables& rope,
                  const ModelConfig& c, const parallel::TensorParallel& tp, int64_t batch,
                  int64_t seq_len) {
    Backend& ops = compute.ops;
    const GemmPrecision layer = compute.gemm(GemmRole::layer);
    const MlaDims d(c, tp.size());
    const int64_t n = batch * seq_len;

    ops.linear_backward(scratch.d_attn, grads.o_proj, dout, saved.attn, w.o_proj, n, d.heads * d.v,
                        d.dim, layer);
    ops.attention_backward(scratch.dq, scratch.dk, scratch.dv, scratch.d_attn, saved.q, saved.k,
                           saved.v, saved.attn, saved.lse, batch, seq_len, d.heads, d.qk, d.v,
                           d.softmax_scale());
    ops.rope_backward(scratch.dq, rope.cos, rope.sin, n, seq_len, d.heads, d.qk, d.nope, d.rope);

    // Undo the assembly of k and v: d kv per head = [dk_nope | dv]; the shared rope key received
    // the gradient of every head's copy.
    float* d_kv = scratch.kv;
    float* d_k_rope = scratch.k_rope;
    ops.mla_kv_backward(d_kv, d_k_rope, scratch.dk, scratch.dv, n, d.heads, d.nope, d.rope, d.v);
    tp.sum_partial_input_grads(d_k_rope, n * d.rope);  // f: every rank's heads read the key
    ops.rope_backward(d_k_rope, rope.cos, rope.sin, n, seq_len, 1, d.rope, 0, d.rope);

    ops.linear_backward(scratch.d_latent_normed, grads.kv_b_proj, d_kv, saved.latent_normed,
                        w.kv_b_proj, n, d.kv_rank, d.kv_b_out(), layer);
    tp.sum_partial_input_grads(scratch.d_latent_normed, n * d.kv_rank);  // f: kv_b is split
    ops.rmsnorm_backward(scratch.d_latent, grads.kv_a_norm, scratch.d_latent_normed, saved.latent,
                         w.kv_a_norm, saved.latent_rstd, n, d.kv_rank);

    // The query path writes dinp; the two kv_a_proj row blocks then add to it.
    if (d.q_rank > 0) {
        ops.linear_backward(scratch.d_q_a_normed, grads.q_b_proj, scratch.dq, saved.q_a_normed,
                            w.q_b_proj, n, d.q_rank, d.heads * d.qk, layer);
        tp.sum_partial_input_grads(scratch.d_q_a_normed, n * d.q_rank);  // f: q_b is split
        ops.rmsnorm_backward(scratch.d_q_a, grads.q_a_norm, scratch.d_q_a_normed, saved.q_a,
                             w.q_a_norm, saved.q_a_rstd, n, d.q_rank);
        ops.linear_backward(dinp, grads.q_a_proj, scratch.d_q_a, inp, w.q_a_proj, n, d.dim,
                            d.q_rank, layer);
    } else {
        ops.linear_backward(dinp, grads.q_proj, scratch.dq, inp, w.q_proj, n, d.dim, d.heads * d.qk,
                            layer);
        tp.sum_partial_input_grads(dinp, n * d.dim);  // f: q_proj is split
    }
    const float* w_rope_key = w.kv_a_proj + d.kv_rank * d.dim;
    ops.linear_backward(nullptr, grads.kv_a_proj, scratch.d_latent, inp, w.kv_a_proj, n, d.dim,
                        d.kv_rank, layer);
    ops.matmul(dinp, scratch.d_latent, w.kv_a_proj, n, d.dim, d.kv_rank, false, false, 1.0f, layer);
    ops.linear_backward(nullptr, grads.kv_a_proj + d.kv_rank * d.dim, d_k_rope, inp, w_rope_key, n,
                        d.dim, d.rope, layer);
    ops.matmul(dinp, d_k_rope, w_rope_key, n, d.dim, d.rope, false, false, 1.0f, layer);
}

}  // namespace moetron
