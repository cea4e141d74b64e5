// SwiGLU MLP: out = down(silu(gate(x)) * up(x)). DeepSeek-V3's dense FFN in the first
// first_k_dense_replace layers (F = intermediate_size) and its shared experts (one MLP of
// F = n_shared_experts * moe_intermediate_size). gate and up are one fused (2F, D) weight =
// [gate_proj; up_proj], so the first projection is a single GEMM.
//
// Tensor parallelism (Megatron style): gate_up is column-parallel over F (each rank keeps its
// rows of gate_proj and of up_proj), down row-parallel, so out and dinp are partial sums that the
// caller reduces over the TP group (block.h: reduce-scattered into the rank's token rows). F below
// is then the rank's share, F / tp.
#pragma once

#include <cstdint>
#include <string>

#include "moetron/kernels/backend.h"
#include "moetron/model/compute.h"
#include "moetron/model/params.h"

namespace moetron {

struct MlpParams {
    float* gate_up = nullptr;  // (2F, D): rows [0, F) gate_proj, [F, 2F) up_proj
    float* down = nullptr;     // (D, F)
};

struct MlpActivations {
    float* gate_up = nullptr;  // (N, 2F) saved: [gate | up] before the activation
    float* hidden = nullptr;   // (N, F) saved: silu(gate) * up
};

// Backward temporaries, shared by every MLP of the model (they run one at a time).
struct MlpScratch {
    float* d_hidden = nullptr;   // (N, F_max)
    float* d_gate_up = nullptr;  // (N, 2 F_max)
};

// ffn_dim is the global F; the binder's tensor-parallel setting takes this rank's share.
void bind_mlp_params(ParamBinder& b, MlpParams& p, const std::string& prefix, int64_t dim,
                     int64_t ffn_dim);
void bind_mlp_activations(BufferBinder& b, MlpActivations& a, const std::string& prefix,
                          int64_t num_tokens, int64_t ffn_dim);
void bind_mlp_scratch(BufferBinder& b, MlpScratch& s, const std::string& prefix, int64_t num_tokens,
                      int64_t max_ffn_dim);

// out (N, D) written, or added to when accumulate (the MoE adds its shared experts this way).
void mlp_forward(const ModelCompute& compute, float* out, const MlpActivations& saved,
                 const float* inp, const MlpParams& w, int64_t num_tokens, int64_t dim,
                 int64_t ffn_dim, bool accumulate);
// dinp (N, D) written, or added to when accumulate; grads accumulate.
void mlp_backward(const ModelCompute& compute, float* dinp, const MlpParams& grads,
                  const float* dout, const float* inp, const MlpActivations& saved,
                  const MlpParams& w, const MlpScratch& scratch, int64_t num_tokens, int64_t dim,
                  int64_t ffn_dim, bool accumulate);

}  // namespace moetron
