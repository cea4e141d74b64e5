#include "moetron/sim/fit.h"

#include <fmt/format.h>

#include <functional>
#include <vector>

#include "moetron/core/error.h"

namespace moetron::sim {

namespace {

struct Candidate {
    std::string change;
    parallel::Layout layout;
    SimOptions options;
};

// Recompute settings in the order of what they cost (Megatron-LM's modules, then full).
const std::vector<std::string> kRecomputeLadder = {
    "mla_up_proj",
    "mlp,moe_act",
    "mla_up_proj,mlp",
    "mla_up_proj,mlp,moe_act",
    "layernorm,mla_up_proj,mlp,moe_act,shared_expert",
    "layernorm,mla_up_proj,core_attn,mlp,moe_act,shared_expert,moe",
    "full"};

std::vector<Candidate> candidates(const parallel::Layout& l, const SimOptions& o) {
    std::vector<Candidate> out;
    auto add = [&](std::string change,
                   const std::function<void(parallel::Layout&, SimOptions&)>& f) {
        Candidate c{std::move(change), l, o};
        f(c.layout, c.options);
        out.push_back(std::move(c));
    };
    const Recompute current = o.recompute;
    for (const std::string& rc : kRecomputeLadder) {
        const Recompute r = parse_recompute(rc);
        // Only settings that recompute at least what is recomputed now.
        bool superset = r.full || !current.full;
        for (int i = 0; i < kNumModules && superset && !r.full; ++i) {
            superset = !current.modules[i] || r.modules[i];
        }
        if (!superset || recompute_name(r) == recompute_name(current)) continue;
        add("--recompute " + rc, [r](parallel::Layout&, SimOptions& s) { s.recompute = r; });
    }
    if (!o.memory.offload.has(Module::moe)) {
        add("--offload-activations moe", [](parallel::Layout&, SimOptions& s) {
            s.memory.offload.modules[static_cast<int>(Module::moe)] = true;
        });
    }
    const OptimizerPrecision& op = o.memory.optimizer;
    if (op.exp_avg_bytes > 2 || op.exp_avg_sq_bytes > 2) {
        add("--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", [](parallel::Layout&, SimOptions& s) {
            s.memory.optimizer.exp_avg_bytes = 2;
            s.memory.optimizer.exp_avg_sq_bytes = 2;
        });
    }
    if (op.main_grad_bytes > 2) {
        add("--main-grads-dtype bf16",
            [](parallel::Layout&, SimOptions& s) { s.memory.optimizer.main_grad_bytes = 2; });
    }
    if (!o.memory.distributed_optimizer) {
        add("the distributed optimizer (drop --no-distributed-optimizer)",
            [](parallel::Layout&, SimOptions& s) { s.memory.distributed_optimizer = true; });
    }
    if (is_low_precision(o.precision) && !o.memory.low_precision_primary_weights) {
        add("low-precision primary weights (drop --bf16-primary-weights)",
            [](parallel::Layout&, SimOptions& s) {
                s.memory.low_precision_primary_weights = true;
            });
    }
    if (o.micro_batch > 1) {
        add(fmt::format("--mbs {}", o.micro_batch / 2),
            [](parallel::Layout&, SimOptions& s) { s.micro_batch /= 2; });
    }
    // Twice the pipeline or expert parallelism on the same GPUs (dp shrinks, or edp for EP).
    if (l.dp % 2 == 0) {
        parallel::Layout deeper = l;
        deeper.pp *= 2;
        deeper.dp /= 2;
        add(fmt::format("layout {}", deeper.str()),
            [deeper](parallel::Layout& x, SimOptions&) { x = deeper; });
    }
    if (l.edp() % 2 == 0) {
        parallel::Layout wider = l;
        wider.ep *= 2;
        add(fmt::format("layout {}", wider.str()),
            [wider](parallel::Layout& x, SimOptions&) { x = wider; });
    }
    return out;
}

}  // namespace

std::optional<FitChange> find_cheapest_fit(const ModelConfig& model, const ClusterSpec& cluster,
                                           const parallel::Layout& layout,
                                           const SimOptions& options) {
    std::optional<FitChange> best;
    for (const Candidate& c : candidates(layout, options)) {
        StepResult r;
        try {
            r = simulate_step_unchecked(model, cluster, c.layout, c.options);
        } catch (const Error&) {
            continue;  // the change makes the layout invalid (divisibility, batch)
        }
        if (r.memory.total_bytes() > r.memory.capacity_bytes) continue;
        if (!best || r.tflops_per_gpu > best->tflops_per_gpu) {
            best = FitChange{c.change, r.memory.total_bytes(), r.memory.capacity_bytes,
                             r.tflops_per_gpu};
        }
    }
    return best;
}

std::string describe_fit(const std::optional<FitChange>& fit) {
    if (!fit) {
        return "No single change (recompute, offloading, bf16 optimizer state, micro-batch, "
               "pp or ep x2) makes it fit; try `moetron plan` for this cluster";
    }
    return fmt::format("The cheapest change that fits: {} ({:.1f} of {:.1f} GB, {:.0f} TFLOPs/GPU)",
                       fit->change, fit->memory_bytes / 1e9, fit->capacity_bytes / 1e9,
                       fit->tflops_per_gpu);
}

}  // namespace moetron::sim
