#include "moetron/sim/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron::sim {

namespace {

struct Virtual {
    int64_t chunk_local;
    int64_t micro;
};

Virtual forward_virtual(int64_t k, int64_t pp, int64_t vpp) {
    const int64_t group = pp * vpp;
    return {(k % group) / pp, (k / group) * pp + k % pp};
}

Virtual backward_virtual(int64_t k, int64_t pp, int64_t vpp) {
    Virtual v = forward_virtual(k, pp, vpp);
    v.chunk_local = vpp - 1 - v.chunk_local;
    return v;
}

}  // namespace

PipelineSchedule pipeline_schedule_from_name(const std::string& name) {
    if (name == "1f1b") return PipelineSchedule::one_f_one_b;
    if (name == "zb-h1") return PipelineSchedule::zero_bubble_h1;
    if (name == "dualpipe") return PipelineSchedule::dualpipe;
    MT_USER_THROW("unknown pipeline schedule '{}' (known: 1f1b, zb-h1, dualpipe)", name);
}

const char* pipeline_schedule_name(PipelineSchedule s) {
    switch (s) {
        case PipelineSchedule::one_f_one_b:
            return "1f1b";
        case PipelineSchedule::zero_bubble_h1:
            return "zb-h1";
        case PipelineSchedule::dualpipe:
            return "dualpipe";
    }
    return "?";
}

double dualpipe_makespan_s(int64_t pp, int64_t m, double fb, double b, double w) {
    MT_CHECK(pp >= 2 && pp % 2 == 0, "[sim] DualPipe needs an even pp >= 2, got {}", pp);
    const double bubble = static_cast<double>(pp / 2 - 1) * std::max(0.0, fb + b - 3 * w);
    return static_cast<double>(m) * fb + bubble;
}

std::vector<ScheduledTask> stage_order(int64_t stage, int64_t pp, int64_t vpp,
                                       int64_t micro_batches, bool merge_steady_state) {
    const int64_t total = micro_batches * vpp;
    int64_t warmup = 0;
    if (vpp == 1) {
        warmup = std::min(micro_batches, pp - stage - 1);
    } else if (micro_batches == pp) {
        warmup = total;
    } else {
        warmup = std::min(total, 2 * (pp - stage - 1) + (vpp - 1) * pp);
    }
    // Merging a forward with a backward needs them to be of different micro-batches: the
    // combined schedule runs one more forward ahead.
    if (merge_steady_state) warmup = std::min(total, warmup + 1);

    auto fwd = [&](int64_t k) {
        ScheduledTask t;
        t.kind = TaskKind::forward;
        const Virtual v = forward_virtual(k, pp, vpp);
        t.chunk_f = v.chunk_local * pp + stage;
        t.micro_f = v.micro;
        return t;
    };
    auto bwd = [&](int64_t k) {
        ScheduledTask t;
        t.kind = TaskKind::backward;
        const Virtual v = backward_virtual(k, pp, vpp);
        t.chunk_b = v.chunk_local * pp + stage;
        t.micro_b = v.micro;
        return t;
    };

    std::vector<ScheduledTask> order;
    for (int64_t k = 0; k < warmup; ++k) order.push_back(fwd(k));
    const int64_t steady = total - warmup;
    for (int64_t k = 0; k < steady; ++k) {
        ScheduledTask f = fwd(k + warmup);
        ScheduledTask b = bwd(k);
        if (merge_steady_state) {
            ScheduledTask fb = f;
            fb.kind = TaskKind::forward_backward;
            fb.chunk_b = b.chunk_b;
            fb.micro_b = b.micro_b;
            order.push_back(fb);
        } else {
            order.push_back(f);
            order.push_back(b);
        }
    }
    for (int64_t k = steady; k < total; ++k) order.push_back(bwd(k));
    return order;
}

ScheduleResult run_schedule(const ScheduleInput& in) {
    const int64_t pp = in.pp, vpp = in.vpp, m = in.micro_batches;
    MT_CHECK(pp >= 1 && vpp >= 1 && m >= 1, "[sim] schedule needs pp, vpp, micro-batches >= 1");
    const bool zero_bubble = in.schedule == PipelineSchedule::zero_bubble_h1;
    MT_CHECK(in.schedule != PipelineSchedule::dualpipe,
             "[sim] internal error: DualPipe has its own simulation (run_dualpipe)");
    if (zero_bubble) {
        MT_CHECK(vpp == 1 && !in.merge_steady_state,
                 "[sim] the zero-bubble schedule zb-h1 runs without interleaving (vpp 1, got {}) "
                 "and without the combined 1F1B of --moe-overlap dual",
                 vpp);
    }
    MT_CHECK(vpp == 1 || m % pp == 0,
             "[sim] the interleaved schedule (vpp {}) needs the micro-batch count ({}) to be a "
             "multiple of pp ({}); change the global batch or the micro-batch size",
             vpp, m, pp);
    MT_CHECK(vpp == 1 || m >= pp,
             "[sim] the interleaved schedule needs at least pp = {} micro-batches, got {}", pp, m);
    const int64_t chunks = pp * vpp;
    const double unset = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> done_f(chunks * m, unset), done_b(chunks * m, unset);
    auto at = [m](int64_t g, int64_t i) { return g * m + i; };

    ScheduleResult r;
    r.stages.resize(pp);
    r.busy_s.assign(pp, 0);
    r.end_s.assign(pp, 0);
    r.chunk_grads_ready_s.assign(chunks, 0);
    std::vector<size_t> next(pp, 0);
    std::vector<double> free_at(pp, 0);
    // F and B in 1F1B order; with zero bubble, each B's W joins the stage's pending queue and
    // runs when the stage would otherwise wait for its next input, or when more than pp - 1
    // are pending (what bounds the memory the W passes hold), or at the end.
    std::vector<std::vector<ScheduledTask>> order(pp);
    for (int64_t s = 0; s < pp; ++s) order[s] = stage_order(s, pp, vpp, m, in.merge_steady_state);
    std::vector<std::vector<ScheduledTask>> pending_w(pp);
    std::vector<size_t> oldest_w(pp, 0);
    auto run_w = [&](int64_t s) {
        ScheduledTask w = pending_w[s][oldest_w[s]++];
        const double dur = in.weight_gradient_s(w.chunk_b);
        w.start_s = free_at[s];
        w.end_s = w.start_s + dur;
        free_at[s] = w.end_s;
        r.busy_s[s] += dur;
        r.chunk_grads_ready_s[w.chunk_b] = std::max(r.chunk_grads_ready_s[w.chunk_b], w.end_s);
        r.stages[s].push_back(w);
    };
    auto w_pending = [&](int64_t s) {
        return static_cast<int64_t>(pending_w[s].size() - oldest_w[s]);
    };

    // Ready time of a forward / backward input, or NaN while its producer has not run.
    auto forward_ready = [&](int64_t g, int64_t i) {
        if (g == 0) return 0.0;
        const double t = done_f[at(g - 1, i)];
        return std::isnan(t) ? t : t + (pp > 1 ? in.p2p_s : 0.0);
    };
    auto backward_ready = [&](int64_t g, int64_t i) {
        if (g == chunks - 1) return done_f[at(g, i)];
        const double t = done_b[at(g + 1, i)];
        return std::isnan(t) ? t : t + (pp > 1 ? in.p2p_s : 0.0);
    };

    size_t remaining = 0;
    for (const auto& st : order) remaining += st.size();
    while (remaining > 0) {
        bool progressed = false;
        for (int64_t s = 0; s < pp; ++s) {
            while (next[s] < order[s].size()) {
                ScheduledTask t = order[s][next[s]];
                double ready = 0, dur = 0;
                if (t.kind == TaskKind::forward) {
                    ready = forward_ready(t.chunk_f, t.micro_f);
                    dur = in.forward_s(t.chunk_f);
                } else if (t.kind == TaskKind::backward) {
                    ready = backward_ready(t.chunk_b, t.micro_b);
                    dur = in.backward_s(t.chunk_b);
                } else {
                    const double rf = forward_ready(t.chunk_f, t.micro_f);
                    const double rb = backward_ready(t.chunk_b, t.micro_b);
                    ready = (std::isnan(rf) || std::isnan(rb)) ? unset : std::max(rf, rb);
                    dur = in.forward_backward_s(t.chunk_f, t.chunk_b);
                }
                if (std::isnan(ready)) break;
                while (zero_bubble && w_pending(s) > 0 &&
                       (free_at[s] < ready || w_pending(s) > pp - 1)) {
                    run_w(s);
                }
                t.start_s = std::max(free_at[s], ready);
                t.end_s = t.start_s + dur;
                free_at[s] = t.end_s;
                r.busy_s[s] += dur;
                if (t.kind == TaskKind::forward || t.kind == TaskKind::forward_backward) {
                    done_f[at(t.chunk_f, t.micro_f)] = t.end_s;
                }
                if (t.kind == TaskKind::backward || t.kind == TaskKind::forward_backward) {
                    done_b[at(t.chunk_b, t.micro_b)] = t.end_s;
                }
                if (t.kind != TaskKind::forward) {
                    r.chunk_grads_ready_s[t.chunk_b] =
                        std::max(r.chunk_grads_ready_s[t.chunk_b], t.end_s);
                }
                r.stages[s].push_back(t);
                if (zero_bubble && t.kind == TaskKind::backward) {
                    ScheduledTask w;
                    w.kind = TaskKind::weight_gradient;
                    w.chunk_b = t.chunk_b;
                    w.micro_b = t.micro_b;
                    pending_w[s].push_back(w);
                }
                ++next[s];
                --remaining;
                progressed = true;
            }
        }
        MT_CHECK(progressed,
                 "[sim] internal error: pipeline schedule deadlocked (pp {}, vpp {}, "
                 "{} micro-batches)",
                 pp, vpp, m);
    }
    for (int64_t s = 0; s < pp; ++s) {
        while (w_pending(s) > 0) run_w(s);
        r.end_s[s] = free_at[s];
        r.makespan_s = std::max(r.makespan_s, free_at[s]);
    }
    return r;
}

}  // namespace moetron::sim
