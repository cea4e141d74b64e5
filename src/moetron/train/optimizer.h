// AdamW over the model's flat parameter buffer, driven by Model::param_entries(): weight decay
// only where an entry asks for it (not on norms and biases), non-trainable entries (the router
// correction bias, moved by load instead of gradient) never touched, and global gradient-norm
// clipping over the trainable entries. Moments live in two buffers sized once at construction.
#pragma once

#include <cstdint>
#include <vector>

#include "moetron/model/model.h"

namespace moetron {

struct AdamWConfig {
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.1;
    double grad_clip = 1.0;  // max global gradient norm; <= 0 disables clipping
};

class AdamW {
  public:
    // entries index a flat buffer of num_params floats (params and grads alike).
    AdamW(const std::vector<ParamEntry>& entries, int64_t num_params, const AdamWConfig& config);

    // Global L2 norm of the trainable gradients (before clipping).
    double grad_norm(const float* grads) const;
    // Scales the trainable gradients so that their global norm is at most grad_clip; returns the
    // norm before clipping.
    double clip_gradients(float* grads) const;
    // One AdamW step at learning rate lr on every trainable entry; advances step_count().
    void step(float* params, const float* grads, double lr);

    int64_t step_count() const { return step_count_; }
    // Sets the moments (num_params floats each) and the step count, as a checkpoint saved them.
    void restore_state(const float* m, const float* v, int64_t step_count);
    // The moment buffers (num_params floats each; untouched where an entry is not trainable).
    const std::vector<float>& first_moment() const { return m_; }
    const std::vector<float>& second_moment() const { return v_; }

  private:
    // A run of contiguous trainable entries with the same decay setting: one kernel call each.
    struct Span {
        int64_t offset;
        int64_t numel;
        bool weight_decay;
    };
    std::vector<Span> spans_;
    AdamWConfig config_;
    std::vector<float> m_;
    std::vector<float> v_;
    int64_t step_count_ = 0;
};

}  // namespace moetron
