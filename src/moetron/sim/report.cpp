#include "moetron/sim/report.h"

#include <fmt/format.h>

#include "moetron/parallel/expert_dispatcher.h"

namespace moetron::sim {

namespace {

std::string overlaps(const SimOptions& o) {
    std::string s;
    auto add = [&](bool on, const char* name) {
        if (on) s += fmt::format("{}{}", s.empty() ? "" : "+", name);
    };
    add(o.overlap_tp, "tp");
    add(o.overlap_dp_grad, "dp-grad");
    add(o.overlap_dp_param, "dp-param");
    return s.empty() ? "none" : s;
}

std::string line(const char* label, double seconds, double step) {
    return fmt::format("  {:<34} {:9.1f} ms  {:5.1f}%\n", label, seconds * 1e3,
                       step > 0 ? 100 * seconds / step : 0);
}

}  // namespace

std::string describe_options(const StepResult& r) {
    const SimOptions& o = r.options;
    // Each choice as its flag spells it (dispatch two_tier, dispatch-payload recipe, moe-overlap
    // dual), so that the line can be typed back; the payload and the MoE overlap only when they
    // are not the defaults.
    std::string moe;
    if (o.dispatch_payload != parallel::DispatchPayload::activation)
        moe += fmt::format(", dispatch-payload {}",
                           parallel::dispatch_payload_name(o.dispatch_payload));
    if (o.moe_overlap != MoeOverlap::off)
        moe += fmt::format(", moe-overlap {}", moe_overlap_name(o.moe_overlap));
    return fmt::format("{} mbs{} {} recompute {}, graphs {}, dispatch {}{}, overlap {}",
                       r.layout.str(), o.micro_batch, pipeline_schedule_name(o.pipeline_schedule),
                       recompute_name(o.recompute), cuda_graphs_name(o.cuda_graphs),
                       parallel::dispatch_kind_name(o.dispatcher), moe, overlaps(o));
}

std::string format_step_report(const StepResult& r) {
    const SimOptions& o = r.options;
    const TimeBreakdown& b = r.breakdown;
    const double step = r.step_time_s;
    std::string s;
    s += fmt::format("moetron simulate: {} on {} x {}\n", r.model_name, r.gpus, r.cluster_name);
    s += fmt::format("  layout {} (edp {}), {} micro-batches of {} x {} tokens, {}\n",
                     r.layout.str(), r.layout.edp(), r.micro_batches, o.micro_batch, o.seq_len,
                     precision_name(o.precision));
    s += fmt::format("  options: {}; MTP {}\n", describe_options(r),
                     o.count_mtp ? "simulated and counted" : "not simulated, not counted");
    if (!o.expert_loads.empty() || o.redundant_experts > 0) {
        s += fmt::format(
            "  routing imbalance: tokens per EP rank max/mean {:.3f} ({}), on top of the "
            "routing noise\n",
            r.expert_imbalance,
            o.redundant_experts > 0 ? fmt::format("{} redundant experts", o.redundant_experts)
                                    : std::string("experts split contiguously"));
    }
    s += "\n";
    s += fmt::format("  step time                  {:10.3f} s\n", step);
    s += fmt::format("  tokens/s/GPU               {:10.0f}\n", r.tokens_per_s_per_gpu);
    s += fmt::format(
        "  delivered TFLOPs/GPU       {:10.1f}   ({:.1f} GFLOPs/token, Megatron "
        "convention)\n",
        r.tflops_per_gpu, r.model_flops_per_token / 1e9);
    s += fmt::format("  MFU                        {:10.1f}%  (of {} dense peak)\n", 100 * r.mfu,
                     math_rate_key(math_rate_of(o.precision)));
    s += "\n";
    s += fmt::format("  step breakdown (pipeline stage {}, the critical one):\n", r.critical_stage);
    s += line("compute: GEMM", b.gemm_s, step);
    s += line("compute: attention core", b.attention_s, step);
    s += line("compute: memory-bound", b.memory_bound_s, step);
    s += line("compute: recompute", b.recompute_s, step);
    s += line("host launch overhead (GPU idle)", b.host_idle_s, step);
    s += line("exposed TP communication", b.tp_exposed_s, step);
    s += line("exposed EP communication", b.ep_exposed_s, step);
    if (b.cp_exposed_s > 0) s += line("exposed CP communication", b.cp_exposed_s, step);
    if (b.offload_exposed_s > 0) {
        s += line("exposed activation offloading", b.offload_exposed_s, step);
    }
    s += line("exposed DP communication", b.dp_exposed_s, step);
    s += line("pipeline bubble", b.pp_bubble_s, step);
    s += line("optimizer", b.optimizer_s, step);
    s += line("slowest of EP group (GPU spread)", b.ep_jitter_s, step);
    s += line("slowest of all GPUs (DP sync)", b.dp_jitter_s, step);
    s += line("straggler events", b.straggler_s, step);
    s += "\n";
    const MemoryBreakdown& m = r.memory;
    s += fmt::format("  memory per GPU (stage {} is the fullest): {:.1f} of {:.1f} GB\n", m.stage,
                     m.total_bytes() / 1e9, m.capacity_bytes / 1e9);
    s += fmt::format("    {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}  (GB)\n",
                     "stage", "weights", "grads", "optim", "activ", "buffers", "reserve", "total",
                     "params", "offload");
    for (const MemoryBreakdown& ms : r.memory_per_stage) {
        s += fmt::format(
            "    {:>5} {:8.1f} {:8.1f} {:8.1f} {:8.1f} {:8.1f} {:8.1f} {:8.1f} {:7.2f}B {:8.1f}\n",
            ms.stage, ms.weights_bytes / 1e9, ms.grads_bytes / 1e9, ms.optimizer_bytes / 1e9,
            ms.activations_bytes / 1e9, ms.comm_buffers_bytes / 1e9, ms.reserve_bytes / 1e9,
            ms.total_bytes() / 1e9, ms.params / 1e9, ms.offloaded_bytes / 1e9);
    }
    const OptimizerPrecision& op = o.memory.optimizer;
    s += fmt::format(
        "    main grads {}, main params {}, exp_avg {}, exp_avg_sq {} bytes; optimizer {}; "
        "offloaded activations (host memory): {}{}\n",
        op.main_grad_bytes, op.main_param_bytes, op.exp_avg_bytes, op.exp_avg_sq_bytes,
        o.memory.distributed_optimizer ? "sharded over dp and expert-dp" : "not sharded",
        recompute_name(o.memory.offload),
        o.memory.low_precision_swiglu_input ? "; MoE SwiGLU input cached in the GEMM format" : "");
    return s;
}

std::string format_layer_ops(const StepResult& r) {
    auto kind_name = [](OpKind k) {
        switch (k) {
            case OpKind::gemm:
                return "gemm";
            case OpKind::grouped_gemm:
                return "grouped";
            case OpKind::attention:
                return "attention";
            case OpKind::memory:
                return "memory";
            case OpKind::copy:
                return "copy";
            case OpKind::comm_tp:
                return "tp-comm";
            case OpKind::comm_ep:
                return "ep-comm";
            case OpKind::comm_cp:
                return "cp-comm";
            case OpKind::sync:
                return "sync";
        }
        return "?";
    };
    std::string s = "  one layer, one micro-batch (start and duration in microseconds):\n";
    for (const auto* list : {&r.moe_layer_forward, &r.moe_layer_backward}) {
        for (const OpEvent& e : *list) {
            s += fmt::format("    {:>9.1f} {:>8.1f}  {:<10} {}\n", e.start_s * 1e6,
                             (e.end_s - e.start_s) * 1e6, kind_name(e.kind), e.name);
        }
        s += "    --\n";
    }
    return s;
}

std::string format_redundant_comparison(const StepResult& with, const StepResult& without) {
    return fmt::format(
        "\n  redundant experts: step {:.3f} s with {} (max/mean {:.3f}), {:.3f} s without "
        "(max/mean {:.3f}); {:.1f} vs {:.1f} TFLOPs/GPU, {:.1f} vs {:.1f} GB{}\n",
        with.step_time_s, with.options.redundant_experts, with.expert_imbalance,
        without.step_time_s, without.expert_imbalance, with.tflops_per_gpu, without.tflops_per_gpu,
        with.memory.total_bytes() / 1e9, without.memory.total_bytes() / 1e9,
        without.memory.total_bytes() > without.memory.capacity_bytes
            ? " (without: over the GPU's memory)"
            : "");
}

nlohmann::json step_report_json(const StepResult& r) {
    const TimeBreakdown& b = r.breakdown;
    nlohmann::json mem = nlohmann::json::array();
    for (const MemoryBreakdown& m : r.memory_per_stage) {
        mem.push_back({{"stage", m.stage},
                       {"total_bytes", m.total_bytes()},
                       {"capacity_bytes", m.capacity_bytes},
                       {"params", m.params},
                       {"weights_bytes", m.weights_bytes},
                       {"grads_bytes", m.grads_bytes},
                       {"optimizer_bytes", m.optimizer_bytes},
                       {"activations_bytes", m.activations_bytes},
                       {"comm_buffers_bytes", m.comm_buffers_bytes},
                       {"reserve_bytes", m.reserve_bytes},
                       {"offloaded_bytes", m.offloaded_bytes}});
    }
    return {
        {"model", r.model_name},
        {"cluster", r.cluster_name},
        {"gpus", r.gpus},
        {"layout", r.layout.str()},
        {"options", describe_options(r)},
        {"precision", precision_name(r.options.precision)},
        {"seq_len", r.options.seq_len},
        {"global_batch", r.options.global_batch},
        {"micro_batch", r.options.micro_batch},
        {"micro_batches", r.micro_batches},
        {"count_mtp", r.options.count_mtp},
        {"step_time_s", r.step_time_s},
        {"expert_imbalance", r.expert_imbalance},
        {"redundant_experts", r.options.redundant_experts},
        {"tokens_per_s_per_gpu", r.tokens_per_s_per_gpu},
        {"model_flops_per_token", r.model_flops_per_token},
        {"tflops_per_gpu", r.tflops_per_gpu},
        {"mfu", r.mfu},
        {"critical_stage", r.critical_stage},
        {"breakdown_s",
         {{"gemm", b.gemm_s},
          {"attention", b.attention_s},
          {"memory_bound", b.memory_bound_s},
          {"recompute", b.recompute_s},
          {"host_idle", b.host_idle_s},
          {"tp_exposed", b.tp_exposed_s},
          {"ep_exposed", b.ep_exposed_s},
          {"cp_exposed", b.cp_exposed_s},
          {"dp_exposed", b.dp_exposed_s},
          {"pp_bubble", b.pp_bubble_s},
          {"optimizer", b.optimizer_s},
          {"ep_jitter", b.ep_jitter_s},
          {"dp_jitter", b.dp_jitter_s},
          {"stragglers", b.straggler_s}}},
        {"memory_per_stage", mem},
        {"stage_busy_s", r.schedule.busy_s},
        {"stage_end_s", r.schedule.end_s},
        {"chunk_layers", r.stage_layers},
        {"max_memory_bytes", r.memory.total_bytes()},
    };
}

}  // namespace moetron::sim
