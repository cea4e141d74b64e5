// train/optimizer: AdamW over parameter entries (decay only where asked, non-trainable entries
// untouched) and global gradient-norm clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/adamw.h"
#include "moetron/train/optimizer.h"

namespace moetron {
namespace {

ParamEntry entry(const char* name, int64_t offset, int64_t numel, bool decay, bool trainable) {
    ParamEntry e;
    e.name = name;
    e.shape = Shape{numel};
    e.offset = offset;
    e.numel = numel;
    e.weight_decay = decay;
    e.trainable = trainable;
    return e;
}

// weight [0, 4) decayed; norm [4, 6) not decayed; router bias [6, 8) not trainable; a gap
// [8, 9) that no entry owns; weight2 [9, 12) decayed.
std::vector<ParamEntry> entries() {
    return {entry("w", 0, 4, true, true), entry("norm", 4, 2, false, true),
            entry("bias", 6, 2, false, false), entry("w2", 9, 3, true, true)};
}

TEST(AdamW, DecaysOnlyDecayEntriesAndSkipsNonTrainable) {
    AdamWConfig cfg;
    cfg.weight_decay = 0.5;
    AdamW opt(entries(), 12, cfg);
    std::vector<float> params(12, 2.0f), grads(12, 0.0f);
    grads[6] = grads[7] = 3.0f;  // the non-trainable bias has a gradient: it must be ignored
    grads[8] = 5.0f;             // so must the gap
    opt.step(params.data(), grads.data(), /*lr=*/0.1);
    // Zero gradient: Adam's step is 0 / (0 + eps) = 0, so only the decay moves parameters.
    const float decayed = 2.0f * (1.0f - 0.1f * 0.5f);
    for (int i : {0, 1, 2, 3, 9, 10, 11}) EXPECT_FLOAT_EQ(params[i], decayed) << i;
    for (int i : {4, 5}) EXPECT_FLOAT_EQ(params[i], 2.0f) << "norms are not decayed, " << i;
    for (int i : {6, 7, 8}) EXPECT_FLOAT_EQ(params[i], 2.0f) << "not trainable, " << i;
    EXPECT_EQ(opt.first_moment()[6], 0.0f);
    EXPECT_EQ(opt.second_moment()[7], 0.0f);
    EXPECT_EQ(opt.step_count(), 1);
}

TEST(AdamW, MatchesTheKernelEntryByEntry) {
    AdamWConfig cfg;
    cfg.weight_decay = 0.1;
    AdamW opt(entries(), 12, cfg);
    std::vector<float> params(12), grads(12);
    for (int i = 0; i < 12; ++i) {
        params[i] = 0.1f * static_cast<float>(i) - 0.5f;
        grads[i] = 0.03f * static_cast<float>((i * 7) % 5) - 0.06f;
    }
    std::vector<float> expected = params, m(12), v(12);
    for (int t = 1; t <= 3; ++t) {
        opt.step(params.data(), grads.data(), 1e-2);
        cpu::AdamWParams hp{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t};
        cpu::adamw_update(expected.data(), m.data(), v.data(), grads.data(), 4, hp);
        cpu::adamw_update(expected.data() + 9, m.data() + 9, v.data() + 9, grads.data() + 9, 3, hp);
        hp.weight_decay = 0.0f;
        cpu::adamw_update(expected.data() + 4, m.data() + 4, v.data() + 4, grads.data() + 4, 2, hp);
    }
    for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(params[i], expected[i]) << i;
    EXPECT_FLOAT_EQ(params[6], 0.1f);  // untouched
}

TEST(AdamW, ClipsTheGlobalNormOfTrainableGradients) {
    AdamWConfig cfg;
    cfg.grad_clip = 1.0;
    AdamW opt(entries(), 12, cfg);
    std::vector<float> grads(12, 0.0f);
    grads[0] = 3.0f;   // w
    grads[4] = 4.0f;   // norm: trainable, counts
    grads[6] = 12.0f;  // bias: not trainable, neither counted nor scaled
    EXPECT_DOUBLE_EQ(opt.grad_norm(grads.data()), 5.0);
    EXPECT_DOUBLE_EQ(opt.clip_gradients(grads.data()), 5.0);
    EXPECT_NEAR(opt.grad_norm(grads.data()), 1.0, 1e-6);
    EXPECT_NEAR(grads[0], 0.6f, 1e-6);
    EXPECT_NEAR(grads[4], 0.8f, 1e-6);
    EXPECT_EQ(grads[6], 12.0f);
    // Within the limit: unchanged. Clipping off: unchanged.
    EXPECT_NEAR(opt.clip_gradients(grads.data()), 1.0, 1e-6);
    EXPECT_NEAR(grads[0], 0.6f, 1e-6);
    cfg.grad_clip = 0.0;
    AdamW unclipped(entries(), 12, cfg);
    grads[0] = 30.0f;
    unclipped.clip_gradients(grads.data());
    EXPECT_EQ(grads[0], 30.0f);
}

TEST(AdamW, RejectsEntriesOutsideTheBufferOrOverlapping) {
    EXPECT_THROW(AdamW({entry("w", 10, 4, true, true)}, 12, AdamWConfig{}), Error);
    EXPECT_THROW(
        AdamW({entry("a", 0, 4, true, true), entry("b", 2, 4, true, true)}, 12, AdamWConfig{}),
        Error);
}

}  // namespace
}  // namespace moetron
