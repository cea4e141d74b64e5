// A single-process reference for the flat and the two-tier dispatch, and the distributed round
// trip it checks. Every rank can rebuild every rank's inputs (they are pure functions of the case
// and the rank), so each rank computes the reference for its own tokens and its own experts
// locally, and the bytes it must send (analytic_bytes) by replaying every rank's routing.
//
// The experts are "identity experts" scaled by (e + 1): expert e maps a row x to (e + 1) x. Then
//   out[t]   = sum_j w[t,j] (e_j + 1) x[t]
//   dx[t]    = sum_j w[t,j] (e_j + 1) g[t]            for the loss sum_t dot(g[t], out[t])
//   dw[t,j]  = (e_j + 1) dot(g[t], x[t])
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/parallel/dispatch_flat.h"
#include "moetron/parallel/dispatch_payload.h"
#include "moetron/parallel/dispatch_two_tier.h"
#include "testing.h"

namespace moetron::testing {

enum class Routing {
    random,         // K distinct experts per token, uniformly
    first_experts,  // every token to experts 0..K-1 (K = 1: everything to expert 0)
    last_experts,   // every token to experts E-K..E-1 (the last rank's)
    skip_rank_1,    // random, but never an expert of rank 1 (rank 1 receives nothing)
    self_only,      // random among the rank's own experts (no traffic between ranks)
    skewed,         // e = floor(E u^3): low experts (rank 0's, domain 0's) take most copies
    skip_domain_1,  // random, but never an expert of domain 1 (its ranks receive nothing)
};

struct DispatchCase {
    std::string name;
    int64_t num_experts = 8;
    int64_t top_k = 2;
    int64_t hidden = 16;
    std::vector<int64_t> tokens_per_rank = {7};  // rank r has tokens_per_rank[r % size] tokens
    Routing routing = Routing::random;
    uint64_t seed = 1;
    int64_t domain_size = 0;  // EP ranks per domain (0: one domain)
    // The format the token rows travel to the experts in (dispatch_payload.h).
    Precision payload = Precision::fp32;

    int64_t tokens_of(int rank) const {
        return tokens_per_rank[static_cast<size_t>(rank) % tokens_per_rank.size()];
    }
    int64_t max_tokens() const {
        return *std::max_element(tokens_per_rank.begin(), tokens_per_rank.end());
    }
    int64_t ranks_per_domain(int world) const {
        return domain_size == 0 ? world : std::min<int64_t>(domain_size, world);
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
        if (c.routing == Routing::skip_domain_1 && owner / c.ranks_per_domain(world) == 1) continue;
        candidates.push_back(e);
    }
    for (int64_t t = 0; t < N; ++t) {
        int32_t* ids = in.ids.data() + t * K;
        for (int64_t j = 0; j < K; ++j) {
            if (c.routing == Routing::first_experts) ids[j] = static_cast<int32_t>(j);
            if (c.routing == Routing::last_experts) ids[j] = static_cast<int32_t>(E - K + j);
        }
        if (c.routing == Routing::skewed) {
            for (int64_t j = 0; j < K; ++j) {  // distinct: draw again on a repeat
                bool repeat = true;
                while (repeat) {
                    const double u = rng.next_unit_double();
                    ids[j] = static_cast<int32_t>(static_cast<double>(E) * u * u * u);
                    repeat = std::find(ids, ids + j, ids[j]) != ids + j;
                }
            }
        } else if (c.routing != Routing::first_experts && c.routing != Routing::last_experts) {
            pick_distinct(ids, candidates, K, rng);
        }
    }
    return in;
}

struct DispatchResult {
    std::vector<int64_t> expert_offsets;  // (El + 1)
    std::vector<float> expert_inp;        // (R, D)
    std::vector<float> out, dx, dweights;
    // Bytes this rank sent to other ranks in each phase: layout, dispatch_forward,
    // combine_forward, combine_backward, dispatch_backward.
    std::array<parallel::DispatchBytes, 5> bytes{};
};

inline DispatchResult reference_result(const DispatchCase& c, int rank, int world) {
    const int64_t K = c.top_k, D = c.hidden, E = c.num_experts, El = E / world;
    DispatchResult r;
    // The experts see each token row as it decodes from the wire format.
    auto as_received = [&](RankInputs in) {
        parallel::TokenRowCodec codec(c.payload, D, cpu_backend());
        codec.round_trip(in.x.data(), in.num_tokens);
        return in;
    };
    const RankInputs mine = as_received(make_inputs(c, rank, world));
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
        }
    }
    // This rank's experts receive, per expert, the copies of rank 0's tokens, then rank 1's, ...
    std::vector<RankInputs> all;
    for (int p = 0; p < world; ++p) all.push_back(as_received(make_inputs(c, p, world)));
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

// Rows a rank sends to other ranks and receives from them in the forward direction of one
// dispatch, by tier; and the peers it exchanges counts with.
struct TierRows {
    int64_t intra = 0, inter = 0;
};
struct HopTraffic {
    TierRows sent, received, count_peers;
};

// Replays every rank's routing: flat sends a token once to each rank owning one of its experts;
// two_tier once over the rail to each other domain it reaches, then once from the forwarding rank
// to each other rank of that domain owning one of its experts.
inline HopTraffic analytic_traffic(const DispatchCase& c, int rank, int world, bool two_tier) {
    const int64_t K = c.top_k, El = c.num_experts / world, L = c.ranks_per_domain(world);
    const int64_t G = world / L;
    auto domain = [L](int64_t r) { return r / L; };
    HopTraffic h;
    auto row = [&](int64_t from, int64_t to) {
        if (from == to) return;
        const bool remote = domain(from) != domain(to);
        if (from == rank) (remote ? h.sent.inter : h.sent.intra) += 1;
        if (to == rank) (remote ? h.received.inter : h.received.intra) += 1;
    };
    for (int src = 0; src < world; ++src) {
        const RankInputs in = make_inputs(c, src, world);
        for (int64_t t = 0; t < in.num_tokens; ++t) {
            std::vector<int64_t> ranks;
            for (int64_t j = 0; j < K; ++j) ranks.push_back(in.ids[t * K + j] / El);
            std::sort(ranks.begin(), ranks.end());
            ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
            if (!two_tier) {
                for (int64_t d : ranks) row(src, d);
                continue;
            }
            std::vector<int64_t> domains;
            for (int64_t d : ranks) domains.push_back(domain(d));
            domains.erase(std::unique(domains.begin(), domains.end()), domains.end());
            for (int64_t g : domains) {
                const int64_t forwarder = g * L + src % L;
                row(src, forwarder);  // over the rail (nothing for the own domain)
                for (int64_t d : ranks)
                    if (domain(d) == g) row(forwarder, d);  // inside the domain
            }
        }
    }
    if (two_tier) {
        h.count_peers = {L - 1, G - 1};  // the domain hop, the rail hop
    } else {
        h.count_peers = {L - 1, world - L};
    }
    return h;
}

// The bytes of each phase (DispatchResult::bytes) from the rows: route records (2K+1 words) and
// one count per peer at layout; a token row in the case's payload format to the experts (the
// cluster model's payload_bytes_per_element: hidden must be a whole number of blocks), D floats
// per row back and in the backward; K floats of dweights per row back.
inline std::array<parallel::DispatchBytes, 5> analytic_bytes(const DispatchCase& c, int rank,
                                                             int world, bool two_tier) {
    const HopTraffic h = analytic_traffic(c, rank, world, two_tier);
    const uint64_t D = static_cast<uint64_t>(c.hidden) * 4, K = static_cast<uint64_t>(c.top_k) * 4;
    const double payload_row = parallel::payload_bytes_per_element(c.payload) * c.hidden;
    const uint64_t record = (2 * static_cast<uint64_t>(c.top_k) + 1) * 4;
    auto tiers = [](const TierRows& rows, uint64_t bytes_per_row) {
        return parallel::DispatchBytes{static_cast<uint64_t>(rows.intra) * bytes_per_row,
                                       static_cast<uint64_t>(rows.inter) * bytes_per_row};
    };
    auto plus = [](parallel::DispatchBytes a, parallel::DispatchBytes b) {
        return parallel::DispatchBytes{a.intra_domain + b.intra_domain,
                                       a.inter_domain + b.inter_domain};
    };
    return {plus(tiers(h.count_peers, 4), tiers(h.sent, record)),
            tiers(h.sent, static_cast<uint64_t>(payload_row)), tiers(h.received, D),
            plus(tiers(h.sent, D), tiers(h.received, K)), tiers(h.received, D)};
}

// The four operations and the layout of one dispatch under test, flat or two-tier.
struct FlatUnderTest {
    parallel::DispatchLayout& layout;
    parallel::DispatchBuffer& buffer;
    parallel::Communicator& ep;
    void route(const RankInputs& in) {
        parallel::dispatch_layout(layout, in.ids.data(), in.weights.data(), in.num_tokens, buffer,
                                  ep);
    }
    void dispatch_forward(float* y, const float* x) {
        parallel::dispatch_forward(y, x, layout, buffer, ep);
    }
    void combine_forward(float* y, const float* x) {
        parallel::combine_forward(y, x, layout, buffer, ep);
    }
    void combine_backward(float* dy, float* dw, const float* g, const float* y) {
        parallel::combine_backward(dy, dw, g, y, layout, buffer, ep);
    }
    void dispatch_backward(float* dx, const float* dy) {
        parallel::dispatch_backward(dx, dy, layout, buffer, ep);
    }
};

struct TwoTierUnderTest {
    parallel::TwoTierLayout& layout;
    parallel::TwoTierBuffer& buffer;
    parallel::TwoTierGroups groups;
    void route(const RankInputs& in) {
        parallel::two_tier_layout(layout, in.ids.data(), in.weights.data(), in.num_tokens, buffer,
                                  groups);
    }
    void dispatch_forward(float* y, const float* x) {
        parallel::dispatch_two_tier_forward(y, x, layout, buffer, groups);
    }
    void combine_forward(float* y, const float* x) {
        parallel::combine_two_tier_forward(y, x, layout, buffer, groups);
    }
    void combine_backward(float* dy, float* dw, const float* g, const float* y) {
        parallel::combine_two_tier_backward(dy, dw, g, y, layout, buffer, groups);
    }
    void dispatch_backward(float* dx, const float* dy) {
        parallel::dispatch_two_tier_backward(dx, dy, layout, buffer, groups);
    }
};

// The distributed round trip: layout, dispatch, experts, combine, and the backward of all three.
// The layout and buffer behind `op` may be reused across calls (they must fit the case).
template <class Op>
DispatchResult run_round_trip(const DispatchCase& c, int rank, int world, Op op) {
    const int64_t K = c.top_k, D = c.hidden, El = c.num_experts / world;
    const RankInputs in = make_inputs(c, rank, world);
    const int64_t N = in.num_tokens;
    const int64_t capacity = op.buffer.config().capacity_rows(world);
    std::vector<float> expert_inp(static_cast<size_t>(capacity * D));
    std::vector<float> expert_out(expert_inp.size()), dexpert_out(expert_inp.size());
    std::vector<float> dexpert_inp(expert_inp.size());

    DispatchResult r;
    r.out.resize(static_cast<size_t>(N * D));
    r.dx.resize(static_cast<size_t>(N * D));
    r.dweights.resize(static_cast<size_t>(N * K));
    parallel::DispatchBytes& sent = op.buffer.bytes_sent();
    size_t phase = 0;
    auto next_phase = [&] {
        r.bytes[phase++] = sent;
        sent = {};
    };
    sent = {};
    op.route(in);
    next_phase();
    const int64_t R = op.layout.num_recv_rows();
    const std::span<const int64_t> offsets = op.layout.expert_offsets();
    op.dispatch_forward(expert_inp.data(), in.x.data());
    next_phase();
    scale_by_expert(expert_out.data(), expert_inp.data(), offsets, rank * El, D);
    op.combine_forward(r.out.data(), expert_out.data());
    next_phase();
    op.combine_backward(dexpert_out.data(), r.dweights.data(), in.dout.data(), expert_out.data());
    next_phase();
    scale_by_expert(dexpert_inp.data(), dexpert_out.data(), offsets, rank * El, D);
    op.dispatch_backward(r.dx.data(), dexpert_inp.data());
    next_phase();

    r.expert_offsets.assign(offsets.begin(), offsets.end());
    r.expert_inp.assign(expert_inp.begin(), expert_inp.begin() + R * D);
    return r;
}

inline DispatchResult run_dispatch(const DispatchCase& c, parallel::Communicator& ep,
                                   parallel::DispatchLayout& layout,
                                   parallel::DispatchBuffer& buffer) {
    return run_round_trip(c, ep.rank(), ep.size(), FlatUnderTest{layout, buffer, ep});
}

inline DispatchResult run_two_tier(const DispatchCase& c, int ep_rank, int ep_size,
                                   parallel::TwoTierLayout& layout, parallel::TwoTierBuffer& buffer,
                                   parallel::TwoTierGroups groups) {
    return run_round_trip(c, ep_rank, ep_size, TwoTierUnderTest{layout, buffer, groups});
}

inline parallel::DispatchConfig config_for(const DispatchCase& c) {
    parallel::DispatchConfig cfg;
    cfg.num_experts = c.num_experts;
    cfg.top_k = c.top_k;
    cfg.hidden = c.hidden;
    cfg.max_tokens = c.max_tokens();
    cfg.domain_size = c.domain_size;
    cfg.token_format = c.payload;
    return cfg;
}

// Checks one rank's distributed result against its reference; gtest assertions, so any
// difference is reported with the case's name. expected_bytes: analytic_bytes of the path taken.
inline void expect_matches_reference(const DispatchResult& got, const DispatchResult& want,
                                     const std::array<parallel::DispatchBytes, 5>& expected_bytes,
                                     const std::string& name) {
    EXPECT_EQ(got.expert_offsets, want.expert_offsets) << name;
    // Dispatch only moves rows: the expert inputs are bit-for-bit the reference rows.
    EXPECT_EQ(got.expert_inp, want.expert_inp) << name;
    static const char* const kPhases[] = {"layout", "dispatch_forward", "combine_forward",
                                          "combine_backward", "dispatch_backward"};
    for (size_t p = 0; p < got.bytes.size(); ++p) {
        EXPECT_EQ(got.bytes[p].intra_domain, expected_bytes[p].intra_domain)
            << name << ": intra-domain bytes of " << kPhases[p];
        EXPECT_EQ(got.bytes[p].inter_domain, expected_bytes[p].inter_domain)
            << name << ": inter-domain bytes of " << kPhases[p];
    }
    ASSERT_EQ(got.out.size(), want.out.size()) << name;
    ASSERT_EQ(got.dweights.size(), want.dweights.size()) << name;
    const std::string tag = "dispatch/" + name;
    expect_close(tag.c_str(), "out", compare(got.out.data(), want.out.data(), got.out.size()),
                 1e-5);
    expect_close(tag.c_str(), "dx", compare(got.dx.data(), want.dx.data(), got.dx.size()), 1e-5);
    expect_close(tag.c_str(), "dweights",
                 compare(got.dweights.data(), want.dweights.data(), got.dweights.size()), 1e-5);
}

}  // namespace moetron::testing
