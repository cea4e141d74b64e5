// kernels/cpu/router: DeepSeek-V3 group-limited top-k routing against hand-made cases and a plain
// float64 reference (sort-based, written independently of the kernel's insertion lists), and its
// backward against float64 central finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/router.h"
#include "testing.h"

namespace moetron {
namespace {

using cpu::RouterShape;
using testing::compare;
using testing::expect_close;

struct RouterOutput {
    std::vector<int32_t> ids;    // (N, K)
    std::vector<float> weights;  // (N, K)
    std::vector<float> scores;   // (N, E)
};

RouterOutput run_router(const std::vector<float>& logits, const std::vector<float>& bias,
                        const RouterShape& shape) {
    RouterOutput out;
    out.ids.resize(shape.num_tokens * shape.top_k);
    out.weights.resize(shape.num_tokens * shape.top_k);
    out.scores.resize(shape.num_tokens * shape.num_experts);
    cpu::router_forward(out.ids.data(), out.weights.data(), out.scores.data(), logits.data(),
                        bias.empty() ? nullptr : bias.data(), shape);
    return out;
}

struct ReferenceRouting {
    std::vector<int32_t> ids;     // (N, K)
    std::vector<double> weights;  // (N, K)
    std::vector<double> scores;   // (N, E)
};

// The routing rule spelled out with sorts: (value descending, index ascending) orders everything.
ReferenceRouting reference_router(const std::vector<double>& logits,
                                  const std::vector<double>& bias, const RouterShape& shape) {
    const int64_t N = shape.num_tokens, E = shape.num_experts, K = shape.top_k;
    const int64_t G = shape.num_groups, per_group = E / G;
    ReferenceRouting ref;
    ref.ids.resize(N * K);
    ref.weights.resize(N * K);
    ref.scores.resize(N * E);
    for (int64_t t = 0; t < N; ++t) {
        std::vector<double> choice(E);
        for (int64_t e = 0; e < E; ++e) {
            ref.scores[t * E + e] = 1.0 / (1.0 + std::exp(-logits[t * E + e]));
            choice[e] = ref.scores[t * E + e] + (bias.empty() ? 0.0 : bias[e]);
        }
        auto by_value_then_index = [](const std::vector<double>& value) {
            return [&value](int64_t a, int64_t b) {
                return value[a] != value[b] ? value[a] > value[b] : a < b;
            };
        };
        std::vector<double> group_score(G);
        for (int64_t g = 0; g < G; ++g) {
            std::vector<double> members(choice.begin() + g * per_group,
                                        choice.begin() + (g + 1) * per_group);
            std::sort(members.begin(), members.end(), std::greater<>());
            group_score[g] = members[0] + (per_group > 1 ? members[1] : 0.0);
        }
        std::vector<int64_t> groups(G);
        std::iota(groups.begin(), groups.end(), 0);
        std::sort(groups.begin(), groups.end(), by_value_then_index(group_score));
        std::vector<int64_t> candidates;
        for (int64_t i = 0; i < shape.topk_groups; ++i)
            for (int64_t e = groups[i] * per_group; e < (groups[i] + 1) * per_group; ++e)
                candidates.push_back(e);
        std::sort(candidates.begin(), candidates.end(), by_value_then_index(choice));
        double sum = 0;
        for (int64_t j = 0; j < K; ++j) sum += ref.scores[t * E + candidates[j]];
        for (int64_t j = 0; j < K; ++j) {
            ref.ids[t * K + j] = static_cast<int32_t>(candidates[j]);
            double w = ref.scores[t * E + candidates[j]];
            if (shape.norm_topk_prob) w /= sum + 1e-20;
            ref.weights[t * K + j] = w * shape.routed_scaling_factor;
        }
    }
    return ref;
}

// logit whose sigmoid is p.
float logit_of(double p) {
    return static_cast<float>(std::log(p / (1.0 - p)));
}

TEST(Router, GroupLimitedSelectionDiffersFromPlainTopK) {
    // E=8 in G=4 groups {0,1} {2,3} {4,5} {6,7}; keep 2 groups, pick K=2.
    // Plain top-2 of s is {0 (0.90), 6 (0.85)}, but their groups score 0.90+0.10 and 0.85+0.05,
    // below groups 1 (0.62+0.58 = 1.20) and 2 (0.57+0.53 = 1.10): the answer is {2, 3}.
    const std::vector<double> s = {0.90, 0.10, 0.62, 0.58, 0.57, 0.53, 0.85, 0.05};
    std::vector<float> logits;
    for (double p : s) logits.push_back(logit_of(p));
    RouterShape shape{1, 8, 2, 4, 2, 2.5f, true};
    RouterOutput out = run_router(logits, {}, shape);
    EXPECT_EQ(out.ids, (std::vector<int32_t>{2, 3}));
    const double expected_weights[2] = {2.5 * 0.62 / 1.20, 2.5 * 0.58 / 1.20};
    expect_close("router", "hand-made group-limited weights",
                 compare(out.weights.data(), expected_weights, 2), 1e-6);

    // The same scores with one group (G=1) is plain top-k: {0, 6}.
    RouterShape plain{1, 8, 2, 1, 1, 1.0f, false};
    out = run_router(logits, {}, plain);
    EXPECT_EQ(out.ids, (std::vector<int32_t>{0, 6}));
    const double plain_weights[2] = {0.90, 0.85};
    expect_close("router", "hand-made plain top-k weights (no norm, scale 1)",
                 compare(out.weights.data(), plain_weights, 2), 1e-6);
}

TEST(Router, BiasChangesSelectionButNotWeights) {
    // G=4 groups of 2, keep 2, K=2. Without bias, groups 0 (0.9+0.8) and 1 (0.7+0.6) win and
    // the experts are {0, 1}. A bias of +0.9 on expert 5 makes its choice 1.2 and group 2's score
    // 1.2+0.2 = 1.4 > group 1's 1.3: groups {0, 2} are kept and the experts become {5, 0}, but
    // the weights still come from the unbiased s (0.3 and 0.9).
    const std::vector<double> s = {0.9, 0.8, 0.7, 0.6, 0.2, 0.3, 0.1, 0.15};
    std::vector<float> logits;
    for (double p : s) logits.push_back(logit_of(p));
    RouterShape shape{1, 8, 2, 4, 2, 1.0f, true};

    RouterOutput unbiased = run_router(logits, std::vector<float>(8, 0.0f), shape);
    EXPECT_EQ(unbiased.ids, (std::vector<int32_t>{0, 1}));

    std::vector<float> bias(8, 0.0f);
    bias[5] = 0.9f;
    RouterOutput biased = run_router(logits, bias, shape);
    EXPECT_EQ(biased.ids, (std::vector<int32_t>{5, 0}));
    const double expected[2] = {0.3 / 1.2, 0.9 / 1.2};
    expect_close("router", "biased selection, unbiased weights",
                 compare(biased.weights.data(), expected, 2), 1e-6);
    // The saved scores never include the bias.
    expect_close("router", "scores are sigmoid(logits)", compare(biased.scores.data(), s.data(), 8),
                 1e-6);
}

TEST(Router, BiasReordersWithinSelectionWithoutChangingWeights) {
    // A bias that only reorders the chosen set leaves every (expert, weight) pair unchanged.
    const std::vector<double> s = {0.9, 0.8, 0.1, 0.2};
    std::vector<float> logits;
    for (double p : s) logits.push_back(logit_of(p));
    RouterShape shape{1, 4, 2, 1, 1, 2.5f, true};
    RouterOutput plain = run_router(logits, {}, shape);
    RouterOutput biased = run_router(logits, {0.0f, 0.2f, 0.0f, 0.0f}, shape);
    EXPECT_EQ(plain.ids, (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(biased.ids, (std::vector<int32_t>{1, 0}));
    EXPECT_EQ(plain.weights[0], biased.weights[1]);
    EXPECT_EQ(plain.weights[1], biased.weights[0]);
}

TEST(Router, TiesGoToLowerIndices) {
    // All scores equal: groups 0 and 1 are kept, experts 0, 1, 2 chosen in index order.
    RouterShape shape{2, 8, 3, 4, 2, 1.0f, true};
    RouterOutput out = run_router(std::vector<float>(16, 0.25f), {}, shape);
    EXPECT_EQ(out.ids, (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
    for (float w : out.weights) EXPECT_NEAR(w, 1.0f / 3.0f, 1e-7f);
}

TEST(Router, ExpertsOutsideKeptGroupsAreNeverChosen) {
    // Negative choices inside the kept group: Hugging Face's mask-to-0.0 would pick experts of
    // the dropped group (0.0 > -0.1); moetron keeps the topk_group limit.
    // G=2, keep 1, K=2. s = 0.4 everywhere; bias makes choices -0.1, -0.2 | -0.3, -0.4.
    RouterShape shape{1, 4, 2, 2, 1, 1.0f, true};
    std::vector<float> logits(4, logit_of(0.4));
    RouterOutput out = run_router(logits, {-0.5f, -0.6f, -0.7f, -0.8f}, shape);
    EXPECT_EQ(out.ids, (std::vector<int32_t>{0, 1}));
}

TEST(Router, MatchesReferenceOnRandomInputs) {
    RouterShape shape{64, 16, 4, 4, 2, 2.5f, true};
    const auto logits = testing::random_floats(64 * 16, 11, 2.0f);
    const auto bias = testing::random_floats(16, 12, 0.1f);
    RouterOutput out = run_router(logits, bias, shape);
    ReferenceRouting ref =
        reference_router(testing::to_double(logits), testing::to_double(bias), shape);
    EXPECT_EQ(out.ids, ref.ids);
    expect_close("router", "random weights (norm, scale 2.5)",
                 compare(out.weights.data(), ref.weights.data(), ref.weights.size()), 1e-5);
    expect_close("router", "random scores",
                 compare(out.scores.data(), ref.scores.data(), ref.scores.size()), 1e-5);
    // Every token's experts come from at most topk_group groups.
    for (int64_t t = 0; t < 64; ++t) {
        std::vector<int32_t> groups;
        for (int64_t j = 0; j < 4; ++j) groups.push_back(out.ids[t * 4 + j] / 4);
        std::sort(groups.begin(), groups.end());
        EXPECT_LE(std::unique(groups.begin(), groups.end()) - groups.begin(), 2);
    }
}

TEST(Router, ShapeErrorsNameTheConfigKey) {
    std::vector<float> logits(16, 0.0f);
    auto expect_error_naming = [&](const RouterShape& shape, const std::string& key) {
        try {
            run_router(logits, {}, shape);
            ADD_FAILURE() << "no error for a bad " << key;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
        }
    };
    expect_error_naming({1, 8, 2, 3, 1, 1.0f, true}, "n_group");              // 8 % 3 != 0
    expect_error_naming({1, 8, 2, 4, 5, 1.0f, true}, "topk_group");           // 5 > 4 groups
    expect_error_naming({1, 8, 5, 4, 2, 1.0f, true}, "num_experts_per_tok");  // 5 > 2*2
    expect_error_naming({1, 2000, 2, 1, 1, 1.0f, true}, "n_routed_experts");  // over the bound
}

// Backward: L = sum dw * w + sum dextra * s, checked against central differences of the float64
// reference. The reference re-selects at every evaluation; the test asserts the selection never
// flips, so the difference quotient is the derivative of one smooth branch.
void check_router_backward(bool norm_topk_prob, bool with_extra) {
    const int64_t N = 6, E = 16, K = 4;
    RouterShape shape{N, E, K, 4, 2, 2.5f, norm_topk_prob};
    const auto logits = testing::random_floats(N * E, 21, 1.5f);
    const auto bias = testing::random_floats(E, 22, 0.05f);
    const auto dweights = testing::random_floats(N * K, 23);
    const auto dextra = with_extra ? testing::random_floats(N * E, 24) : std::vector<float>();

    RouterOutput out = run_router(logits, bias, shape);
    std::vector<float> dlogits(N * E, -7.0f);  // garbage: the backward must overwrite it
    cpu::router_backward(dlogits.data(), dweights.data(), with_extra ? dextra.data() : nullptr,
                         out.scores.data(), out.ids.data(), shape);

    const std::vector<double> bias64 = testing::to_double(bias);
    int selection_flips = 0;
    auto loss = [&](const std::vector<double>& x) {
        ReferenceRouting r = reference_router(x, bias64, shape);
        if (r.ids != out.ids) ++selection_flips;
        double l = 0;
        for (int64_t i = 0; i < N * K; ++i) l += dweights[i] * r.weights[i];
        if (with_extra)
            for (int64_t i = 0; i < N * E; ++i) l += dextra[i] * r.scores[i];
        return l;
    };
    const auto expected = testing::finite_difference_gradient(loss, testing::to_double(logits));
    EXPECT_EQ(selection_flips, 0) << "a finite-difference step changed the routing";
    const std::string what = std::string("dlogits") + (norm_topk_prob ? " (norm" : " (no norm") +
                             (with_extra ? ", + dscores_extra)" : ")");
    expect_close("router", what.c_str(), compare(dlogits.data(), expected.data(), N * E), 1e-4);
}

TEST(Router, BackwardMatchesFiniteDifferencesWithNorm) {
    check_router_backward(true, false);
}
TEST(Router, BackwardMatchesFiniteDifferencesWithoutNorm) {
    check_router_backward(false, false);
}
TEST(Router, BackwardMatchesFiniteDifferencesWithExtraScoreGradient) {
    check_router_backward(true, true);
}

}  // namespace
}  // namespace moetron
