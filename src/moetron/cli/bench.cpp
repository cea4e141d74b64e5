// moetron bench a2a: one MoE layer's all-to-all, flat against two-tier, under an MPI launcher with
// the EP group over the whole job split into domains of --domain-size ranks (emulated on one
// machine):
//   mpirun -np 8 moetron bench a2a --domain-size 4 --experts 64 --top-k 8 --hidden 1024 --json
// For each dispatch: the layout's time, the time of one dispatch_forward + combine_forward (the
// slowest rank's, after a barrier, mean over --iterations), the bytes the whole job sent to other
// ranks inside and across domains per dispatch + combine (and for the layout), and busbw in
// nccl-tests' language: the bytes a rank sent to other ranks / time (for an even all_to_all this
// is algbw * (n-1)/n), and beside them the cluster model's bytes for the same routing
// (sim::moe_dispatch_bytes of the routing's counted fanout, parallel/dispatch_traffic.h). Also the
// analytic inter-domain ratio two_tier / flat for uniform routing: a token reaches a remote rank
// with probability 1 - C(E-El, K)/C(E, K) and a remote domain with 1 - C(E-L*El, K)/C(E, K). The
// experts are identities (expert_out = expert_inp): only the movement is measured. On one machine
// the ranks share memory: the times are not a network's, the bytes are exact.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "moetron/cli/commands.h"
#include "moetron/cli/number_options.h"
#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/core/timer.h"
#include "moetron/core/user_error.h"
#include "moetron/kernels/backend.h"
#include "moetron/parallel/communicator.h"
#include "moetron/parallel/dispatch_traffic.h"
#include "moetron/parallel/expert_dispatcher.h"
#include "moetron/sim/collectives.h"

namespace moetron::cli {

namespace {

struct BenchA2aOptions {
    int64_t experts = 64;
    int64_t top_k = 8;
    int64_t hidden = 1024;
    int64_t tokens = 2048;  // per rank
    int domain_size = 0;
    std::string routing = "uniform";  // or "router": group-limited top-k on random logits
    int64_t n_group = 0;              // router only (0: one group per domain)
    int64_t topk_group = 1;           // router only
    double capacity_factor = 2.0;     // ExpertDispatchConfig::capacity_factor
    int iterations = 10;
    int warmup = 2;
    uint64_t seed = 1;
    bool json = false;
};

struct Routing {
    std::vector<int32_t> ids;    // (N, K)
    std::vector<float> weights;  // (N, K)
};

// K distinct experts per token, uniformly; or the router's group-limited top-k.
Routing make_routing(const BenchA2aOptions& o, int64_t num_domains, int rank) {
    const int64_t N = o.tokens, K = o.top_k, E = o.experts;
    Routing r;
    r.ids.resize(static_cast<size_t>(N * K));
    r.weights.assign(static_cast<size_t>(N * K), 1.0f / static_cast<float>(K));
    RngStream rng(o.seed, static_cast<uint64_t>(rank));
    if (o.routing == "uniform") {
        std::vector<int32_t> experts(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) experts[static_cast<size_t>(e)] = static_cast<int32_t>(e);
        for (int64_t t = 0; t < N; ++t) {
            for (int64_t j = 0; j < K; ++j) {  // partial Fisher-Yates
                const auto pick = static_cast<size_t>(j) + rng.next_below(E - j);
                std::swap(experts[static_cast<size_t>(j)], experts[pick]);
                r.ids[static_cast<size_t>(t * K + j)] = experts[static_cast<size_t>(j)];
            }
        }
        return r;
    }
    const int64_t groups = o.n_group > 0 ? o.n_group : num_domains;
    std::vector<float> logits(static_cast<size_t>(N * E)), scores(logits.size());
    for (float& x : logits) x = static_cast<float>(rng.next_unit_double() * 4.0 - 2.0);
    cpu_backend().router_forward(r.ids.data(), r.weights.data(), scores.data(), logits.data(),
                                 nullptr, {N, E, K, groups, o.topk_group, 1.0f, true});
    return r;
}

double slowest_s(parallel::Communicator& world, double seconds) {
    std::vector<double> all(static_cast<size_t>(world.size()));
    world.all_gather(std::span<double>(all), std::span<const double>(&seconds, 1), kHostStream);
    return *std::max_element(all.begin(), all.end());
}

double sum_over(parallel::Communicator& world, double value) {
    world.all_reduce_sum(std::span<double>(&value, 1), kHostStream);
    return value;
}

struct Figures {
    std::string description;
    double layout_ms = 0;
    double dispatch_combine_ms = 0;
    double layout_intra_bytes = 0, layout_inter_bytes = 0;  // job, one layout
    double intra_bytes = 0, inter_bytes = 0;                // job, one dispatch + combine
    double busbw_gbps = 0;
    double ranks_per_token = 0, domains_per_token = 0, domains_per_token_max = 0;
    // The cluster model's bytes for this routing (sim::moe_dispatch_bytes of its counted fanout),
    // job, one dispatch + combine: equal to the measured ones.
    double predicted_intra_bytes = 0, predicted_inter_bytes = 0;
};

// The routing's shape as the dispatcher sees it; its ranks_per_domain is what both dispatches
// route and count bytes by.
parallel::DispatchConfig routing_config(const BenchA2aOptions& o) {
    parallel::DispatchConfig c;
    c.num_experts = o.experts;
    c.top_k = o.top_k;
    c.hidden = o.hidden;
    c.max_tokens = o.tokens;
    c.domain_size = o.domain_size;
    return c;
}

// The fanout of every rank's tokens, summed over the job.
parallel::DispatchFanout job_fanout(const BenchA2aOptions& o, const Routing& routing,
                                    parallel::Communicator& world, int64_t ranks_per_domain) {
    const parallel::DispatchFanout f = parallel::count_dispatch_fanout(
        routing.ids, o.top_k, o.experts / world.size(), ranks_per_domain, world.rank());
    std::array<double, 4> sums{f.own_domain_ranks, f.other_domain_ranks, f.other_domains,
                               f.other_domain_landings};
    world.all_reduce_sum(std::span<double>(sums), kHostStream);
    return {sums[0], sums[1], sums[2], sums[3]};
}

Figures measure(const BenchA2aOptions& o, parallel::DispatchKind kind, const Routing& routing,
                parallel::Communicator& world, const parallel::ExpertGroups& groups,
                const parallel::DispatchFanout& fanout) {
    parallel::ExpertDispatchConfig c;
    c.routing = routing_config(o);
    c.num_slots = 1;
    c.capacity_factor = o.capacity_factor;
    c.kind = kind;
    std::unique_ptr<parallel::ExpertDispatcher> d =
        parallel::make_expert_dispatcher(c, groups, cpu_backend());
    const int64_t D = o.hidden;
    std::vector<float> x(static_cast<size_t>(o.tokens * D), 1.0f), out(x.size());
    std::vector<float> expert_rows(static_cast<size_t>(d->capacity_rows() * D));

    Figures f;
    f.description = d->description();
    world.barrier();
    Timer t;
    d->route(0, routing.ids.data(), routing.weights.data(), o.tokens);
    f.layout_ms = slowest_s(world, t.elapsed_s()) * 1e3;
    const parallel::DispatchStats layout = d->stats();
    f.layout_intra_bytes = sum_over(world, static_cast<double>(layout.bytes.intra_domain));
    f.layout_inter_bytes = sum_over(world, static_cast<double>(layout.bytes.inter_domain));
    const parallel::RoutingSpread& s = layout.spread;
    const double tokens = sum_over(world, static_cast<double>(s.num_tokens));
    f.ranks_per_token = sum_over(world, static_cast<double>(s.rank_sum)) / tokens;
    f.domains_per_token = sum_over(world, static_cast<double>(s.domain_sum)) / tokens;
    f.domains_per_token_max = slowest_s(world, static_cast<double>(s.domain_max));

    double total_s = 0;
    for (int i = 0; i < o.warmup + o.iterations; ++i) {
        if (i == o.warmup) d->reset_stats();
        world.barrier();
        t.reset();
        d->dispatch_forward(0, expert_rows.data(), x.data(), d->planned_token_format());
        d->combine_forward(0, out.data(), expert_rows.data(), routing.weights.data());
        const double s_iter = slowest_s(world, t.elapsed_s());
        if (i >= o.warmup) total_s += s_iter;
    }
    const parallel::DispatchStats moved = d->stats();
    const double n = static_cast<double>(o.iterations);
    f.dispatch_combine_ms = total_s / n * 1e3;
    f.intra_bytes = sum_over(world, static_cast<double>(moved.bytes.intra_domain)) / n;
    f.inter_bytes = sum_over(world, static_cast<double>(moved.bytes.inter_domain)) / n;
    const double per_rank_bytes = (f.intra_bytes + f.inter_bytes) / world.size();
    f.busbw_gbps = per_rank_bytes / (total_s / n) / 1e9;
    // The summed fanout as one token's: rows of D floats, there and back.
    const sim::CommCost predicted =
        sim::moe_dispatch_bytes(fanout, kind, 1, static_cast<double>(o.hidden) * sizeof(float));
    f.predicted_intra_bytes = 2 * predicted.scale_up_bytes;
    f.predicted_inter_bytes = 2 * predicted.scale_out_bytes;
    return f;
}

// 1 - C(E - m, K) / C(E, K): the chance that K distinct uniform experts hit a given m of them.
double hit_probability(int64_t E, int64_t K, int64_t m) {
    double miss = 1.0;
    for (int64_t i = 0; i < K; ++i)
        miss *= static_cast<double>(E - m - i) / static_cast<double>(E - i);
    return 1.0 - std::max(miss, 0.0);
}

nlohmann::ordered_json to_json(const Figures& f) {
    nlohmann::ordered_json j;
    j["dispatcher"] = f.description;
    j["layout_ms"] = f.layout_ms;
    j["dispatch_combine_ms"] = f.dispatch_combine_ms;
    j["intra_domain_bytes"] = f.intra_bytes;
    j["inter_domain_bytes"] = f.inter_bytes;
    j["layout_intra_domain_bytes"] = f.layout_intra_bytes;
    j["layout_inter_domain_bytes"] = f.layout_inter_bytes;
    j["busbw_GBps"] = f.busbw_gbps;
    j["ranks_per_token"] = f.ranks_per_token;
    j["domains_per_token"] = f.domains_per_token;
    j["domains_per_token_max"] = f.domains_per_token_max;
    j["predicted_intra_domain_bytes"] = f.predicted_intra_bytes;
    j["predicted_inter_domain_bytes"] = f.predicted_inter_bytes;
    return j;
}

void run_bench_a2a(const BenchA2aOptions& o, parallel::Communicator& world) {
    const int ep = world.size();
    const auto L = static_cast<int>(routing_config(o).ranks_per_domain(ep));
    MT_USER_CHECK(ep % L == 0,
                  "[bench a2a] --domain-size {} does not split the {} ranks into domains",
                  o.domain_size, ep);
    MT_USER_CHECK(o.experts % ep == 0, "[bench a2a] --experts {} do not split over {} ranks",
                  o.experts, ep);
    MT_USER_CHECK(o.routing == "uniform" || o.routing == "router",
                  "[bench a2a] --routing '{}': use uniform or router", o.routing);
    MT_USER_CHECK(o.iterations >= 1 && o.warmup >= 0 && o.tokens >= 1,
                  "[bench a2a] --iterations, --tokens-per-rank must be >= 1 and --warmup >= 0");
    const int G = ep / L, r = world.rank();
    // The EP group is the whole job: its rail and domain groups split from it.
    std::unique_ptr<parallel::Communicator> rail = world.split(r % L, r / L, "ep_rail");
    std::unique_ptr<parallel::Communicator> domain = world.split(r / L, r % L, "ep_domain");
    const parallel::ExpertGroups groups{&world, rail.get(), domain.get()};
    const Routing routing = make_routing(o, G, r);

    const parallel::DispatchFanout fanout = job_fanout(o, routing, world, L);
    const Figures flat = measure(o, parallel::DispatchKind::flat, routing, world, groups, fanout);
    const Figures two_tier =
        measure(o, parallel::DispatchKind::two_tier, routing, world, groups, fanout);

    const int64_t El = o.experts / ep;
    const double flat_rows = (ep - L) * hit_probability(o.experts, o.top_k, El);
    const double two_tier_rows = (G - 1) * hit_probability(o.experts, o.top_k, L * El);
    const double analytic = flat_rows > 0 ? two_tier_rows / flat_rows : 0.0;
    const double measured = flat.inter_bytes > 0 ? two_tier.inter_bytes / flat.inter_bytes : 0.0;
    if (r != 0) return;

    nlohmann::ordered_json j;
    j["ranks"] = ep;
    j["domain_size"] = L;
    j["domains"] = G;
    j["experts"] = o.experts;
    j["top_k"] = o.top_k;
    j["hidden"] = o.hidden;
    j["tokens_per_rank"] = o.tokens;
    j["routing"] = o.routing;
    j["iterations"] = o.iterations;
    j["fanout"] = {{"own_domain_ranks", fanout.own_domain_ranks},
                   {"other_domain_ranks", fanout.other_domain_ranks},
                   {"other_domains", fanout.other_domains},
                   {"other_domain_landings", fanout.other_domain_landings}};
    j["flat"] = to_json(flat);
    j["two_tier"] = to_json(two_tier);
    j["inter_domain_ratio"] = measured;
    if (o.routing == "uniform") {
        j["analytic_inter_domain_ratio"] = analytic;
        j["ratio_error"] = analytic > 0 ? measured / analytic - 1.0 : 0.0;
    }
    if (o.json) {
        std::printf("%s\n", j.dump(2).c_str());
        return;
    }
    std::printf(
        "moetron bench a2a: %d ranks, %d domains of %d; E %lld, K %lld, D %lld, %lld "
        "tokens per rank, %s routing\n",
        ep, G, L, static_cast<long long>(o.experts), static_cast<long long>(o.top_k),
        static_cast<long long>(o.hidden), static_cast<long long>(o.tokens), o.routing.c_str());
    for (const Figures* f : {&flat, &two_tier}) {
        std::printf("  %s\n", f->description.c_str());
        std::printf("    dispatch+combine %.3f ms (layout %.3f ms), busbw %.2f GB/s\n",
                    f->dispatch_combine_ms, f->layout_ms, f->busbw_gbps);
        std::printf(
            "    bytes (job): intra-domain %.0f, inter-domain %.0f; per token %.2f ranks, "
            "%.2f domains (max %.0f)\n",
            f->intra_bytes, f->inter_bytes, f->ranks_per_token, f->domains_per_token,
            f->domains_per_token_max);
        std::printf(
            "    the cluster model's bytes for this routing: intra-domain %.0f, "
            "inter-domain %.0f\n",
            f->predicted_intra_bytes, f->predicted_inter_bytes);
    }
    std::printf("  inter-domain bytes two_tier / flat: %.4f", measured);
    if (o.routing == "uniform") std::printf(" (analytic %.4f)", analytic);
    std::printf("\n");
}

}  // namespace

void register_bench(CLI::App& app) {
    CLI::App* bench = app.add_subcommand("bench", "Measure parts of the engine under mpirun");
    bench->require_subcommand(1);
    auto o = std::make_shared<BenchA2aOptions>();
    CLI::App* a2a = bench->add_subcommand(
        "a2a", "one MoE layer's dispatch + combine, flat against two_tier (run under mpirun)");
    a2a->add_option("--experts", o->experts, "routed experts E over all ranks")
        ->check(whole_number(1, int64_t{1} << 20));
    a2a->add_option("--top-k", o->top_k, "experts per token K")
        ->check(whole_number(1, int64_t{1} << 20));
    a2a->add_option("--hidden", o->hidden, "hidden size D")
        ->check(whole_number(1, int64_t{1} << 24));
    a2a->add_option("--tokens-per-rank", o->tokens, "tokens each rank dispatches")
        ->capture_default_str()
        ->check(whole_number(1, int64_t{1} << 30));
    a2a->add_option("--domain-size", o->domain_size,
                    "ranks per (emulated) scale-up domain (0: one domain)")
        ->check(whole_number(0, int64_t{1} << 20));
    a2a->add_option("--routing", o->routing,
                    "uniform (K distinct experts per token) or router (group-limited top-k on "
                    "random logits)")
        ->check(CLI::IsMember({"uniform", "router"}));
    a2a->add_option("--n-group", o->n_group, "router groups (0: one per domain)")
        ->check(whole_number(0, int64_t{1} << 20));
    a2a->add_option("--topk-group", o->topk_group, "groups a token may use (router)")
        ->check(whole_number(1, int64_t{1} << 20));
    a2a->add_option("--capacity-factor", o->capacity_factor,
                    "expert-side rows held per rank, in units of the balanced load (tokens * K); a "
                    "routing that exceeds it is refused here (train splits it into rounds)")
        ->check(positive_number(1000));
    a2a->add_option("--iterations", o->iterations, "timed dispatch+combine calls")
        ->check(whole_number(1, INT_MAX));
    a2a->add_option("--warmup", o->warmup, "untimed calls first")->check(whole_number(0, INT_MAX));
    a2a->add_option("--seed", o->seed, "routing seed");
    a2a->add_flag("--json", o->json, "print one JSON object (rank 0)");
    a2a->callback([o] {
        parallel::MpiSession session(nullptr, nullptr);
        int rank = -1;
        try {
            std::unique_ptr<parallel::Communicator> world = parallel::make_mpi_world(session);
            rank = world->rank();
            run_bench_a2a(*o, *world);
            world->barrier();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "moetron: error on rank %d: %s\n", rank, e.what());
            std::fflush(stderr);
            parallel::MpiSession::abort_job(1);
        }
    });
}

}  // namespace moetron::cli
