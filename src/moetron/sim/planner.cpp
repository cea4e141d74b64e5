#include "moetron/sim/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/model/flops.h"
#include "moetron/model/layout_fit.h"
#include "moetron/sim/memory.h"
#include "moetron/sim/report.h"

namespace moetron::sim {

namespace {

// Weights, gradients and optimizer state of the average stage: a lower bound of any stage's
// memory, enough to skip hopeless layouts before simulating them.
double static_memory_lower_bound(const ModelConfig& model, const parallel::Layout& l,
                                 const SimOptions& o) {
    const ParamCounts pc = count_parameters(model);
    const double expert = pc.moe_routed * expert_slot_factor(model, o.redundant_experts) /
                          static_cast<double>(l.ep * l.pp);
    const double dense = (pc.total - pc.moe_routed) / static_cast<double>(l.tp * l.pp);
    BlockParams sp{dense, expert};
    return static_memory(sp, l, o.precision, o.memory, 0).total_bytes();
}

// What the pipeline schedules and EP overlap need of a layout (simulate_step's checks).
bool schedule_allows(const parallel::Layout& l, int64_t micro_batches, const SimOptions& o) {
    switch (o.pipeline_schedule) {
        case PipelineSchedule::one_f_one_b:
            // EP overlap needs interleaving once there is a pipeline.
            return !(o.combined_1f1b() && l.pp > 1 && l.vpp == 1);
        case PipelineSchedule::zero_bubble_h1:
            return l.vpp == 1 && !o.combined_1f1b();
        case PipelineSchedule::dualpipe:
            return l.vpp == 1 && l.pp >= 2 && l.pp % 2 == 0 && micro_batches >= l.pp &&
                   micro_batches % 2 == 0;
    }
    return false;
}

}  // namespace

PlanResult plan_layouts(const ModelConfig& model, const ClusterSpec& cluster, int64_t gpus,
                        const SimOptions& base, const PlanSpace& space,
                        const PlanProgressCallback& progress) {
    // The layouts that pass the cheap checks, in search order, first: their count is the total
    // that a progress display needs before the slow part (simulating each) starts.
    struct Pending {
        parallel::Layout layout;
        SimOptions options;
        bool over_static_memory = false;
    };
    std::vector<Pending> pending;
    for (int64_t tp : space.tp)
        for (int64_t cp : space.cp)
            for (int64_t pp : space.pp)
                for (int64_t vpp : space.vpp)
                    for (int64_t ep : space.ep)
                        for (int64_t mbs : space.micro_batch) {
                            if (gpus % (tp * cp * pp) != 0) continue;
                            parallel::Layout l;
                            l.tp = tp;
                            l.cp = cp;
                            l.pp = pp;
                            l.vpp = vpp;
                            l.ep = ep;
                            l.dp = gpus / (tp * cp * pp);
                            SimOptions o = base;
                            o.micro_batch = mbs;
                            const int64_t m = o.global_batch / std::max<int64_t>(1, l.dp * mbs);
                            // Cheap divisibility checks first; simulate_step checks them all.
                            if (o.global_batch % (l.dp * mbs) != 0) continue;
                            if (vpp > 1 && (pp == 1 || m % pp != 0 || m < pp)) continue;
                            if (!schedule_allows(l, m, o)) continue;
                            if (tp > cluster.scale_up.domain_gpus) continue;
                            if (!layout_misfit(l, model).empty()) continue;
                            if (model.n_routed_experts > 0 && (gpus / pp) % ep != 0) continue;
                            // Redundant slots need an EP group that splits them evenly.
                            if (o.redundant_experts > 0 &&
                                (ep == 1 ||
                                 (model.n_routed_experts + o.redundant_experts) % ep != 0)) {
                                continue;
                            }
                            if (pp * vpp > model.num_hidden_layers) continue;
                            if (o.seq_len % (2 * cp) != 0 || o.seq_len % (tp * cp) != 0) continue;
                            const bool over =
                                static_memory_lower_bound(model, l, o) > cluster.gpu.hbm_bytes;
                            pending.push_back({l, std::move(o), over});
                        }

    PlanResult out;
    const auto recomputes = static_cast<int64_t>(space.recompute.size());
    PlanProgress at;
    at.total = static_cast<int64_t>(pending.size()) * recomputes;
    size_t best = 0;  // index into out.ranked of the most TFLOPs/GPU so far (the first of equals)
    const auto report = [&] {
        if (!progress) return;
        at.evaluated = out.considered;
        at.best = out.ranked.empty() ? nullptr : &out.ranked[best];
        progress(at);
    };
    for (Pending& p : pending) {
        if (p.over_static_memory) {
            out.considered += recomputes;
            out.rejected_memory += recomputes;
            report();
            continue;
        }
        for (const std::string& rc : space.recompute) {
            p.options.recompute = parse_recompute(rc);
            ++out.considered;
            StepResult r = simulate_step_unchecked(model, cluster, p.layout, p.options);
            if (r.memory.total_bytes() > r.memory.capacity_bytes) {
                ++out.rejected_memory;
            } else {
                out.ranked.push_back({std::move(r), rc});
                if (out.ranked.back().result.tflops_per_gpu >
                    out.ranked[best].result.tflops_per_gpu)
                    best = out.ranked.size() - 1;
            }
            report();
        }
    }
    std::stable_sort(out.ranked.begin(), out.ranked.end(),
                     [](const PlanCandidate& a, const PlanCandidate& b) {
                         return a.result.tflops_per_gpu > b.result.tflops_per_gpu;
                     });
    return out;
}

std::string explain_candidate(const PlanCandidate& c, const PlanCandidate& best, int rank) {
    const StepResult& r = c.result;
    const TimeBreakdown& b = r.breakdown;
    std::string s = fmt::format(
        "#{} {} mbs{} recompute {}: {:.4g} TFLOPs/GPU, {:.0f} tokens/s/GPU, step {:.3g} s, "
        "{:.0f} of {:.0f} GB\n",
        rank, r.layout.str(), r.options.micro_batch, c.recompute, r.tflops_per_gpu,
        r.tokens_per_s_per_gpu, r.step_time_s, r.memory.total_bytes() / 1e9,
        r.memory.capacity_bytes / 1e9);
    // Where the traffic goes: EP and TP inside one NVLink domain keep per-layer traffic off the
    // NICs; the pipeline's bubble and the memory headroom bound the other choices.
    const LayoutPlacement& p = r.placement;
    s += fmt::format(
        "   EP{} {}, TP{} {}; {} micro-batches over pp{} x vpp{}; {:.0f} GB memory headroom\n",
        r.layout.ep,
        p.ep.domains == 1
            ? "inside one NVLink domain"
            : fmt::format("across {} domains ({} GPUs each)", p.ep.domains, p.ep.ranks_per_domain),
        r.layout.tp, p.tp.domains == 1 ? "on NVLink" : "across domains", r.micro_batches,
        r.layout.pp, r.layout.vpp, (r.memory.capacity_bytes - r.memory.total_bytes()) / 1e9);
    // The costs beyond useful compute, largest first.
    std::vector<std::pair<double, std::string>> costs = {
        {b.recompute_s, "recompute"},
        {b.host_idle_s, "host launch gaps"},
        {b.tp_exposed_s, "exposed TP"},
        {b.ep_exposed_s, "exposed EP all-to-all"},
        {b.cp_exposed_s, "exposed CP"},
        {b.dp_exposed_s, "exposed DP sync"},
        {b.pp_bubble_s, "pipeline bubble"},
        {b.optimizer_s, "optimizer"},
        {b.ep_jitter_s + b.dp_jitter_s + b.straggler_s, "waiting for the slowest GPU"},
        {b.memory_bound_s, "memory-bound kernels"}};
    std::sort(costs.begin(), costs.end(),
              [](const auto& x, const auto& y) { return x.first > y.first; });
    s += "   time beyond GEMM/attention: ";
    for (size_t i = 0; i < 3 && i < costs.size(); ++i) {
        s += fmt::format("{}{} {:.1f}%", i ? ", " : "", costs[i].second,
                         100 * costs[i].first / r.step_time_s);
    }
    s += "\n";
    if (&c != &best) {
        const TimeBreakdown& bb = best.result.breakdown;
        std::vector<std::pair<double, std::string>> deltas = {
            {b.gemm_s + b.attention_s - bb.gemm_s - bb.attention_s, "GEMM/attention"},
            {b.memory_bound_s - bb.memory_bound_s, "memory-bound kernels"},
            {b.recompute_s - bb.recompute_s, "recompute"},
            {b.host_idle_s - bb.host_idle_s, "host gaps"},
            {b.tp_exposed_s - bb.tp_exposed_s, "TP"},
            {b.ep_exposed_s - bb.ep_exposed_s, "EP"},
            {b.dp_exposed_s - bb.dp_exposed_s, "DP"},
            {b.pp_bubble_s - bb.pp_bubble_s, "bubble"},
            {b.ep_jitter_s + b.dp_jitter_s + b.straggler_s - bb.ep_jitter_s - bb.dp_jitter_s -
                 bb.straggler_s,
             "slowest GPU"}};
        std::sort(deltas.begin(), deltas.end(),
                  [](const auto& x, const auto& y) { return x.first > y.first; });
        // Name the differences that matter (over 0.5% of the step), largest first.
        std::string why;
        for (const auto& [seconds, what] : deltas) {
            if (seconds < 0.005 * r.step_time_s) break;
            why += fmt::format("{}{} +{:.2f} s", why.empty() ? "" : ", ", what, seconds);
        }
        s += fmt::format("   behind #1 by {:.1f}%: {}\n",
                         100 * (1 - r.tflops_per_gpu / best.result.tflops_per_gpu),
                         why.empty() ? "many small differences" : why);
    }
    return s;
}

}  // namespace moetron::sim
