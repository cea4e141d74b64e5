// The model ops of kernels/backend.h (MLA's key/value assembly, strided row copies and sequence
// shifts, the sequence-wise balance loss, expert loads and the router bias update, the
// vocabulary-parallel cross-entropy's combine steps, parameter initialization), through
// cpu_backend(), against plain reference loops; the backwards against float64 finite
// differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/kernels/backend.h"
#include "testing.h"

namespace moetron {
namespace {

using testing::compare;
using testing::expect_close;
using testing::finite_difference_gradient;
using testing::random_floats;
using testing::to_double;

// ---- MLA key/value assembly ----

struct MlaKvDims {
    int64_t tokens = 3, heads = 2, nope = 4, rope = 3, v = 5;
    int64_t qk() const { return nope + rope; }
    int64_t kv() const { return nope + v; }
};

// k = [kv_nope | k_rope] per head, v = kv's second part, in double.
void mla_kv_reference(std::vector<double>& k, std::vector<double>& v, const std::vector<double>& kv,
                      const std::vector<double>& k_rope, const MlaKvDims& d) {
    k.assign(d.tokens * d.heads * d.qk(), 0.0);
    v.assign(d.tokens * d.heads * d.v, 0.0);
    for (int64_t t = 0; t < d.tokens; ++t) {
        for (int64_t h = 0; h < d.heads; ++h) {
            const int64_t th = t * d.heads + h;
            for (int64_t i = 0; i < d.nope; ++i) k[th * d.qk() + i] = kv[th * d.kv() + i];
            for (int64_t i = 0; i < d.rope; ++i)
                k[th * d.qk() + d.nope + i] = k_rope[t * d.rope + i];
            for (int64_t i = 0; i < d.v; ++i) v[th * d.v + i] = kv[th * d.kv() + d.nope + i];
        }
    }
}

TEST(MlaKv, ForwardGivesEveryHeadItsKeyAndValue) {
    const MlaKvDims d;
    const auto kv = random_floats(d.tokens * d.heads * d.kv(), 1);
    const auto k_rope = random_floats(d.tokens * d.rope, 2);
    std::vector<float> k(d.tokens * d.heads * d.qk(), 99.0f), v(d.tokens * d.heads * d.v, 99.0f);
    cpu_backend().mla_kv_forward(k.data(), v.data(), kv.data(), k_rope.data(), d.tokens, d.heads,
                                 d.nope, d.rope, d.v);
    std::vector<double> k_ref, v_ref;
    mla_kv_reference(k_ref, v_ref, to_double(kv), to_double(k_rope), d);
    EXPECT_EQ(to_double(k), k_ref);  // a copy: exact
    EXPECT_EQ(to_double(v), v_ref);
}

TEST(MlaKv, BackwardMatchesFiniteDifferences) {
    const MlaKvDims d;
    const auto kv = to_double(random_floats(d.tokens * d.heads * d.kv(), 3));
    const auto k_rope = to_double(random_floats(d.tokens * d.rope, 4));
    const auto dk = random_floats(d.tokens * d.heads * d.qk(), 5);  // R_k in L = k.R_k + v.R_v
    const auto dv = random_floats(d.tokens * d.heads * d.v, 6);
    std::vector<float> d_kv(kv.size(), 1234.5f), d_k_rope(k_rope.size(), 1234.5f);  // written
    cpu_backend().mla_kv_backward(d_kv.data(), d_k_rope.data(), dk.data(), dv.data(), d.tokens,
                                  d.heads, d.nope, d.rope, d.v);

    auto loss = [&](const std::vector<double>& kv_x, const std::vector<double>& k_rope_x) {
        std::vector<double> k, v;
        mla_kv_reference(k, v, kv_x, k_rope_x, d);
        double sum = 0;
        for (size_t i = 0; i < k.size(); ++i) sum += k[i] * dk[i];
        for (size_t i = 0; i < v.size(); ++i) sum += v[i] * dv[i];
        return sum;
    };
    const auto d_kv_fd = finite_difference_gradient(
        [&](const std::vector<double>& x) { return loss(x, k_rope); }, kv);
    const auto d_k_rope_fd = finite_difference_gradient(
        [&](const std::vector<double>& x) { return loss(kv, x); }, k_rope);
    expect_close("mla_kv", "d_kv", compare(d_kv.data(), d_kv_fd.data(), d_kv.size()), 1e-6);
    expect_close("mla_kv", "d_k_rope",
                 compare(d_k_rope.data(), d_k_rope_fd.data(), d_k_rope.size()), 1e-6);
}

// ---- row moves ----

TEST(RowCopy, StridedCopyMovesOneBlockOfColumns) {
    const int64_t rows = 4, width = 3;
    const auto narrow = random_floats(rows * width, 7);
    std::vector<float> wide(rows * 2 * width, -1.0f);
    // Into the second half of each wide row, then back out of it.
    cpu_backend().copy_rows_strided(wide.data() + width, narrow.data(), rows, width, 2 * width,
                                    width);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < width; ++i) {
            EXPECT_EQ(wide[r * 2 * width + i], -1.0f) << "first half untouched, row " << r;
            EXPECT_EQ(wide[r * 2 * width + width + i], narrow[r * width + i]) << r << " " << i;
        }
    }
    std::vector<float> back(rows * width, 0.0f);
    cpu_backend().copy_rows_strided(back.data(), wide.data() + width, rows, width, width,
                                    2 * width);
    EXPECT_EQ(back, narrow);
}

TEST(RowCopy, ShiftSequencesFillsPastTheEnd) {
    const std::vector<int32_t> inp = {10, 11, 12, 13, 14, 20, 21, 22, 23, 24};  // B = 2, S = 5
    std::vector<int32_t> out(inp.size(), 7);
    cpu_backend().shift_sequences(out.data(), inp.data(), 2, 5, 2, -1);
    EXPECT_EQ(out, (std::vector<int32_t>{12, 13, 14, -1, -1, 22, 23, 24, -1, -1}));
    cpu_backend().shift_sequences(out.data(), inp.data(), 2, 5, 0, -1);
    EXPECT_EQ(out, inp);
}

// ---- sequence-wise balance loss ----

struct BalanceCase {
    int64_t batch = 2, seq_len = 5, experts = 6, top_k = 2;
    int64_t tokens() const { return batch * seq_len; }
    std::vector<int32_t> topk_ids;  // distinct experts per token
    std::vector<float> scores;      // in (0, 1), as sigmoid scores are
    BalanceCase() {
        for (int64_t t = 0; t < tokens(); ++t) {
            topk_ids.push_back(static_cast<int32_t>(t % experts));
            topk_ids.push_back(static_cast<int32_t>((t % experts + 1 + t % 3) % experts));
        }
        const auto raw = random_floats(tokens() * experts, 8);
        for (float x : raw) scores.push_back(1.0f / (1.0f + std::exp(-x)));
    }
};

// f (B, E) and sum_b sum_i f_i P_i, in double, straight from eq. 17-20.
double balance_reference(std::vector<double>& f, const std::vector<double>& s,
                         const BalanceCase& c) {
    const int64_t E = c.experts, T = c.seq_len, K = c.top_k;
    f.assign(c.batch * E, 0.0);
    double total = 0;
    for (int64_t b = 0; b < c.batch; ++b) {
        std::vector<double> p(E, 0.0);
        for (int64_t t = b * T; t < (b + 1) * T; ++t) {
            for (int64_t j = 0; j < K; ++j) f[b * E + c.topk_ids[t * K + j]] += 1.0;
            double z = 0;
            for (int64_t i = 0; i < E; ++i) z += s[t * E + i];
            for (int64_t i = 0; i < E; ++i) p[i] += s[t * E + i] / z / static_cast<double>(T);
        }
        for (int64_t i = 0; i < E; ++i) {
            f[b * E + i] *= static_cast<double>(E) / static_cast<double>(K * T);
            total += f[b * E + i] * p[i];
        }
    }
    return total;
}

TEST(BalanceLoss, ForwardMatchesFloat64Reference) {
    const BalanceCase c;
    std::vector<float> f(c.batch * c.experts, 1234.5f);  // written
    const double got = cpu_backend().balance_loss_forward(
        f.data(), c.topk_ids.data(), c.scores.data(), c.batch, c.seq_len, c.experts, c.top_k);
    std::vector<double> f_ref;
    const double want = balance_reference(f_ref, to_double(c.scores), c);
    EXPECT_NEAR(got, want, 1e-6 * want);
    expect_close("balance_loss", "load_fraction", compare(f.data(), f_ref.data(), f.size()), 1e-6);
    // Each expert chosen once per sequence (3 tokens x K = 2 over E = 6) and equal scores: f_i = 1
    // and P_i = 1/E, so L_b = 1 for each of the 2 sequences.
    const std::vector<int32_t> balanced = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5};
    const std::vector<float> equal(2 * 3 * 6, 0.5f);
    std::vector<float> f_balanced(2 * 6);
    EXPECT_NEAR(cpu_backend().balance_loss_forward(f_balanced.data(), balanced.data(), equal.data(),
                                                   2, 3, 6, 2),
                2.0, 1e-12);
    EXPECT_EQ(f_balanced, std::vector<float>(2 * 6, 1.0f));
}

TEST(BalanceLoss, BackwardMatchesFiniteDifferences) {
    const BalanceCase c;
    const float loss_grad = 0.75f;
    std::vector<float> f(c.batch * c.experts);
    cpu_backend().balance_loss_forward(f.data(), c.topk_ids.data(), c.scores.data(), c.batch,
                                       c.seq_len, c.experts, c.top_k);
    std::vector<float> d_scores(c.scores.size(), 1234.5f);  // written
    cpu_backend().balance_loss_backward(d_scores.data(), c.scores.data(), f.data(), c.batch,
                                        c.seq_len, c.experts, loss_grad);
    // d/ds of loss_grad * (1/B) sum_b L_b; the selection (and so f) does not move with s.
    const auto d_fd = finite_difference_gradient(
        [&](const std::vector<double>& s) {
            std::vector<double> unused;
            return loss_grad * balance_reference(unused, s, c) / static_cast<double>(c.batch);
        },
        to_double(c.scores), 1e-6);
    expect_close("balance_loss", "d_scores",
                 compare(d_scores.data(), d_fd.data(), d_scores.size(), 1e-3), 1e-5);
}

// ---- expert loads ----

TEST(ExpertLoad, CountsAddEveryId) {
    const std::vector<int32_t> ids = {0, 3, 3, 1, 3, 0};
    std::vector<int64_t> counts = {5, 0, 0, 0};  // counts accumulate
    cpu_backend().count_expert_load(counts.data(), ids.data(), static_cast<int64_t>(ids.size()), 4);
    EXPECT_EQ(counts, (std::vector<int64_t>{7, 1, 0, 3}));
}

TEST(ExpertLoad, BiasMovesTowardsTheMeanLoad) {
    const std::vector<int64_t> counts = {3, 1, 2, 2};  // mean 2
    std::vector<float> bias = {0.5f, 0.5f, 0.5f, -0.25f};
    cpu_backend().router_bias_update(bias.data(), counts.data(), 4, 0.125f);
    EXPECT_EQ(bias, (std::vector<float>{0.375f, 0.625f, 0.5f, -0.25f}));
}

// ---- vocabulary-parallel cross-entropy, combine steps ----

TEST(CrossEntropyCombine, PartsGiveTheWholeRowsLosses) {
    const int64_t N = 5, V = 12, parts = 3, Vp = V / parts;
    const int32_t ignore = -1;
    const auto logits = random_floats(N * V, 9, 3.0f);
    const std::vector<int32_t> targets = {0, 5, -1, 11, 7};
    Backend& ops = cpu_backend();
    std::vector<float> want_losses(N), want_lse(N);
    const CrossEntropyResult want = ops.cross_entropy_forward(
        want_losses.data(), want_lse.data(), logits.data(), targets.data(), N, V, ignore);

    // Each part's columns, as a vocabulary-parallel head holds them.
    std::vector<std::vector<float>> part_logits(parts, std::vector<float>(N * Vp));
    for (int64_t p = 0; p < parts; ++p)
        for (int64_t t = 0; t < N; ++t)
            for (int64_t v = 0; v < Vp; ++v)
                part_logits[p][t * Vp + v] = logits[t * V + p * Vp + v];
    std::vector<float> part_max(parts * N), row_max(N, 1234.5f);
    for (int64_t p = 0; p < parts; ++p)
        ops.cross_entropy_part_max(part_max.data() + p * N, part_logits[p].data(), N, Vp);
    ops.cross_entropy_combine_max(row_max.data(), part_max.data(), parts, N);
    for (int64_t t = 0; t < N; ++t) {
        float m = logits[t * V];
        for (int64_t v = 1; v < V; ++v) m = std::max(m, logits[t * V + v]);
        EXPECT_EQ(row_max[t], m) << t;
    }
    std::vector<double> sum_exp(N, 0.0), target_logit(N, 0.0);
    for (int64_t p = 0; p < parts; ++p) {
        std::vector<double> s(N), y(N);
        ops.cross_entropy_part_sums(s.data(), y.data(), part_logits[p].data(), row_max.data(),
                                    targets.data(), N, Vp, p * Vp, ignore);
        for (int64_t t = 0; t < N; ++t) {
            sum_exp[t] += s[t];
            target_logit[t] += y[t];
        }
    }
    std::vector<float> losses(N, 1234.5f), lse(N, 1234.5f);
    const CrossEntropyResult got = ops.cross_entropy_combine_losses(
        losses.data(), lse.data(), sum_exp.data(), target_logit.data(), row_max.data(),
        targets.data(), N, ignore);
    EXPECT_EQ(got.num_valid, want.num_valid);
    EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-5 * want.loss_sum);
    EXPECT_EQ(losses[2], 0.0f);  // ignored target
    expect_close("cross_entropy_combine", "lse", compare(lse.data(), want_lse.data(), N), 1e-6);
    expect_close("cross_entropy_combine", "losses", compare(losses.data(), want_losses.data(), N),
                 1e-5);
}

// ---- parameter initialization ----

TEST(ParamInit, InitNormalDrawsTheGlobalIndicesOfItsRuns) {
    const uint64_t seed = 11;
    const ParamRng rng(seed, "layers.0.mlp.down");
    const uint64_t name_hash = fnv1a_64("layers.0.mlp.down");
    const float stddev = 0.02f;
    // Columns [4, 7) of a (6, 10) tensor: six runs of 3, a global row (10) apart.
    std::vector<float> shard(6 * 3, 1234.5f);
    cpu_backend().init_normal(shard.data(), seed, name_hash, 6, 3, 4, 10, stddev);
    for (int64_t r = 0; r < 6; ++r)
        for (int64_t j = 0; j < 3; ++j)
            EXPECT_EQ(shard[r * 3 + j], stddev * rng.normal(static_cast<uint64_t>(4 + r * 10 + j)))
                << r << " " << j;
    // Runs longer than one thread's chunk (2^16), and chunks that cross runs.
    const int64_t runs = 3, length = 70001, first = 5, stride = 100000;
    std::vector<float> big(runs * length);
    cpu_backend().init_normal(big.data(), seed, name_hash, runs, length, first, stride, stddev);
    int64_t mismatches = 0;
    for (int64_t r = 0; r < runs; ++r)
        for (int64_t j = 0; j < length; ++j)
            mismatches += big[r * length + j] !=
                          stddev * rng.normal(static_cast<uint64_t>(first + r * stride + j));
    EXPECT_EQ(mismatches, 0);
}

TEST(ParamInit, FillSetsEveryElement) {
    std::vector<float> x(100001, 3.0f);
    cpu_backend().fill(x.data(), static_cast<int64_t>(x.size()) - 1, 1.0f);
    EXPECT_EQ(std::count(x.begin(), x.end() - 1, 1.0f), static_cast<int64_t>(x.size()) - 1);
    EXPECT_EQ(x.back(), 3.0f);
}

}  // namespace
}  // namespace moetron
