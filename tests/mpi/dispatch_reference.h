// A single-process reference for the flat dispatch, and the distributed round trip it checks.
// Every rank can rebuild every rank's inputs (they are pure functions of the case and the rank),
// so each rank computes the reference for its own tokens and its own experts locally.
//
// The experts are "identity experts" scaled by (e + 1): expert e maps a row x to (e + 1) x. Then
//   out[t]   = sum_j w[t,j] (e_j + 1) x[t]
//   dx[t]    = sum_j w[t,j] (e_j + 1) g[t]            for the loss sum_t dot(g[t], out[t])
//   dw[t,j]  = (e_j + 1) dot(g[t], x[t])
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/parallel/dispatch_flat.h"
#include "testing.h"

namespace moetron::testing {

enum class Routing {
    random,         // K distinct experts per token, uniformly
    first_experts,  // every token to experts 0..K-1 (K = 1: everything to expert 0)
    last_experts,   // every token to experts E-K..E-1 (the last rank's)
    skip_rank_1,    // random, but never an expert of rank 1 (rank 1 receives nothing)
    self_only,      // random among the rank's own experts (no traffic between ranks)
};

struct DispatchCase {
    std::string name;
    int64_t num_experts = 8;
    int64_t top_k = 2;
    int64_t hidden = 16;
    std::vector<int64_t> tokens_per_rank = {7};  // rank r has tokens_per_rank[r % size] tokens
    Routing routing = Routing::random;
    uint64_t seed = 1;

    int64_t tokens_of(int rank) const {
        return tokens_per_rank[static_cast<size_t>(rank) % tokens_per_rank.size()];
    }
    int64_t max_tokens() const {
        return *std::max_element(tokens_per_rank.begin(), tokens_per_rank.end());
    }
};

struct RankInputs {
    int64_t num_tokens = 0;
    std::vector<float> x;        // (N, D)
    std::vector<int32_t> ids;    // (N, K)
    std::vector<float> weights;  // (N, K)
    std::vector<float> dout;     // (N, D)
};

// K distinct experts out of candidates, in a random order.
inline void pick_distinct(int32_t* out, std::vector<int32_t> candidates, int64_t k,
                          RngStream& rng) {
    for (int64_t j = 0; j < k; ++j) {
        const auto pick =
            static_cast<size_t>(j) + rng.next_below(candidates.size() - static_cast<size_t>(j));
        std::swap(candidates[static_cast<size_t>(j)], candidates[pick]);
        out[j] = candidates[static_cast<size_t>(j)];
    }
}

inline RankInputs make_inputs(const DispatchCase& c, int rank, int world) {
    RankInputs in;
    const int64_t N = c.tokens_of(rank), K = c.top_k, D = c.hidden, E = c.num_experts;
    const int64_t El = E / world;
    in.num_tokens = N;
    const uint64_t seed = c.seed * 1000 + static_cast<uint64_t>(rank);
    in.x = random_floats(static_cast<size_t>(N * D), seed);
    in.dout = random_floats(static_cast<size_t>(N * D), seed + 500);
    in.weights.resize(static_cast<size_t>(N * K));
    in.ids.resize(static_cast<size_t>(N * K));
    RngStream rng(seed, 7);
    for (auto& w : in.weights) w = 0.1f + static_cast<float>(rng.next_unit_double());

    std::vector<int32_t> candidates;
    for (int32_t e = 0; e < E; ++e) {
        const int owner = static_cast<int>(e / El);
        if (c.routing == Routing::skip_rank_1 && world > 1 && owner == 1) continue;
        if (c.routing == Routing::self_only && owner != rank) continue;
        candidates.push_back(e);
    }
    for (int64_t t = 0; t < N; ++t) {
        int32_t* ids = in.ids.data() + t * K;
        for (int64_t j = 0; j < K; ++j) {
            if (c.routing == Routing::first_experts) ids[j] = static_cast<int32_t>(j);
            if (c.routing == Routing::last_experts) ids[j] = static_cast<int32_t>(E - K + j);
        }
        if (c.routing != Routing::first_experts && c.routing != Routing::last_experts)
            pick_distinct(ids, candidates, K, rng);
    }
    return in;
}

struct DispatchResult {
    std::vector<int64_t> expert_offsets;  // (El + 1)
    std::vector<float> expert_inp;        // (R, D)
    std::vector<float> out, dx, dweights;
    int64_t peer_rows_sent = 0;  // copies this rank sends to experts of other ranks
};

inline DispatchResult reference_result(const DispatchCase& c, int rank, int world) {
    const int64_t K = c.top_k, D = c.hidden, E = c.num_experts, El = E / world;
    DispatchResult r;
    const RankInputs mine = make_inputs(c, rank, world);
    const int64_t N = mine.num_tokens;
    r.out.assign(static_cast<size_t>(N * D), 0.0f);
    r.dx.assign(static_cast<size_t>(N * D), 0.0f);
    r.dweights.assign(static_cast<size_t>(N * K), 0.0f);
    for (int64_t t = 0; t < N; ++t) {
        double gx = 0;
        for (int64_t i = 0; i < D; ++i)
            gx += static_cast<double>(mine.dout[t * D + i]) * mine.x[t * D + i];
        for (int64_t j = 0; j < K; ++j) {
            const int32_t e = mine.ids[t * K + j];
            const float w = mine.weights[t * K + j], scale = static_cast<float>(e + 1);
            for (int64_t i = 0; i < D; ++i) {
                r.out[t * D + i] += w * (scale * mine.x[t * D + i]);
                r.dx[t * D + i] += w * (scale * mine.dout[t * D + i]);
            }
            r.dweights[t * K + j] = static_cast<float>(scale * gx);
            if (e / El != rank) ++r.peer_rows_sent;
        }
    }
    // This rank's experts receive, per expert, the copies of rank 0's tokens, then rank 1's, ...
    std::vector<RankInputs> all;
    for (int p = 0; p < world; ++p) all.push_back(make_inputs(c, p, world));
    r.expert_offsets.push_back(0);
    for (int64_t le = 0; le < El; ++le) {
        const int32_t e = static_cast<int32_t>(rank * El + le);
        for (const RankInputs& src : all) {
            for (int64_t copy = 0; copy < src.num_tokens * K; ++copy) {
                if (src.ids[copy] != e) continue;
                const float* row = src.x.data() + (copy / K) * D;
                r.expert_inp.insert(r.expert_inp.end(), row, row + D);
            }
        }
        r.expert_offsets.push_back(static_cast<int64_t>(r.expert_inp.size()) / D);
    }
    return r;
}

// Identity experts scaled by (e + 1), over the expert-sorted rows of this rank.
inline void scale_by_expert(float* out, const float* inp, std::span<const int64_t> expert_offsets,
                            int64_t first_expert, int64_t hidden) {
    for (size_t le = 0; le + 1 < expert_offsets.size(); ++le) {
        const float scale = static_cast<float>(first_expert + static_cast<int64_t>(le) + 1);
        for (int64_t i = expert_offsets[le] * hidden; i < expert_offsets[le + 1] * hidden; ++i)
            out[i] = scale * inp[i];
    }
}

// The distributed round trip: layout, dispatch, experts, combine, and the backward of all three.
// layout and buffer may be reused across calls (they must fit the case).
inline DispatchResult run_dispatch(const DispatchCase& c, parallel::Communicator& ep,
                                   parallel::DispatchLayout& layout,
                                   parallel::DispatchBuffer& buffer) {
    const int rank = ep.rank(), world = ep.size();
    const int64_t K = c.top_k, D = c.hidden, El = c.num_experts / world;
    const RankInputs in = make_inputs(c, rank, world);
    const int64_t N = in.num_tokens;
    const int64_t capacity = buffer.config().capacity_rows(world);

    parallel::dispatch_layout(layout, in.ids.data(), N, ep);
    const int64_t R = layout.num_recv_rows();
    std::vector<float> expert_inp(static_cast<size_t>(capacity * D));
    std::vector<float> expert_out(expert_inp.size()), dexpert_out(expert_inp.size());
    std::vector<float> dexpert_inp(expert_inp.size());
    std::vector<float> returned(static_cast<size_t>(N * K * D));

    DispatchResult r;
    r.out.resize(static_cast<size_t>(N * D));
    r.dx.resize(static_cast<size_t>(N * D));
    r.dweights.resize(static_cast<size_t>(N * K));

    const uint64_t a2a_before = ep.counters(parallel::CollectiveKind::all_to_all).peer_bytes;
    parallel::dispatch_forward(expert_inp.data(), in.x.data(), layout, buffer, ep);
    r.peer_rows_sent = static_cast<int64_t>(
        (ep.counters(parallel::CollectiveKind::all_to_all).peer_bytes - a2a_before) /
        (static_cast<uint64_t>(D) * sizeof(float)));

    scale_by_expert(expert_out.data(), expert_inp.data(), layout.expert_offsets(), rank * El, D);
    parallel::combine_forward(r.out.data(), returned.data(), expert_out.data(), in.weights.data(),
                              layout, buffer, ep);
    parallel::combine_backward(dexpert_out.data(), r.dweights.data(), in.dout.data(),
                               in.weights.data(), returned.data(), layout, buffer, ep);
    scale_by_expert(dexpert_inp.data(), dexpert_out.data(), layout.expert_offsets(), rank * El, D);
    parallel::dispatch_backward(r.dx.data(), dexpert_inp.data(), layout, buffer, ep);

    r.expert_offsets.assign(layout.expert_offsets().begin(), layout.expert_offsets().end());
    r.expert_inp.assign(expert_inp.begin(), expert_inp.begin() + R * D);
    return r;
}

inline parallel::DispatchConfig config_for(const DispatchCase& c) {
    parallel::DispatchConfig cfg;
    cfg.num_experts = c.num_experts;
    cfg.top_k = c.top_k;
    cfg.hidden = c.hidden;
    cfg.max_tokens = c.max_tokens();
    return cfg;
}

// Checks one rank's distributed result against its reference; gtest assertions, so any
// difference is reported with the case's name.
inline void expect_matches_reference(const DispatchResult& got, const DispatchResult& want,
                                     const std::string& name) {
    EXPECT_EQ(got.expert_offsets, want.expert_offsets) << name;
    // Dispatch only moves rows: the expert inputs are bit-for-bit the reference rows.
    EXPECT_EQ(got.expert_inp, want.expert_inp) << name;
    EXPECT_EQ(got.peer_rows_sent, want.peer_rows_sent) << name;
    ASSERT_EQ(got.out.size(), want.out.size()) << name;
    ASSERT_EQ(got.dweights.size(), want.dweights.size()) << name;
    const std::string tag = "dispatch_flat/" + name;
    expect_close(tag.c_str(), "out", compare(got.out.data(), want.out.data(), got.out.size()),
                 1e-5);
    expect_close(tag.c_str(), "dx", compare(got.dx.data(), want.dx.data(), got.dx.size()), 1e-5);
    expect_close(tag.c_str(), "dweights",
                 compare(got.dweights.data(), want.dweights.data(), got.dweights.size()), 1e-5);
}

}  // namespace moetron::testing
