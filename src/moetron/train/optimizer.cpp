#include "moetron/train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/adamw.h"

namespace moetron {

AdamW::AdamW(const std::vector<ParamEntry>& entries, int64_t num_params, const AdamWConfig& config)
    : config_(config), m_(static_cast<size_t>(num_params)), v_(static_cast<size_t>(num_params)) {
    std::vector<ParamEntry> sorted = entries;
    std::sort(sorted.begin(), sorted.end(),
              [](const ParamEntry& a, const ParamEntry& b) { return a.offset < b.offset; });
    for (const ParamEntry& e : sorted) {
        MT_CHECK(e.offset >= 0 && e.numel >= 0 && e.offset + e.numel <= num_params,
                 "[optimizer] parameter '{}' [{}, {}) lies outside the {}-float buffer", e.name,
                 e.offset, e.offset + e.numel, num_params);
        if (!e.trainable || e.numel == 0) continue;
        if (!spans_.empty()) {
            Span& last = spans_.back();
            MT_CHECK(last.offset + last.numel <= e.offset,
                     "[optimizer] parameter '{}' overlaps the one before it", e.name);
            if (last.offset + last.numel == e.offset && last.weight_decay == e.weight_decay) {
                last.numel += e.numel;
                continue;
            }
        }
        spans_.push_back({e.offset, e.numel, e.weight_decay});
    }
}

double AdamW::grad_norm(const float* grads) const {
    double sum = 0;
    for (const Span& s : spans_) sum += cpu::sum_squares(grads + s.offset, s.numel);
    return std::sqrt(sum);
}

double AdamW::clip_gradients(float* grads) const {
    const double norm = grad_norm(grads);
    const float factor = cpu::clip_factor(norm, static_cast<float>(config_.grad_clip));
    if (factor != 1.0f) {
        for (const Span& s : spans_) cpu::scale_inplace(grads + s.offset, s.numel, factor);
    }
    return norm;
}

void AdamW::step(float* params, const float* grads, double lr) {
    ++step_count_;
    cpu::AdamWParams hp{};
    hp.lr = static_cast<float>(lr);
    hp.beta1 = static_cast<float>(config_.beta1);
    hp.beta2 = static_cast<float>(config_.beta2);
    hp.eps = static_cast<float>(config_.eps);
    hp.step = step_count_;
    for (const Span& s : spans_) {
        hp.weight_decay = s.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
        cpu::adamw_update(params + s.offset, m_.data() + s.offset, v_.data() + s.offset,
                          grads + s.offset, s.numel, hp);
    }
}

void AdamW::restore_state(const float* m, const float* v, int64_t step_count) {
    MT_CHECK(step_count >= 0, "[optimizer] cannot restore a negative step count {}", step_count);
    std::copy(m, m + m_.size(), m_.begin());
    std::copy(v, v + v_.size(), v_.begin());
    step_count_ = step_count;
}

}  // namespace moetron
