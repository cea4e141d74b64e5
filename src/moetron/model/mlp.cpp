#include "moetron/model/mlp.h"

#include "moetron/kernels/backend.h"

namespace moetron {

void bind_mlp_params(ParamBinder& b, MlpParams& p, const std::string& prefix, int64_t dim,
                     int64_t ffn_dim) {
    b.column_parallel_weight(p.gate_up, prefix + "gate_up", {2 * ffn_dim, dim}, 2);
    b.row_parallel_weight(p.down, prefix + "down", {dim, ffn_dim});
}

void bind_mlp_activations(BufferBinder& b, MlpActivations& a, const std::string& prefix,
                          int64_t num_tokens, int64_t ffn_dim) {
    b(a.gate_up, prefix + "gate_up", {num_tokens, 2 * ffn_dim});
    b(a.hidden, prefix + "hidden", {num_tokens, ffn_dim});
}

void bind_mlp_scratch(BufferBinder& b, MlpScratch& s, const std::string& prefix, int64_t num_tokens,
                      int64_t max_ffn_dim) {
    b(s.d_hidden, prefix + "d_hidden", {num_tokens, max_ffn_dim});
    b(s.d_gate_up, prefix + "d_gate_up", {num_tokens, 2 * max_ffn_dim});
}

void mlp_forward(const ModelCompute& compute, float* out, const MlpActivations& saved,
                 const float* inp, const MlpParams& w, int64_t num_tokens, int64_t dim,
                 int64_t ffn_dim, bool accumulate) {
    Backend& ops = compute.ops;
    const GemmPrecision layer = compute.gemm(GemmRole::layer);
    ops.linear_forward(saved.gate_up, inp, w.gate_up, num_tokens, dim, 2 * ffn_dim, layer);
    ops.swiglu_forward(saved.hidden, saved.gate_up, num_tokens, ffn_dim);
    // out (N, D) [+]= hidden (N, F) @ down (D, F)^T
    ops.matmul(out, saved.hidden, w.down, num_tokens, dim, ffn_dim, false, true,
               accumulate ? 1.0f : 0.0f, layer);
}

void mlp_backward(const ModelCompute& compute, float* dinp, const MlpParams& grads,
                  const float* dout, const float* inp, const MlpActivations& saved,
                  const MlpParams& w, const MlpScratch& scratch, int64_t num_tokens, int64_t dim,
                  int64_t ffn_dim, bool accumulate) {
    Backend& ops = compute.ops;
    const GemmPrecision layer = compute.gemm(GemmRole::layer);
    ops.linear_backward(scratch.d_hidden, grads.down, dout, saved.hidden, w.down, num_tokens,
                        ffn_dim, dim, layer);
    ops.swiglu_backward(scratch.d_gate_up, scratch.d_hidden, saved.gate_up, num_tokens, ffn_dim);
    ops.linear_backward(nullptr, grads.gate_up, scratch.d_gate_up, inp, w.gate_up, num_tokens, dim,
                        2 * ffn_dim, layer);
    // dinp (N, D) [+]= d_gate_up (N, 2F) @ gate_up (2F, D)
    ops.matmul(dinp, scratch.d_gate_up, w.gate_up, num_tokens, dim, 2 * ffn_dim, false, false,
               accumulate ? 1.0f : 0.0f, layer);
}

}  // namespace moetron
