// The DeepSeek-V3 model: embedding, num_hidden_layers blocks (MLA attention; a dense SwiGLU MLP
// for the first first_k_dense_replace layers, MoE after), final norm, output head, and the MTP
// modules. Forward and hand-written backward; parameters, gradients and activations live in
// arenas planned in the constructor, so forward_backward allocates nothing.
//
// This header is the contract between model/ and train/. Its owner may extend it; the functions
// below keep their meaning.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moetron/core/tensor.h"
#include "moetron/model/config.h"

namespace moetron {

// Sizes the activation arena: the largest micro-batch the model will see.
struct ModelRuntime {
    int64_t batch_size = 1;  // B: sequences per micro-batch
    int64_t seq_len = 0;     // S
};

// Loss-side knobs of DeepSeek-V3 training (its report, sec. 2.1-2.2).
struct LossWeights {
    float mtp_lambda = 0.3f;          // weight of the MTP loss (averaged over depths)
    float balance_alpha = 0.0001f;    // sequence-wise balance loss weight (0 disables)
};

struct ParamEntry {
    std::string name;        // moetron name, e.g. "layers.3.mlp.experts.gate_up"
    Shape shape;
    int64_t offset = 0;      // in floats, into params() / grads()
    int64_t numel = 0;
    bool weight_decay = true;  // false for norms and biases
    bool trainable = true;     // false for the router correction bias (updated by load, not grad)
};

struct MicroBatchLosses {
    double lm_loss = 0;       // mean cross-entropy of next-token prediction (nats/token)
    double mtp_loss = 0;      // mean over MTP depths of their cross-entropy (0 without MTP)
    double balance_loss = 0;  // alpha * sum over MoE layers of the sequence-wise balance loss
    int64_t num_tokens = 0;   // tokens with a valid target
};

// Expert load of the tokens seen since the last reset, per MoE layer.
struct ExpertLoadStats {
    std::vector<std::vector<int64_t>> tokens_per_expert;  // [moe layer][expert]
    double max_over_mean = 0;  // worst layer's max(load) / mean(load)
    double min_over_mean = 0;  // worst layer's min(load) / mean(load)
};

class Model {
public:
    Model(const ModelConfig& config, const ModelRuntime& runtime, const LossWeights& weights);
    ~Model();
    Model(const Model&) = delete;
    Model& operator=(const Model&) = delete;

    // Counter-based initialization: element i of parameter P from (seed, P's name, i).
    void init_parameters(uint64_t seed);

    // Forward and backward of one micro-batch of B x S tokens (B, S <= the runtime's). targets are
    // the next tokens (ignore_index -1 where there is none); MTP depth d predicts targets shifted
    // by d. Gradients (scaled by grad_scale, e.g. 1 / micro-batches) accumulate into grads().
    MicroBatchLosses forward_backward(const int32_t* tokens, const int32_t* targets, int64_t batch,
                                      int64_t seq_len, float grad_scale);
    // Forward only (validation, sampling). Afterwards logits() holds the (B*S, V) main-head logits.
    MicroBatchLosses forward(const int32_t* tokens, const int32_t* targets, int64_t batch,
                             int64_t seq_len);
    const float* logits() const;

    // The aux-loss-free balancing step, after each optimizer step:
    // bias_e += gamma * sign(mean load - load_e) from the loads counted since the last call.
    void update_router_bias(float gamma);
    ExpertLoadStats expert_load() const;

    const ModelConfig& config() const;
    float* params();
    float* grads();
    int64_t num_params() const;
    const std::vector<ParamEntry>& param_entries() const;
    TensorView param(const std::string& name) const;
    TensorView grad(const std::string& name) const;
    size_t planned_bytes() const;  // all arenas together, for the peak-RSS report

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace moetron
