// train/optimizer: AdamW on one process, a world of one (decay only where asked, non-trainable
// parameters untouched) and global gradient-norm clipping. test_grad_buckets.cpp checks it against
// a per-tensor reference with and without ZeRO-1; the MPI tests on several ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/adamw.h"
#include "moetron/kernels/profiling_backend.h"
#include "moetron/parallel/local_communicator.h"
#include "moetron/train/optimizer.h"

namespace moetron {
namespace {

using parallel::ParamSpan;

ParamSpan span(int64_t offset, int64_t numel, bool decay, bool trainable) {
    ParamSpan s;
    s.offset = offset;
    s.numel = numel;
    s.weight_decay = decay;
    s.trainable = trainable;
    return s;
}

// weight [0, 4) decayed; norm [4, 6) not decayed; router bias [6, 8) not trainable; a gap
// [8, 9) that no tensor owns; weight2 [9, 12) decayed.
std::vector<ParamSpan> spans() {
    return {span(0, 4, true, true), span(4, 2, false, true), span(6, 2, false, false),
            span(9, 3, true, true)};
}

// The optimizer of one process: every group a local world of one.
struct OneProcess {
    parallel::LocalCommunicator world{"world"}, dp{"dp"}, edp{"edp"};
    std::vector<float> grads = std::vector<float>(12, 0.0f);
    AdamW make(const AdamWConfig& config) {
        return AdamW(spans(), 12, grads.data(), {world, dp, edp}, config);
    }
};

// The step as the trainer takes it: synchronize (nothing to sum over one rank), clip, update.
double sync_clip_and_step(AdamW& opt, std::vector<float>& grads, std::vector<float>& params,
                          double lr) {
    opt.grad_sync().arm();
    opt.grad_sync().finish();
    const double norm = opt.clip_gradients(grads.data());
    opt.step(params.data(), grads.data(), lr);
    return norm;
}

TEST(AdamW, DecaysOnlyDecayTensorsAndSkipsNonTrainable) {
    OneProcess p;
    AdamWConfig cfg;
    cfg.weight_decay = 0.5;
    cfg.grad_clip = 0.0;
    AdamW opt = p.make(cfg);
    std::vector<float> params(12, 2.0f);
    p.grads[6] = p.grads[7] = 3.0f;  // the non-trainable bias has a gradient: it must be ignored
    p.grads[8] = 5.0f;               // so must the gap
    sync_clip_and_step(opt, p.grads, params, /*lr=*/0.1);
    // Zero gradient: Adam's step is 0 / (0 + eps) = 0, so only the decay moves parameters.
    const float decayed = 2.0f * (1.0f - 0.1f * 0.5f);
    for (int i : {0, 1, 2, 3, 9, 10, 11}) EXPECT_FLOAT_EQ(params[i], decayed) << i;
    for (int i : {4, 5}) EXPECT_FLOAT_EQ(params[i], 2.0f) << "norms are not decayed, " << i;
    for (int i : {6, 7, 8}) EXPECT_FLOAT_EQ(params[i], 2.0f) << "not trainable, " << i;
    // No moments are kept for what is not trainable.
    for (const AdamW::MomentRange& r : opt.moment_ranges())
        EXPECT_TRUE(r.offset + r.numel <= 6 || r.offset >= 9) << r.offset << "+" << r.numel;
    EXPECT_EQ(opt.step_count(), 1);
}

TEST(AdamW, MatchesTheKernelTensorByTensor) {
    OneProcess p;
    AdamWConfig cfg;
    cfg.weight_decay = 0.1;
    cfg.grad_clip = 0.0;
    AdamW opt = p.make(cfg);
    std::vector<float> params(12);
    for (int i = 0; i < 12; ++i) params[i] = 0.1f * static_cast<float>(i) - 0.5f;
    std::vector<float> expected = params, m(12), v(12);
    for (int t = 1; t <= 3; ++t) {
        for (int i = 0; i < 12; ++i) p.grads[i] = 0.03f * static_cast<float>((i * 7) % 5) - 0.06f;
        const std::vector<float> g = p.grads;
        sync_clip_and_step(opt, p.grads, params, 1e-2);
        cpu::AdamWParams hp{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t};
        cpu::adamw_update(expected.data(), m.data(), v.data(), g.data(), 4, hp);
        cpu::adamw_update(expected.data() + 9, m.data() + 9, v.data() + 9, g.data() + 9, 3, hp);
        hp.weight_decay = 0.0f;
        cpu::adamw_update(expected.data() + 4, m.data() + 4, v.data() + 4, g.data() + 4, 2, hp);
    }
    for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(params[i], expected[i]) << i;
    EXPECT_FLOAT_EQ(params[6], 0.1f);  // untouched
}

TEST(AdamW, ClipsTheGlobalNormOfTrainableGradients) {
    OneProcess p;
    AdamWConfig cfg;
    cfg.grad_clip = 1.0;
    AdamW opt = p.make(cfg);
    p.grads[0] = 3.0f;   // w
    p.grads[4] = 4.0f;   // norm: trainable, counts
    p.grads[6] = 12.0f;  // bias: not trainable, neither counted nor scaled
    EXPECT_DOUBLE_EQ(opt.clip_gradients(p.grads.data()), 5.0);
    EXPECT_NEAR(p.grads[0], 0.6f, 1e-6);
    EXPECT_NEAR(p.grads[4], 0.8f, 1e-6);
    EXPECT_EQ(p.grads[6], 12.0f);
    // Within the limit: unchanged. Clipping off: unchanged.
    EXPECT_NEAR(opt.clip_gradients(p.grads.data()), 1.0, 1e-6);
    EXPECT_NEAR(p.grads[0], 0.6f, 1e-6);
    cfg.grad_clip = 0.0;
    AdamW unclipped = p.make(cfg);
    p.grads[0] = 30.0f;
    unclipped.clip_gradients(p.grads.data());
    EXPECT_EQ(p.grads[0], 30.0f);
}

TEST(AdamW, RejectsTensorsOutsideTheBufferOrOverlapping) {
    parallel::LocalCommunicator world("world"), dp("dp"), edp("edp");
    std::vector<float> grads(12);
    const std::vector<ParamSpan> outside{span(10, 4, true, true)};
    EXPECT_THROW(AdamW(outside, 12, grads.data(), {world, dp, edp}, {}), Error);
    const std::vector<ParamSpan> overlapping{span(0, 4, true, true), span(2, 4, true, true)};
    EXPECT_THROW(AdamW(overlapping, 12, grads.data(), {world, dp, edp}, {}), Error);
}

TEST(AdamW, RefusesANegativeStepCount) {
    OneProcess p;
    AdamW opt = p.make({});
    EXPECT_THROW(opt.restore_step_count(-1), Error);
}

// The optimizer's state and the gradient sync's shards come from the backend's memory, one arena
// each planned at construction (the backend then owns every tensor: host or device alike), and
// the moments a checkpoint reads and writes in place lie inside the optimizer's arena.
TEST(AdamW, KeepsItsStateInOneArenaFromTheBackendsMemory) {
    for (const bool zero1 : {false, true}) {
        OneProcess p;
        ProfilingBackend backend;
        AdamWConfig cfg;
        cfg.grad_sync.zero1 = zero1;
        AdamW opt(spans(), 12, p.grads.data(), {p.world, p.dp, p.edp}, cfg, backend);
        EXPECT_EQ(backend.memory_requests(), 2) << "one arena for GradSync, one for AdamW";
        const Arena& arena = opt.state_arena();
        EXPECT_EQ(arena.plan().name(), "optimizer_state");
        const auto* begin = static_cast<const char*>(arena.base());
        const char* end = begin + arena.size_bytes();
        const std::vector<AdamW::MomentRange> ranges = opt.moment_ranges();
        ASSERT_FALSE(ranges.empty());
        for (const AdamW::MomentRange& r : ranges) {
            for (const float* moment : {r.m, r.v}) {
                const auto* first = reinterpret_cast<const char*>(moment);
                EXPECT_TRUE(first >= begin && first + r.numel * sizeof(float) <= end)
                    << "zero1 " << zero1 << ": a moment range outside the optimizer's arena";
                for (int64_t i = 0; i < r.numel; ++i) EXPECT_EQ(moment[i], 0.0f);
            }
        }
    }
}

}  // namespace
}  // namespace moetron
