// The dispatch ops of the Backend (kernels/cpu/dispatch_rows.h, dispatch_layout.h), through
// cpu_backend(): each against a plain reference loop written here, the row movements' adjoints
// against each other, and the weight gradients against float64 finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <set>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/backend.h"
#include "testing.h"

namespace moetron {
namespace {

using testing::compare;
using testing::expect_close;
using testing::random_floats;

// K distinct expert ids per token, uniform over [0, E).
std::vector<int32_t> random_ids(int64_t N, int64_t K, int64_t E, uint64_t seed) {
    ParamRng rng(seed, "ids");
    std::vector<int32_t> ids(static_cast<size_t>(N * K));
    for (int64_t t = 0; t < N; ++t) {
        std::vector<int32_t> pool(static_cast<size_t>(E));
        std::iota(pool.begin(), pool.end(), 0);
        for (int64_t j = 0; j < K; ++j) {
            const auto pick = static_cast<size_t>(rng.uniform(t * K + j) * pool.size());
            ids[t * K + j] = pool[pick];
            pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(pick));
        }
    }
    return ids;
}

std::vector<int32_t> make_records(const std::vector<int32_t>& ids, const std::vector<float>& w,
                                  int64_t N, int64_t K, const std::vector<int32_t>& source) {
    std::vector<int32_t> rec(static_cast<size_t>(N * (2 * K + 1)));
    for (int64_t t = 0; t < N; ++t) {
        int32_t* r = rec.data() + t * (2 * K + 1);
        r[0] = source[t];
        for (int64_t j = 0; j < K; ++j) {
            r[1 + j] = ids[t * K + j];
            r[1 + K + j] = std::bit_cast<int32_t>(w[t * K + j]);
        }
    }
    return rec;
}

// ---- routing metadata ----

TEST(DispatchOps, RouteRecordsCarrySourceIdsAndWeightBits) {
    const std::vector<int32_t> ids = {3, 0, 1, 2};
    const std::vector<float> w = {0.25f, -1.5f, 2.0f, 0.0f};
    std::vector<int32_t> rec(10, -7);
    cpu_backend().dispatch_route_records(rec.data(), ids.data(), w.data(), 2, 2, 4, 5);
    EXPECT_EQ(rec, make_records(ids, w, 2, 2, {5, 5}));
    const std::vector<int32_t> bad = {0, 4};
    EXPECT_THROW(cpu_backend().dispatch_route_records(rec.data(), bad.data(), w.data(), 1, 2, 4, 0),
                 Error);
}

TEST(DispatchOps, LayoutCountsCopiesPerRankAndTheSpread) {
    const int64_t N = 40, K = 4, E = 16, El = 2, L = 2, ranks = E / El;
    const std::vector<int32_t> ids = random_ids(N, K, E, 11);
    std::vector<int64_t> copies(ranks, -1);
    const RoutingSpread got =
        cpu_backend().dispatch_layout(copies.data(), ids.data(), N, K, El, L, ranks);

    std::vector<int64_t> want(ranks, 0);
    RoutingSpread ref;
    ref.num_tokens = N;
    for (int64_t t = 0; t < N; ++t) {
        std::set<int64_t> r, d;
        for (int64_t j = 0; j < K; ++j) {
            ++want[ids[t * K + j] / El];
            r.insert(ids[t * K + j] / El);
            d.insert(ids[t * K + j] / El / L);
        }
        ref.rank_sum += static_cast<int64_t>(r.size());
        ref.rank_max = std::max<int64_t>(ref.rank_max, static_cast<int64_t>(r.size()));
        ref.domain_sum += static_cast<int64_t>(d.size());
        ref.domain_max = std::max<int64_t>(ref.domain_max, static_cast<int64_t>(d.size()));
    }
    EXPECT_EQ(copies, want);
    EXPECT_EQ(got.num_tokens, N);
    EXPECT_EQ(got.rank_sum, ref.rank_sum);
    EXPECT_EQ(got.rank_max, ref.rank_max);
    EXPECT_EQ(got.domain_sum, ref.domain_sum);
    EXPECT_EQ(got.domain_max, ref.domain_max);
}

TEST(DispatchOps, SplitRoundsIsGreedyInTokenOrder) {
    const int64_t N = 60, K = 3, E = 8, El = 2, ranks = 4, budget = 7;
    const std::vector<int32_t> ids = random_ids(N, K, E, 5);
    std::vector<int64_t> ends(N, -1), scratch(ranks);
    const int64_t count = cpu_backend().dispatch_split_rounds(ends.data(), scratch.data(),
                                                              ids.data(), N, K, El, ranks, budget);
    // Reference: extend the round while every rank's copies stay within the budget.
    std::vector<int64_t> want;
    int64_t begin = 0;
    while (begin < N) {
        int64_t end = begin;
        while (end < N) {
            std::vector<int64_t> per_rank(ranks, 0);
            for (int64_t t = begin; t <= end; ++t)
                for (int64_t j = 0; j < K; ++j) ++per_rank[ids[t * K + j] / El];
            if (*std::max_element(per_rank.begin(), per_rank.end()) > budget) break;
            ++end;
        }
        want.push_back(end);
        begin = end;
    }
    ASSERT_GT(want.size(), 2u);  // the case splits
    ASSERT_EQ(count, static_cast<int64_t>(want.size()));
    EXPECT_EQ(std::vector<int64_t>(ends.begin(), ends.begin() + count), want);
    EXPECT_EQ(cpu_backend().dispatch_split_rounds(ends.data(), scratch.data(), ids.data(), 0, K, El,
                                                  ranks, budget),
              1);
    EXPECT_EQ(ends[0], 0);
}

// A hop's layout from random records: peers [0, P) owning experts [first, first + P * per).
struct HopCase {
    int64_t N = 30, K = 4, E = 24, first = 4, per = 4, P = 4;
    std::vector<int32_t> records;
    std::vector<int32_t> slot_begin, row_slots;
    std::vector<int32_t> rows_per_peer, first_slot_of_peer;

    explicit HopCase(uint64_t seed) {
        const std::vector<int32_t> ids = random_ids(N, K, E, seed);
        records =
            make_records(ids, random_floats(ids.size(), seed), N, K, std::vector<int32_t>(N, 0));
        slot_begin.assign(N + 1, -1);
        row_slots.assign(N * K, -1);
        rows_per_peer.assign(P, -1);
        first_slot_of_peer.assign(P, -1);
        cpu_backend().dispatch_hop_layout(slot_begin.data(), row_slots.data(), rows_per_peer.data(),
                                          first_slot_of_peer.data(), records.data(), N, K, first,
                                          P * per, per, P);
    }
    std::set<int32_t> peers_of(int64_t i) const {
        std::set<int32_t> peers;
        for (int64_t j = 0; j < K; ++j) {
            const int32_t e = records[i * (2 * K + 1) + 1 + j];
            if (e >= first && e < first + P * per) peers.insert((e - first) / per);
        }
        return peers;
    }
    int64_t num_slots() const { return slot_begin[N]; }
};

TEST(DispatchOps, HopLayoutGivesEachRowItsPeersInPeerMajorSlots) {
    const HopCase h(3);
    // Reference: slots numbered peer by peer, rows in order within a peer.
    std::vector<std::vector<int32_t>> want_slots(h.N);
    std::vector<int32_t> want_rows(h.P, 0), want_first(h.P, 0);
    int32_t next = 0;
    for (int32_t p = 0; p < h.P; ++p) {
        want_first[p] = next;
        for (int64_t i = 0; i < h.N; ++i)
            if (h.peers_of(i).count(p)) {
                want_slots[i].push_back(next++);
                ++want_rows[p];
            }
    }
    EXPECT_EQ(h.rows_per_peer, want_rows);
    EXPECT_EQ(h.first_slot_of_peer, want_first);
    EXPECT_EQ(h.slot_begin[0], 0);
    for (int64_t i = 0; i < h.N; ++i) {
        const std::vector<int32_t> got(h.row_slots.begin() + h.slot_begin[i],
                                       h.row_slots.begin() + h.slot_begin[i + 1]);
        EXPECT_EQ(got, want_slots[i]) << "row " << i;
    }
    EXPECT_EQ(h.num_slots(), next);
}

TEST(DispatchOps, FanOutPlacesOwnSlotsInTheReceiveBuffer) {
    const HopCase h(4);
    const int64_t D = 5, S = h.num_slots();
    // Peer 2 is this rank: its slots land in recv from row 3 on.
    const SlotPlacement own{h.first_slot_of_peer[2], h.rows_per_peer[2], 3};
    const std::vector<float> input = random_floats(h.N * D, 9);
    std::vector<float> send(S * D, -1.0f), recv((3 + own.own_num_slots) * D, -1.0f);
    cpu_backend().dispatch_fan_out(send.data(), recv.data(), input.data(), h.slot_begin.data(),
                                   h.row_slots.data(), h.N, D * sizeof(float), own);
    std::vector<float> want_send(S * D, -1.0f), want_recv(recv.size(), -1.0f);
    for (int64_t i = 0; i < h.N; ++i)
        for (int32_t s = h.slot_begin[i]; s < h.slot_begin[i + 1]; ++s) {
            const int64_t slot = h.row_slots[s];
            const bool mine =
                slot >= own.own_first_slot && slot < own.own_first_slot + own.own_num_slots;
            float* dst =
                mine ? &want_recv[(3 + slot - own.own_first_slot) * D] : &want_send[slot * D];
            for (int64_t d = 0; d < D; ++d) dst[d] = input[i * D + d];
        }
    ASSERT_GT(own.own_num_slots, 0);
    EXPECT_EQ(send, want_send);
    EXPECT_EQ(recv, want_recv);

    // Route records (int32 rows) move through the same op.
    const int64_t W = 2 * h.K + 1;
    std::vector<int32_t> rsend(S * W, 0), rrecv((3 + own.own_num_slots) * W, 0);
    cpu_backend().dispatch_fan_out(rsend.data(), rrecv.data(), h.records.data(),
                                   h.slot_begin.data(), h.row_slots.data(), h.N,
                                   W * sizeof(int32_t), own);
    const int64_t i = 0, slot = h.row_slots[h.slot_begin[0]];
    const bool mine = slot >= own.own_first_slot && slot < own.own_first_slot + own.own_num_slots;
    const int32_t* row = mine ? &rrecv[(3 + slot - own.own_first_slot) * W] : &rsend[slot * W];
    EXPECT_TRUE(std::equal(row, row + W, h.records.begin() + i * W));
}

TEST(DispatchOps, FanInIsFanOutsAdjointAndAccumulateAddsTheWrittenSum) {
    const HopCase h(6);
    const int64_t D = 70, S = h.num_slots();  // D > 64: two blocks of the sum
    const SlotPlacement own{h.first_slot_of_peer[1], h.rows_per_peer[1], 0};
    const std::vector<float> x = random_floats(h.N * D, 1);
    std::vector<float> send(S * D, 0.0f), recv(own.own_num_slots * D, 0.0f);
    cpu_backend().dispatch_fan_out(send.data(), recv.data(), x.data(), h.slot_begin.data(),
                                   h.row_slots.data(), h.N, D * sizeof(float), own);
    const std::vector<float> ys = random_floats(send.size(), 2), yr = random_floats(recv.size(), 3);
    std::vector<float> back(h.N * D, 123.0f);
    cpu_backend().dispatch_fan_in(back.data(), ys.data(), yr.data(), h.slot_begin.data(),
                                  h.row_slots.data(), h.N, D, own, /*accumulate=*/false);
    // <fan_out(x), y> == <x, fan_in(y)>
    double lhs = 0, rhs = 0;
    for (size_t k = 0; k < send.size(); ++k) lhs += double(send[k]) * ys[k];
    for (size_t k = 0; k < recv.size(); ++k) lhs += double(recv[k]) * yr[k];
    for (size_t k = 0; k < x.size(); ++k) rhs += double(x[k]) * back[k];
    EXPECT_NEAR(lhs, rhs, 1e-3 * std::max(1.0, std::fabs(lhs)));

    std::vector<float> added = random_floats(h.N * D, 4);
    std::vector<float> want = added;
    for (size_t k = 0; k < want.size(); ++k) want[k] += back[k];
    cpu_backend().dispatch_fan_in(added.data(), ys.data(), yr.data(), h.slot_begin.data(),
                                  h.row_slots.data(), h.N, D, own, /*accumulate=*/true);
    EXPECT_EQ(added, want);
}

// An expert side from random staging records of 3 sources, this rank owning experts [4, 8).
struct ExpertCase {
    int64_t S = 25, K = 3, E = 12, first = 4, El = 4, sources = 3;
    std::vector<int32_t> ids, records;
    std::vector<float> weights;
    std::vector<int64_t> offsets, scratch;
    std::vector<int32_t> copy_begin, copy_row, copy_choice;
    std::vector<float> copy_weight;
    int64_t rows = 0;

    explicit ExpertCase(uint64_t seed, int64_t capacity = 1000) {
        ids = random_ids(S, K, E, seed);
        weights = random_floats(ids.size(), seed + 1);
        std::vector<int32_t> source(S);
        for (int64_t s = 0; s < S; ++s) source[s] = static_cast<int32_t>((s * 7) % sources);
        records = make_records(ids, weights, S, K, source);
        offsets.assign(El + 1, -1);
        scratch.assign(sources * El, -1);
        copy_begin.assign(S + 1, -1);
        copy_row.assign(S * K, -1);
        copy_choice.assign(S * K, -1);
        copy_weight.assign(S * K, -1.0f);
        rows = cpu_backend().dispatch_expert_layout(
            offsets.data(), copy_begin.data(), copy_row.data(), copy_choice.data(),
            copy_weight.data(), scratch.data(), records.data(), S, K, first, El, sources, capacity);
    }
};

TEST(DispatchOps, ExpertLayoutSortsByExpertThenSourceThenStagingOrder) {
    const ExpertCase x(8);
    struct Copy {
        int64_t expert, source, staging, choice;
    };
    std::vector<Copy> copies;
    for (int64_t s = 0; s < x.S; ++s)
        for (int64_t j = 0; j < x.K; ++j) {
            const int64_t le = x.ids[s * x.K + j] - x.first;
            if (le >= 0 && le < x.El) copies.push_back({le, x.records[s * (2 * x.K + 1)], s, j});
        }
    std::vector<Copy> sorted = copies;
    std::stable_sort(sorted.begin(), sorted.end(), [](const Copy& a, const Copy& b) {
        return a.expert != b.expert ? a.expert < b.expert : a.source < b.source;
    });
    ASSERT_EQ(x.rows, static_cast<int64_t>(copies.size()));
    std::vector<int64_t> want_offsets(x.El + 1, 0);
    for (const Copy& c : copies) ++want_offsets[c.expert + 1];
    std::partial_sum(want_offsets.begin(), want_offsets.end(), want_offsets.begin());
    EXPECT_EQ(x.offsets, want_offsets);
    // Copies in staging order: row of copy c is its place in the sorted order.
    for (size_t c = 0; c < copies.size(); ++c) {
        const auto row = static_cast<size_t>(x.copy_row[c]);
        ASSERT_LT(row, sorted.size());
        EXPECT_EQ(sorted[row].staging, copies[c].staging);
        EXPECT_EQ(sorted[row].choice, copies[c].choice);
        EXPECT_EQ(x.copy_choice[c], copies[c].choice);
        EXPECT_EQ(x.copy_weight[c], x.weights[copies[c].staging * x.K + copies[c].choice]);
    }
    for (int64_t s = 0; s <= x.S; ++s) {
        int64_t before = 0;
        for (const Copy& c : copies) before += c.staging < s;
        EXPECT_EQ(x.copy_begin[s], before);
    }

    const ExpertCase full(8, /*capacity=*/x.rows - 1);
    EXPECT_EQ(full.rows, x.rows);       // the count, for the caller to report
    EXPECT_EQ(full.copy_begin[0], -1);  // and nothing else written
}

TEST(DispatchOps, ExpandAndReduceMatchPlainLoopsAndAreAdjoint) {
    const ExpertCase x(9);
    const int64_t D = 6;
    const std::vector<float> staging = random_floats(x.S * D, 10);
    for (const float* w : {static_cast<const float*>(nullptr), x.copy_weight.data()}) {
        std::vector<float> rows(x.rows * D, -1.0f), want(x.rows * D, -1.0f);
        cpu_backend().dispatch_expand(rows.data(), staging.data(), x.copy_begin.data(),
                                      x.copy_row.data(), w, x.S, D);
        for (int64_t s = 0; s < x.S; ++s)
            for (int32_t c = x.copy_begin[s]; c < x.copy_begin[s + 1]; ++c)
                for (int64_t d = 0; d < D; ++d)
                    want[x.copy_row[c] * D + d] = (w ? w[c] : 1.0f) * staging[s * D + d];
        EXPECT_EQ(rows, want);

        const std::vector<float> y = random_floats(x.rows * D, 11);
        std::vector<float> back(x.S * D, 5.0f);
        cpu_backend().dispatch_reduce(back.data(), y.data(), x.copy_begin.data(), x.copy_row.data(),
                                      w, x.S, D);
        std::vector<double> want_back(x.S * D, 0.0);
        for (int64_t s = 0; s < x.S; ++s)
            for (int32_t c = x.copy_begin[s]; c < x.copy_begin[s + 1]; ++c)
                for (int64_t d = 0; d < D; ++d)
                    want_back[s * D + d] += double(w ? w[c] : 1.0f) * y[x.copy_row[c] * D + d];
        expect_close("dispatch_reduce", w ? "weighted" : "unweighted",
                     compare(back.data(), want_back.data(), back.size()), 1e-5);
    }
}

TEST(DispatchOps, WeightGradsMatchFiniteDifferencesOfTheWeightedReduce) {
    ExpertCase x(12);
    const int64_t D = 5;
    const std::vector<float> dout = random_floats(x.S * D, 13);
    const std::vector<float> expert_out = random_floats(x.rows * D, 14);
    std::vector<float> dweights(x.S * x.K, -9.0f);
    cpu_backend().dispatch_weight_grads(dweights.data(), dout.data(), expert_out.data(),
                                        x.copy_begin.data(), x.copy_row.data(),
                                        x.copy_choice.data(), x.S, x.K, D);
    // loss(w) = sum_s <dout[s], sum_c w[c] * expert_out[row c]>, as a function of the copies'
    // weights; the gradient of copy c sits at (its staging row, its choice).
    auto loss = [&](const std::vector<double>& w) {
        double l = 0;
        for (int64_t s = 0; s < x.S; ++s)
            for (int32_t c = x.copy_begin[s]; c < x.copy_begin[s + 1]; ++c)
                for (int64_t d = 0; d < D; ++d)
                    l += double(dout[s * D + d]) * w[c] * expert_out[x.copy_row[c] * D + d];
        return l;
    };
    const std::vector<double> fd = testing::finite_difference_gradient(
        loss, std::vector<double>(x.copy_weight.begin(), x.copy_weight.begin() + x.rows));
    std::vector<double> want(x.S * x.K, 0.0);  // choices without a copy here: 0
    for (int64_t s = 0; s < x.S; ++s)
        for (int32_t c = x.copy_begin[s]; c < x.copy_begin[s + 1]; ++c)
            want[s * x.K + x.copy_choice[c]] = fd[c];
    expect_close("dispatch_weight_grads", "dweights",
                 compare(dweights.data(), want.data(), want.size()), 1e-4);
}

TEST(DispatchOps, UnpermuteAddEqualsWritingThenAdding) {
    const int64_t N = 9, K = 2, D = 67, E = 4;
    const std::vector<int32_t> ids = random_ids(N, K, E, 15);
    std::vector<int32_t> copy_to_row(N * K);
    std::vector<int64_t> offsets(E + 1);
    cpu_backend().moe_permute_layout(copy_to_row.data(), offsets.data(), ids.data(), N, K, E);
    const std::vector<float> rows = random_floats(N * K * D, 16);
    const std::vector<float> w = random_floats(N * K, 17);
    const std::vector<float> base = random_floats(N * D, 18);

    std::vector<float> written(N * D), out = base;
    cpu_backend().unpermute_forward(written.data(), rows.data(), w.data(), copy_to_row.data(), N, K,
                                    D);
    cpu_backend().unpermute_add(out.data(), rows.data(), w.data(), copy_to_row.data(), N, K, D);
    for (size_t k = 0; k < out.size(); ++k) EXPECT_EQ(out[k], base[k] + written[k]) << k;

    // Null weights: permute's backward, added.
    cpu_backend().permute_backward(written.data(), rows.data(), copy_to_row.data(), N, K, D);
    out = base;
    cpu_backend().unpermute_add(out.data(), rows.data(), nullptr, copy_to_row.data(), N, K, D);
    for (size_t k = 0; k < out.size(); ++k) EXPECT_EQ(out[k], base[k] + written[k]) << k;
}

}  // namespace
}  // namespace moetron
