// kernels/cpu/permute: the expert layout (a stable counting sort), permute / unpermute against
// naive loops, their round trip, and their backwards against float64 finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/kernels/cpu/permute.h"
#include "testing.h"

namespace moetron {
namespace {

using testing::compare;
using testing::expect_close;

struct Layout {
    std::vector<int32_t> copy_to_row;     // (N*K)
    std::vector<int64_t> expert_offsets;  // (E + 1)
};

Layout make_layout(const std::vector<int32_t>& topk_ids, int64_t N, int64_t K, int64_t E) {
    Layout layout{std::vector<int32_t>(N * K, -1), std::vector<int64_t>(E + 1, -1)};
    cpu::moe_permute_layout(layout.copy_to_row.data(), layout.expert_offsets.data(),
                            topk_ids.data(), N, K, E);
    return layout;
}

// Distinct experts per token (as the router produces), drawn from `allowed` only, so some experts
// of [0, E) get no tokens.
std::vector<int32_t> random_topk_ids(int64_t N, int64_t K, const std::vector<int32_t>& allowed,
                                     uint64_t seed) {
    ParamRng rng(seed, "topk_ids");
    std::vector<int32_t> ids(N * K);
    for (int64_t t = 0; t < N; ++t) {
        std::vector<int32_t> pool = allowed;
        for (int64_t j = 0; j < K; ++j) {
            const auto pick = static_cast<size_t>(rng.uniform(t * K + j) * pool.size());
            ids[t * K + j] = pool[pick];
            pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(pick));
        }
    }
    return ids;
}

TEST(Permute, LayoutIsAStableSortByExpert) {
    // N=4, K=2, E=5; expert 3 gets no token. Copies c = t*K + j choose experts
    //   c: 0 1 2 3 4 5 6 7
    //   e: 2 0 0 4 2 1 4 0
    // Sorted stably by expert: e0 {1, 2, 7} -> rows 0-2, e1 {5} -> 3, e2 {0, 4} -> 4-5, e4 {3, 6}.
    const std::vector<int32_t> ids = {2, 0, 0, 4, 2, 1, 4, 0};
    Layout layout = make_layout(ids, 4, 2, 5);
    EXPECT_EQ(layout.copy_to_row, (std::vector<int32_t>{4, 0, 1, 6, 5, 3, 7, 2}));
    EXPECT_EQ(layout.expert_offsets, (std::vector<int64_t>{0, 3, 4, 6, 6, 8}));
}

TEST(Permute, LayoutMatchesStableSortOnRandomRouting) {
    const int64_t N = 50, K = 3, E = 7;
    const auto ids = random_topk_ids(N, K, {0, 2, 3, 5, 6}, 1);  // experts 1 and 4 stay empty
    Layout layout = make_layout(ids, N, K, E);

    std::vector<int32_t> order(N * K);  // copies in row order
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
    for (int64_t row = 0; row < N * K; ++row) EXPECT_EQ(layout.copy_to_row[order[row]], row);

    for (int64_t e = 0; e < E; ++e) {
        const auto count = std::count(ids.begin(), ids.end(), static_cast<int32_t>(e));
        EXPECT_EQ(layout.expert_offsets[e + 1] - layout.expert_offsets[e], count) << "expert " << e;
    }
    EXPECT_EQ(layout.expert_offsets[0], 0);
    EXPECT_EQ(layout.expert_offsets[1], layout.expert_offsets[2]);  // expert 1: empty segment
    EXPECT_EQ(layout.expert_offsets[E], N * K);
}

TEST(Permute, ExpertIdsOutOfRangeAreAnError) {
    std::vector<int32_t> copy_to_row(4);
    std::vector<int64_t> offsets(4);
    for (int32_t bad : {-1, 3}) {
        const std::vector<int32_t> ids = {0, 1, bad, 2};
        EXPECT_THROW(
            cpu::moe_permute_layout(copy_to_row.data(), offsets.data(), ids.data(), 2, 2, 3),
            Error);
    }
}

TEST(Permute, PermuteThenUnpermuteWithUnitWeightsIsKTimesInput) {
    const int64_t N = 20, K = 4, E = 9, D = 12;
    const auto ids = random_topk_ids(N, K, {0, 1, 2, 3, 5, 6, 7, 8}, 2);
    Layout layout = make_layout(ids, N, K, E);
    const auto x = testing::random_floats(N * D, 3);

    std::vector<float> permuted(N * K * D);
    cpu::permute_forward(permuted.data(), x.data(), layout.copy_to_row.data(), N, K, D);
    // Each row lies in the segment of the expert that its copy chose and holds its token.
    for (int64_t c = 0; c < N * K; ++c) {
        const int64_t row = layout.copy_to_row[c];
        EXPECT_GE(row, layout.expert_offsets[ids[c]]);
        EXPECT_LT(row, layout.expert_offsets[ids[c] + 1]);
        for (int64_t d = 0; d < D; ++d) EXPECT_EQ(permuted[row * D + d], x[(c / K) * D + d]);
    }

    std::vector<float> combined(N * D, -5.0f);
    cpu::unpermute_forward(combined.data(), permuted.data(), std::vector<float>(N * K, 1.0f).data(),
                           layout.copy_to_row.data(), N, K, D);
    std::vector<double> expected(N * D);
    for (int64_t i = 0; i < N * D; ++i) expected[i] = K * static_cast<double>(x[i]);
    expect_close("permute", "unpermute(permute(x), 1) vs K*x",
                 compare(combined.data(), expected.data(), N * D), 1e-6);
}

// Float64 reference of unpermute_forward.
std::vector<double> reference_unpermute(const std::vector<double>& inp,
                                        const std::vector<double>& weights,
                                        const std::vector<int32_t>& copy_to_row, int64_t N,
                                        int64_t K, int64_t D) {
    std::vector<double> out(N * D, 0.0);
    for (int64_t t = 0; t < N; ++t)
        for (int64_t j = 0; j < K; ++j)
            for (int64_t d = 0; d < D; ++d)
                out[t * D + d] += weights[t * K + j] * inp[copy_to_row[t * K + j] * D + d];
    return out;
}

TEST(Permute, UnpermuteMatchesNaiveLoop) {
    const int64_t N = 16, K = 3, E = 5, D = 10;
    Layout layout = make_layout(random_topk_ids(N, K, {0, 1, 2, 3, 4}, 4), N, K, E);
    const auto inp = testing::random_floats(N * K * D, 5);
    const auto weights = testing::random_floats(N * K, 6);
    std::vector<float> out(N * D);
    cpu::unpermute_forward(out.data(), inp.data(), weights.data(), layout.copy_to_row.data(), N, K,
                           D);
    const auto expected = reference_unpermute(testing::to_double(inp), testing::to_double(weights),
                                              layout.copy_to_row, N, K, D);
    expect_close("permute", "unpermute forward", compare(out.data(), expected.data(), N * D), 1e-5);
}

TEST(Permute, PermuteBackwardMatchesFiniteDifferences) {
    // L = <dout, permute(x)>: dL/dx is the sum of the copies' gradients.
    const int64_t N = 8, K = 2, E = 4, D = 6;
    Layout layout = make_layout(random_topk_ids(N, K, {0, 1, 2, 3}, 7), N, K, E);
    const auto x = testing::random_floats(N * D, 8);
    const auto dout = testing::random_floats(N * K * D, 9);

    std::vector<float> dinp(N * D, 3.0f);  // garbage: must be overwritten
    cpu::permute_backward(dinp.data(), dout.data(), layout.copy_to_row.data(), N, K, D);

    auto loss = [&](const std::vector<double>& xs) {
        double l = 0;
        for (int64_t c = 0; c < N * K; ++c)
            for (int64_t d = 0; d < D; ++d)
                l += dout[layout.copy_to_row[c] * D + d] * xs[(c / K) * D + d];
        return l;
    };
    const auto expected = testing::finite_difference_gradient(loss, testing::to_double(x));
    expect_close("permute", "permute dinp", compare(dinp.data(), expected.data(), N * D), 1e-6);
}

TEST(Permute, UnpermuteBackwardMatchesFiniteDifferences) {
    const int64_t N = 7, K = 3, E = 6, D = 5;
    Layout layout = make_layout(random_topk_ids(N, K, {0, 1, 3, 4, 5}, 10), N, K, E);
    const auto inp = testing::random_floats(N * K * D, 11);
    const auto weights = testing::random_floats(N * K, 12);
    const auto dout = testing::random_floats(N * D, 13);

    std::vector<float> dinp(N * K * D, 3.0f), dweights(N * K, 3.0f);
    cpu::unpermute_backward(dinp.data(), dweights.data(), dout.data(), inp.data(), weights.data(),
                            layout.copy_to_row.data(), N, K, D);

    const auto inp64 = testing::to_double(inp), weights64 = testing::to_double(weights);
    auto loss_of = [&](const std::vector<double>& in, const std::vector<double>& w) {
        const auto out = reference_unpermute(in, w, layout.copy_to_row, N, K, D);
        double l = 0;
        for (int64_t i = 0; i < N * D; ++i) l += dout[i] * out[i];
        return l;
    };
    const auto expected_dinp = testing::finite_difference_gradient(
        [&](const std::vector<double>& in) { return loss_of(in, weights64); }, inp64);
    const auto expected_dweights = testing::finite_difference_gradient(
        [&](const std::vector<double>& w) { return loss_of(inp64, w); }, weights64);
    expect_close("permute", "unpermute dinp", compare(dinp.data(), expected_dinp.data(), N * K * D),
                 1e-5);
    expect_close("permute", "unpermute dweights",
                 compare(dweights.data(), expected_dweights.data(), N * K), 1e-5);

    // A null output is skipped; the other is unchanged.
    std::vector<float> dweights_only(N * K);
    cpu::unpermute_backward(nullptr, dweights_only.data(), dout.data(), inp.data(), weights.data(),
                            layout.copy_to_row.data(), N, K, D);
    EXPECT_EQ(dweights_only, dweights);
}

}  // namespace
}  // namespace moetron
