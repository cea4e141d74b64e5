// kernels/split_backward_backend: while deferring, the GEMM backwards compute their input
// gradient at once and their weight gradient only when the slot is replayed, from copies of the
// operands (the caller may overwrite its buffers in between), accumulating exactly what the
// unsplit backward would, in the number format of the call.
#include <gtest/gtest.h>

#include <vector>

#include "moetron/kernels/backend.h"
#include "moetron/kernels/split_backward_backend.h"

namespace moetron {
namespace {

std::vector<float> ramp(size_t n, float scale) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % 7) - 3);
    return v;
}

TEST(SplitBackwardBackend, LinearWeightGradientWaitsForItsSlotAndMatchesTheWholeBackward) {
    constexpr int64_t rows = 5, in_dim = 4, out_dim = 3;
    std::vector<float> dout = ramp(rows * out_dim, 0.5f), inp = ramp(rows * in_dim, 0.25f),
                       weight = ramp(out_dim * in_dim, 0.125f);
    std::vector<float> want_dinp(rows * in_dim), want_dweight(out_dim * in_dim, 1.0f);
    cpu_backend().linear_backward(want_dinp.data(), want_dweight.data(), dout.data(), inp.data(),
                                  weight.data(), rows, in_dim, out_dim, kFp32Gemm);

    SplitBackwardBackend split(cpu_backend());
    split.plan_stash(/*slots=*/2, rows * (in_dim + out_dim), /*offsets_per_slot=*/0,
                     /*gemms_per_slot=*/1);
    std::vector<float> dinp(rows * in_dim), dweight(out_dim * in_dim, 1.0f);
    split.defer_into(1);
    split.linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rows,
                          in_dim, out_dim, kFp32Gemm);
    split.stop_deferring();
    EXPECT_EQ(dinp, want_dinp);  // B: the input gradient now
    EXPECT_EQ(dweight, std::vector<float>(out_dim * in_dim, 1.0f)) << "W ran in B";
    // The caller's scratch is reused before W: the stash kept its own copies.
    std::fill(dout.begin(), dout.end(), 9.0f);
    std::fill(inp.begin(), inp.end(), 9.0f);
    split.run_deferred(0);  // another micro-batch's slot: nothing
    EXPECT_EQ(dweight, std::vector<float>(out_dim * in_dim, 1.0f));
    split.run_deferred(1);
    EXPECT_EQ(dweight, want_dweight);
    // The slot is empty again: a second replay adds nothing, and it can take the next B.
    split.run_deferred(1);
    EXPECT_EQ(dweight, want_dweight);
    split.defer_into(1);
    split.stop_deferring();
    EXPECT_GT(split.stash_bytes(), 0u);
}

// A range the backward announced final during B is delivered after the weight gradients queued
// before it, when they are final.
TEST(SplitBackwardBackend, NoticesComeAfterTheWeightGradientsQueuedBeforeThem) {
    constexpr int64_t rows = 2, dim = 2;
    const std::vector<float> dout = ramp(rows * dim, 0.5f), inp = ramp(rows * dim, 0.25f),
                             weight = ramp(dim * dim, 0.125f);
    std::vector<float> dinp(rows * dim), dweight(dim * dim, 0.0f);
    SplitBackwardBackend split(cpu_backend());
    split.plan_stash(1, 2 * rows * 2 * dim, 0, 3);
    split.defer_into(0);
    split.linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rows,
                          dim, dim, kFp32Gemm);
    split.defer_notice(0, 4);
    split.linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rows,
                          dim, dim, kFp32Gemm);
    split.stop_deferring();
    std::vector<std::vector<float>> seen;  // dweight as each notice arrives
    split.run_deferred(0, [&](int64_t begin, int64_t end) {
        EXPECT_EQ(begin, 0);
        EXPECT_EQ(end, 4);
        seen.push_back(dweight);
    });
    std::vector<float> once(dim * dim, 0.0f), twice(dim * dim, 0.0f);
    cpu_backend().linear_backward(nullptr, once.data(), dout.data(), inp.data(), weight.data(),
                                  rows, dim, dim, kFp32Gemm);
    twice = once;
    cpu_backend().linear_backward(nullptr, twice.data(), dout.data(), inp.data(), weight.data(),
                                  rows, dim, dim, kFp32Gemm);
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0], once) << "the notice came before or after the first weight gradient only";
    EXPECT_EQ(dweight, twice);
}

// A weight gradient into a buffer outside the model's gradients is a partial sum that the
// backward reduces at once (MTP's eh_proj under tensor parallelism): it runs whole in B.
TEST(SplitBackwardBackend, WeightGradientsOutsideTheGradientBufferRunInB) {
    constexpr int64_t rows = 2, dim = 2;
    const std::vector<float> dout = ramp(rows * dim, 0.5f), inp = ramp(rows * dim, 0.25f),
                             weight = ramp(dim * dim, 0.125f);
    std::vector<float> gradients(dim * dim, 0.0f), partial(dim * dim, 0.0f), dinp(rows * dim);
    std::vector<float> want(dim * dim, 0.0f);
    cpu_backend().linear_backward(nullptr, want.data(), dout.data(), inp.data(), weight.data(),
                                  rows, dim, dim, kFp32Gemm);
    SplitBackwardBackend split(cpu_backend());
    split.plan_stash(1, 2 * rows * 2 * dim, 0, 2);
    split.set_deferrable_gradients(gradients.data(), dim * dim);
    split.defer_into(0);
    split.linear_backward(dinp.data(), partial.data(), dout.data(), inp.data(), weight.data(), rows,
                          dim, dim, kFp32Gemm);
    split.linear_backward(dinp.data(), gradients.data(), dout.data(), inp.data(), weight.data(),
                          rows, dim, dim, kFp32Gemm);
    split.stop_deferring();
    EXPECT_EQ(partial, want) << "the partial sum waited for W";
    EXPECT_EQ(gradients, std::vector<float>(dim * dim, 0.0f)) << "the model's gradient ran in B";
    split.run_deferred(0);
    EXPECT_EQ(gradients, want);
}

TEST(SplitBackwardBackend, GroupedWeightGradientKeepsItsOwnOffsets) {
    constexpr int64_t experts = 3, in_dim = 4, out_dim = 2, rows = 6;
    std::vector<int64_t> offsets = {0, 2, 2, 6};  // expert 1 gets no rows
    std::vector<float> dout = ramp(rows * out_dim, 0.5f), inp = ramp(rows * in_dim, 0.25f),
                       weight = ramp(experts * out_dim * in_dim, 0.125f);
    std::vector<float> want_dinp(rows * in_dim), want_dweight(experts * out_dim * in_dim, 0.0f);
    cpu_backend().grouped_linear_backward(want_dinp.data(), want_dweight.data(), dout.data(),
                                          inp.data(), weight.data(), offsets.data(), experts,
                                          in_dim, out_dim, kFp32Gemm);

    SplitBackwardBackend split(cpu_backend());
    split.plan_stash(1, rows * (in_dim + out_dim), experts + 1, 1);
    std::vector<float> dinp(rows * in_dim), dweight(experts * out_dim * in_dim, 0.0f);
    split.defer_into(0);
    split.grouped_linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(),
                                  weight.data(), offsets.data(), experts, in_dim, out_dim,
                                  kFp32Gemm);
    split.stop_deferring();
    EXPECT_EQ(dinp, want_dinp);
    EXPECT_EQ(dweight, std::vector<float>(experts * out_dim * in_dim, 0.0f));
    offsets = {0, 6, 6, 6};  // the dispatcher routes the next micro-batch before W
    split.run_deferred(0);
    EXPECT_EQ(dweight, want_dweight);
}

// The weight gradient replays in W in the number format its call gave in B.
TEST(SplitBackwardBackend, AWeightGradientReplaysInTheFormatOfItsCall) {
    constexpr int64_t rows = 40, in_dim = 64, out_dim = 48;
    const std::vector<float> dout = ramp(rows * out_dim, 0.37f), inp = ramp(rows * in_dim, 0.29f),
                             weight = ramp(out_dim * in_dim, 0.013f);
    const GemmPrecision mxfp8{Precision::mxfp8};
    std::vector<float> want(out_dim * in_dim, 0.0f), float32(out_dim * in_dim, 0.0f);
    cpu_backend().linear_backward(nullptr, want.data(), dout.data(), inp.data(), weight.data(),
                                  rows, in_dim, out_dim, mxfp8);
    cpu_backend().linear_backward(nullptr, float32.data(), dout.data(), inp.data(), weight.data(),
                                  rows, in_dim, out_dim, kFp32Gemm);
    ASSERT_NE(want, float32) << "the format rounded nothing";
    SplitBackwardBackend split(cpu_backend());
    split.plan_stash(1, rows * (in_dim + out_dim), 0, 1);
    std::vector<float> dinp(rows * in_dim), dweight(out_dim * in_dim, 0.0f);
    split.defer_into(0);
    split.linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rows,
                          in_dim, out_dim, mxfp8);
    split.stop_deferring();
    split.run_deferred(0);
    EXPECT_EQ(dweight, want);
}

TEST(SplitBackwardBackend, WithoutDeferringEveryOpIsTheInnerOnes) {
    constexpr int64_t rows = 2, in_dim = 3, out_dim = 2;
    const std::vector<float> dout = ramp(rows * out_dim, 0.5f), inp = ramp(rows * in_dim, 0.25f),
                             weight = ramp(out_dim * in_dim, 0.125f);
    std::vector<float> want_dinp(rows * in_dim), want_dweight(out_dim * in_dim, 0.0f);
    cpu_backend().linear_backward(want_dinp.data(), want_dweight.data(), dout.data(), inp.data(),
                                  weight.data(), rows, in_dim, out_dim, kFp32Gemm);
    SplitBackwardBackend split(cpu_backend());  // no stash: nothing is ever queued
    std::vector<float> dinp(rows * in_dim), dweight(out_dim * in_dim, 0.0f);
    split.linear_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rows,
                          in_dim, out_dim, kFp32Gemm);
    EXPECT_EQ(dinp, want_dinp);
    EXPECT_EQ(dweight, want_dweight);
}

}  // namespace
}  // namespace moetron
