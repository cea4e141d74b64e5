// kernels/cpu/cross_entropy: fused softmax cross-entropy against a float64 reference, its
// backward against finite differences (with ignored tokens), in-place use, and bad targets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/cross_entropy.h"
#include "testing.h"

namespace moetron {
namespace {

using testing::compare;
using testing::expect_close;

constexpr int32_t kIgnore = -100;  // PyTorch's default ignore_index

// Per-token float64 losses (0 for ignored tokens) and log-sum-exps.
void reference_cross_entropy(std::vector<double>& losses, std::vector<double>& lse,
                             const std::vector<double>& logits, const std::vector<int32_t>& targets,
                             int64_t V) {
    const auto N = static_cast<int64_t>(targets.size());
    losses.assign(N, 0.0);
    lse.assign(N, 0.0);
    for (int64_t t = 0; t < N; ++t) {
        double row_max = logits[t * V];
        for (int64_t v = 1; v < V; ++v) row_max = std::max(row_max, logits[t * V + v]);
        double sum = 0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[t * V + v] - row_max);
        lse[t] = row_max + std::log(sum);
        if (targets[t] != kIgnore) losses[t] = lse[t] - logits[t * V + targets[t]];
    }
}

TEST(CrossEntropy, ForwardMatchesReferenceAndIsStableForLargeLogits) {
    const int64_t N = 9, V = 37;
    auto logits = testing::random_floats(N * V, 1, 3.0f);
    for (int64_t v = 0; v < V; ++v) logits[4 * V + v] += 1000.0f;  // exp would overflow unshifted
    const std::vector<int32_t> targets = {3, kIgnore, 0, 36, 17, kIgnore, 5, 5, 20};

    std::vector<float> losses(N, -1.0f), lse(N);
    const auto result = cpu::cross_entropy_forward(losses.data(), lse.data(), logits.data(),
                                                   targets.data(), N, V, kIgnore);
    std::vector<double> ref_losses, ref_lse;
    reference_cross_entropy(ref_losses, ref_lse, testing::to_double(logits), targets, V);

    EXPECT_EQ(result.num_valid, 7);
    expect_close("cross_entropy", "losses", compare(losses.data(), ref_losses.data(), N), 1e-5);
    expect_close("cross_entropy", "lse", compare(lse.data(), ref_lse.data(), N), 1e-6);
    double ref_sum = 0;
    for (double l : ref_losses) ref_sum += l;
    expect_close("cross_entropy", "loss_sum", compare(&result.loss_sum, &ref_sum, 1), 1e-6);
    EXPECT_DOUBLE_EQ(result.mean(), result.loss_sum / 7.0);
    EXPECT_EQ(losses[1], 0.0f);
    EXPECT_EQ(losses[5], 0.0f);
    for (float l : losses) EXPECT_TRUE(std::isfinite(l));
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferencesWithIgnoredTokens) {
    const int64_t N = 6, V = 11;
    const auto logits = testing::random_floats(N * V, 2, 2.0f);
    const std::vector<int32_t> targets = {4, kIgnore, 0, 10, kIgnore, 7};
    const float dloss = 0.3f / 4.0f;  // a weighted mean over the 4 valid tokens

    std::vector<float> losses(N), lse(N), dlogits(N * V, 9.0f);  // garbage: must be overwritten
    cpu::cross_entropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V,
                               kIgnore);
    cpu::cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), N, V,
                                kIgnore, dloss);

    auto loss = [&](const std::vector<double>& x) {
        std::vector<double> l, s;
        reference_cross_entropy(l, s, x, targets, V);
        double total = 0;
        for (double li : l) total += dloss * li;
        return total;
    };
    const auto expected = testing::finite_difference_gradient(loss, testing::to_double(logits));
    // Floor 1e-3: gradients here are ~dloss/V..dloss in size.
    expect_close("cross_entropy", "dlogits (2 of 6 tokens ignored)",
                 compare(dlogits.data(), expected.data(), N * V, 1e-3), 1e-4);
    for (int64_t v = 0; v < V; ++v) {
        EXPECT_EQ(dlogits[1 * V + v], 0.0f);
        EXPECT_EQ(dlogits[4 * V + v], 0.0f);
    }

    // In place (dlogits aliasing logits) gives the same gradient.
    std::vector<float> in_place = logits;
    cpu::cross_entropy_backward(in_place.data(), in_place.data(), lse.data(), targets.data(), N, V,
                                kIgnore, dloss);
    EXPECT_EQ(in_place, dlogits);
}

TEST(CrossEntropy, AllIgnoredBatchHasNoValidTokensAndZeroGradient) {
    const int64_t N = 4, V = 5;
    const auto logits = testing::random_floats(N * V, 3);
    const std::vector<int32_t> targets(N, kIgnore);
    std::vector<float> losses(N, 1.0f), lse(N), dlogits(N * V, 1.0f);
    const auto result = cpu::cross_entropy_forward(losses.data(), lse.data(), logits.data(),
                                                   targets.data(), N, V, kIgnore);
    EXPECT_EQ(result.num_valid, 0);
    EXPECT_EQ(result.loss_sum, 0.0);
    EXPECT_EQ(result.mean(), 0.0);
    EXPECT_EQ(losses, std::vector<float>(N, 0.0f));
    cpu::cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), N, V,
                                kIgnore, 1.0f);
    EXPECT_EQ(dlogits, std::vector<float>(N * V, 0.0f));
}

// The vocabulary-parallel parts, combined over uneven column blocks as the TP ranks would (max
// of the maxima, sums of the sums), give the plain kernel's losses, lse and gradient.
TEST(CrossEntropy, VocabularyPartsCombineToThePlainKernel) {
    const int64_t N = 7, V = 30;
    const int64_t part_begin[] = {0, 9, 20, 30};  // three parts of 9, 11 and 10 columns
    auto logits = testing::random_floats(N * V, 4, 3.0f);
    for (int64_t v = 0; v < V; ++v) logits[2 * V + v] += 500.0f;  // needs the shared max
    const std::vector<int32_t> targets = {0, 8, 9, kIgnore, 29, 20, 19};
    const float dloss = 0.25f;

    std::vector<float> losses(N), lse(N), dlogits(N * V);
    const auto want = cpu::cross_entropy_forward(losses.data(), lse.data(), logits.data(),
                                                 targets.data(), N, V, kIgnore);
    cpu::cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), N, V,
                                kIgnore, dloss);

    // Each part's columns as a contiguous (N, Vp) block, as a rank holds them.
    auto part_logits = [&](int p) {
        const int64_t first = part_begin[p], Vp = part_begin[p + 1] - first;
        std::vector<float> out(N * Vp);
        for (int64_t t = 0; t < N; ++t)
            for (int64_t v = 0; v < Vp; ++v) out[t * Vp + v] = logits[t * V + first + v];
        return out;
    };
    std::vector<float> row_max(N, -1e30f), part_max(N);
    for (int p = 0; p < 3; ++p) {
        const std::vector<float> x = part_logits(p);
        cpu::cross_entropy_part_max(part_max.data(), x.data(), N,
                                    part_begin[p + 1] - part_begin[p]);
        for (int64_t t = 0; t < N; ++t) row_max[t] = std::max(row_max[t], part_max[t]);
    }
    std::vector<double> sum_exp(N, 0.0), target_logit(N, 0.0), s(N), tl(N);
    for (int p = 0; p < 3; ++p) {
        const std::vector<float> x = part_logits(p);
        cpu::cross_entropy_part_sums(s.data(), tl.data(), x.data(), row_max.data(), targets.data(),
                                     N, part_begin[p + 1] - part_begin[p], part_begin[p], kIgnore);
        for (int64_t t = 0; t < N; ++t) {
            sum_exp[t] += s[t];
            target_logit[t] += tl[t];
        }
    }
    double loss_sum = 0;
    std::vector<float> part_lse(N);
    for (int64_t t = 0; t < N; ++t) {
        part_lse[t] = row_max[t] + static_cast<float>(std::log(sum_exp[t]));
        EXPECT_NEAR(part_lse[t], lse[t], 1e-5 * std::fabs(lse[t])) << t;
        if (targets[t] == kIgnore) continue;
        const double loss = part_lse[t] - target_logit[t];
        EXPECT_NEAR(loss, losses[t], 1e-5) << t;
        loss_sum += loss;
    }
    EXPECT_NEAR(loss_sum, want.loss_sum, 1e-5 * want.loss_sum);

    for (int p = 0; p < 3; ++p) {
        const int64_t first = part_begin[p], Vp = part_begin[p + 1] - first;
        std::vector<float> x = part_logits(p);
        // In place, as the model runs it.
        cpu::cross_entropy_part_backward(x.data(), x.data(), part_lse.data(), targets.data(), N, Vp,
                                         first, kIgnore, dloss);
        for (int64_t t = 0; t < N; ++t)
            for (int64_t v = 0; v < Vp; ++v)
                EXPECT_NEAR(x[t * Vp + v], dlogits[t * V + first + v], 1e-6)
                    << "part " << p << " token " << t << " column " << first + v;
    }
}

TEST(CrossEntropy, TargetOutsideVocabularyIsAnError) {
    const int64_t N = 2, V = 3;
    std::vector<float> logits(N * V), losses(N), lse(N);
    for (int32_t bad : {3, -1}) {
        const std::vector<int32_t> targets = {0, bad};
        EXPECT_THROW(cpu::cross_entropy_forward(losses.data(), lse.data(), logits.data(),
                                                targets.data(), N, V, kIgnore),
                     Error);
        EXPECT_THROW(cpu::cross_entropy_backward(logits.data(), logits.data(), lse.data(),
                                                 targets.data(), N, V, kIgnore, 1.0f),
                     Error);
    }
}

}  // namespace
}  // namespace moetron
