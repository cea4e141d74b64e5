#include "moetron/sim/ops.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "moetron/core/error.h"

namespace moetron::sim {

namespace {

constexpr std::array<const char*, kNumModules> kModuleNames = {
    "none", "layernorm", "mla_up_proj", "core_attn", "mlp", "moe_act", "shared_expert", "moe"};

// Megatron-LM's FLOPs per MAC of a weight, forward + backward (2 x 3).
constexpr double kMegatronScale = 6;

// Kernel launches of eager framework calls (Megatron-LM + Transformer Engine, late 2025): the
// router after TE's router fusion (31 forward kernels), the dispatch preprocessing of
// DeepEP/HybridEP (17), one cuBLAS call per expert for the multi-stream grouped GEMM, and a
// scale-factor kernel beside each low-precision GEMM. Source: Megatron-LM
// docs/discussions/deepseek-v3-gb200-optimization.md, sec. 2.1-2.2.
constexpr int kRouterForwardKernels = 31;
constexpr int kRouterBackwardKernels = 12;
constexpr int kPreprocessKernels = 17;
constexpr int kLowPrecisionCallsPerExpertGemm = 4;

struct Dims {
    double T = 0, Tf = 0;  // tokens per rank (SP shard) and after the TP all-gather
    double D = 0, h = 0, dq = 0, dn = 0, dr = 0, dv = 0, rq = 0, rkv = 0;
    double E = 0, K = 0, F_expert = 0, F_shared = 0, F_dense = 0, V = 0;
    double E_local = 1, R = 0;  // local experts, expert rows per rank
    double tp = 1, cp = 1, seq = 0, mbs = 1;
    double low = 2;  // bytes of a GEMM operand in the recipe's format
    double act = 2;  // bytes of an activation or activation gradient (high_precision_bytes)
    MathRate recipe = MathRate::bf16;  // the rate of the recipe's GEMMs (math_rate_of)
    MathRate high = MathRate::bf16;    // the GEMMs kept out of low precision (high_precision_rate)
};

// The rates of the quantized GEMM formats, which quantize their inputs and scale their outputs.
bool is_quantized(MathRate rate) {
    return rate == MathRate::fp8 || rate == MathRate::mxfp8 || rate == MathRate::fp4;
}

Dims make_dims(const OpContext& ctx) {
    const ModelConfig& m = *ctx.model;
    const parallel::Layout& l = ctx.layout;
    Dims d;
    d.tp = static_cast<double>(l.tp);
    d.cp = static_cast<double>(l.cp);
    d.seq = static_cast<double>(ctx.seq_len);
    d.mbs = static_cast<double>(ctx.micro_batch);
    d.Tf = d.mbs * d.seq / d.cp;
    d.T = d.Tf / d.tp;
    d.D = static_cast<double>(m.hidden_size);
    d.h = static_cast<double>(m.num_attention_heads) / d.tp;
    d.dn = static_cast<double>(m.qk_nope_head_dim);
    d.dr = static_cast<double>(m.qk_rope_head_dim);
    d.dq = d.dn + d.dr;
    d.dv = static_cast<double>(m.v_head_dim);
    d.rq = static_cast<double>(m.q_lora_rank);
    d.rkv = static_cast<double>(m.kv_lora_rank);
    d.E = static_cast<double>(m.n_routed_experts);
    d.K = static_cast<double>(m.num_experts_per_tok);
    d.F_expert = static_cast<double>(m.moe_intermediate_size);
    d.F_shared = static_cast<double>(m.n_shared_experts * m.moe_intermediate_size);
    d.F_dense = static_cast<double>(m.intermediate_size);
    d.V = static_cast<double>(m.vocab_size);
    // With redundant experts each rank holds (E + R) / ep expert slots, each its own GEMM.
    d.E_local = m.n_routed_experts > 0
                    ? (d.E + static_cast<double>(ctx.settings.redundant_experts)) /
                          static_cast<double>(l.ep)
                    : 1;
    d.R = d.T * d.K;
    d.recipe = math_rate_of(ctx.settings.precision);
    d.low = operand_bytes(d.recipe);
    d.act = high_precision_bytes(ctx.settings.precision);
    d.high = high_precision_rate(ctx.settings.precision);
    return d;
}

// Collects forward ops and, for each, the backward ops that undo it; the backward list is the
// reverse of the groups.
class Builder {
  public:
    Builder(const OpContext& ctx, const Dims& d) : ctx_(ctx), d_(d) {}

    Module module = Module::none;
    bool in_moe = false;
    bool graphable = true;

    Op make(std::string name, OpKind kind) const {
        Op op;
        op.name = std::move(name);
        op.kind = kind;
        op.module = module;
        op.in_moe_block = in_moe;
        op.graphable = graphable;
        return op;
    }

    void forward(Op op) { fwd_.push_back(std::move(op)); }
    Op& last_forward() { return fwd_.back(); }
    void backward(std::vector<Op> ops) { bwd_groups_.push_back(std::move(ops)); }

    // Where an output head starts; fuse_head(mark) then moves the backward groups collected
    // since into the forward list, in the order the backward runs them, and marks the head's
    // ops fused_head: what the engine runs in the forward pass.
    struct Mark {
        size_t forward_ops, backward_groups;
    };
    Mark mark() const { return {fwd_.size(), bwd_groups_.size()}; }
    void fuse_head(Mark m) {
        for (size_t i = m.forward_ops; i < fwd_.size(); ++i) fwd_[i].fused_head = true;
        for (size_t g = bwd_groups_.size(); g-- > m.backward_groups;) {
            for (Op& op : bwd_groups_[g]) {
                op.fused_head = true;
                fwd_.push_back(std::move(op));
            }
        }
        bwd_groups_.resize(m.backward_groups);
    }

    // A memory-bound op with its backward: bwd_bytes = 0 means no backward op.
    void memory(const std::string& name, double fwd_bytes, double bwd_bytes, int kernels_fwd,
                int kernels_bwd, double saved = 0, double saved_always = 0) {
        Op f = make(name, OpKind::memory);
        f.bytes = fwd_bytes;
        f.kernels = kernels_fwd;
        f.saved_bytes = saved;
        f.saved_always_bytes = saved_always;
        forward(f);
        std::vector<Op> b;
        if (bwd_bytes > 0) {
            Op o = make(name + ".bwd", OpKind::memory);
            o.bytes = bwd_bytes;
            o.kernels = kernels_bwd;
            b.push_back(o);
        }
        backward(std::move(b));
    }

    // A split backward's copy of a deferred wgrad's operands (the output gradient, which the
    // next layer's backward overwrites, and the GEMM input, whose activation set B frees) into
    // the stash W reads them from: each read once and written once, two copies.
    Op stash_copy(const std::string& gemm_name, double operand_bytes) const {
        Op o = make(gemm_name + ".wgrad_stash", OpKind::copy);
        o.bytes = 2 * operand_bytes;
        o.kernels = 2;
        o.split_backward_stash = true;
        return o;
    }

    // Low-precision quantization of an (rows x cols) bf16 tensor into row- and column-wise
    // copies (forward and wgrad need both): reads 2 bytes, writes 2 x low bytes per element.
    double quant_bytes(double rows, double cols) const {
        return is_low_precision(ctx_.settings.precision) ? rows * cols * (d_.act + 2 * d_.low) : 0;
    }

    // GEMM out(m x n) = in(m x k) * W(k x n). model_flops_share: the fraction of the executed
    // FLOPs the convention counts (1/tp for duplicated GEMMs, 0 for the router).
    // deferred_weight_gradient: whether a zero-bubble schedule runs the wgrad in W. The engine
    // (kernels/split_backward_backend.h) keeps the router's, the head's and, under TP, MTP's
    // eh_proj's in B; the cluster model prices the schedule the engine runs.
    void gemm(const std::string& name, double m, double n, double k, MathRate rate,
              double model_flops_share, double saved_input, bool deferred_weight_gradient = true) {
        const bool low = is_quantized(rate);
        const double in_b = operand_bytes(rate);
        Op f = make(name, OpKind::gemm);
        f.m = m;
        f.n = n;
        f.k = k;
        f.rate = rate;
        f.flops = 2 * m * n * k;
        f.model_flops = f.flops * model_flops_share;
        f.bytes = (m * k + k * n) * in_b + m * n * d_.act;
        f.kernels = low ? 2 : 1;
        f.saved_bytes = saved_input;
        forward(f);
        std::vector<Op> b;
        if (low) {
            Op q = make(name + ".grad_quant", OpKind::memory);
            q.bytes = quant_bytes(m, n);
            b.push_back(q);
        }
        Op dgrad = f;
        dgrad.name = name + ".dgrad";
        dgrad.m = m;
        dgrad.n = k;
        dgrad.k = n;
        dgrad.bytes = (m * n + n * k) * in_b + m * k * d_.act;
        dgrad.saved_bytes = 0;
        b.push_back(dgrad);
        Op wgrad = f;
        wgrad.name = name + ".wgrad";
        wgrad.m = n;
        wgrad.n = k;
        wgrad.k = m;
        // Accumulates into the fp32 main gradient (read + write).
        wgrad.bytes = (m * n + m * k) * in_b + n * k * 8;
        wgrad.saved_bytes = 0;
        wgrad.weight_gradient = deferred_weight_gradient;
        wgrad.weight_gradient_input_bytes = deferred_weight_gradient ? (m * n + m * k) * in_b : 0;
        if (deferred_weight_gradient)
            b.push_back(stash_copy(name, wgrad.weight_gradient_input_bytes));
        b.push_back(wgrad);
        backward(std::move(b));
    }

    // rows: what the busiest EP rank processes; the convention counts the balanced mean.
    void grouped_gemm(const std::string& name, double rows, double n, double k, double saved) {
        const bool low = is_low_precision(ctx_.settings.precision);
        const double in_b = d_.low;
        const double groups = d_.E_local;
        // Multi-stream cuBLAS: per expert a GEMM call, and in low precision the scale-factor
        // allocation, swizzle and stream-event calls around it.
        const int kernels = static_cast<int>(groups) * (low ? kLowPrecisionCallsPerExpertGemm : 1);
        Op f = make(name, OpKind::grouped_gemm);
        f.m = rows / groups;
        f.n = n;
        f.k = k;
        f.groups = groups;
        f.rate = d_.recipe;
        f.flops = 2 * rows * n * k;
        f.model_flops = 2 * d_.R * n * k;
        f.bytes = rows * k * in_b + groups * k * n * in_b + rows * n * d_.act;
        f.kernels = kernels;
        f.saved_bytes = saved;
        forward(f);
        std::vector<Op> b;
        if (low) {
            Op q = make(name + ".grad_quant", OpKind::memory);
            q.bytes = quant_bytes(rows, n);
            q.kernels = static_cast<int>(groups);
            b.push_back(q);
        }
        Op dgrad = f;
        dgrad.name = name + ".dgrad";
        dgrad.n = k;
        dgrad.k = n;
        dgrad.bytes = rows * n * in_b + groups * k * n * in_b + rows * k * d_.act;
        dgrad.saved_bytes = 0;
        b.push_back(dgrad);
        Op wgrad = f;
        wgrad.name = name + ".wgrad";
        wgrad.bytes = rows * (n + k) * in_b + groups * k * n * 8;
        wgrad.saved_bytes = 0;
        wgrad.weight_gradient = true;
        wgrad.weight_gradient_input_bytes = rows * (n + k) * in_b;
        b.push_back(stash_copy(name, wgrad.weight_gradient_input_bytes));
        b.push_back(wgrad);
        backward(std::move(b));
    }

    // TP all-gather of a (Tf x cols) activation before a column-parallel GEMM. Backward
    // re-gathers the input for wgrad (Megatron keeps only the shard) and reduce-scatters dgrad.
    void tp_all_gather(const std::string& name, double cols) {
        if (ctx_.layout.tp <= 1) return;
        const double bytes = d_.Tf * cols * d_.act;
        const CommCost c = all_gather_cost(*ctx_.cluster, ctx_.placement.tp, bytes);
        Op f = make(name, OpKind::comm_tp);
        f.comm = c;
        f.overlappable = true;
        forward(f);
        Op regather = f;
        regather.name = name + ".regather";
        Op rs = f;
        rs.name = name + ".bwd_rs";
        rs.comm = reduce_scatter_cost(*ctx_.cluster, ctx_.placement.tp, bytes);
        backward({rs, regather});
    }

    // TP reduce-scatter after a row-parallel GEMM; its backward is an all-gather.
    void tp_reduce_scatter(const std::string& name, double cols) {
        if (ctx_.layout.tp <= 1) return;
        const double bytes = d_.Tf * cols * d_.act;
        Op f = make(name, OpKind::comm_tp);
        f.comm = reduce_scatter_cost(*ctx_.cluster, ctx_.placement.tp, bytes);
        f.overlappable = true;
        forward(f);
        Op b = f;
        b.name = name + ".bwd_ag";
        b.comm = all_gather_cost(*ctx_.cluster, ctx_.placement.tp, bytes);
        backward({b});
    }

    BlockOps finish(BlockKind kind) {
        BlockOps out;
        out.kind = kind;
        out.forward = std::move(fwd_);
        for (auto it = bwd_groups_.rbegin(); it != bwd_groups_.rend(); ++it) {
            for (auto& op : *it) out.backward.push_back(std::move(op));
        }
        out.layer_input_bytes = d_.T * d_.D * d_.act;
        return out;
    }

  private:
    const OpContext& ctx_;
    const Dims& d_;
    std::vector<Op> fwd_;
    std::vector<std::vector<Op>> bwd_groups_;
};

void add_norm(Builder& b, const Dims& d, const std::string& name, double rows, double cols,
              bool keep_input) {
    // RMSNorm; in low precision it also writes the row- and column-wise quantized copies the
    // next GEMM needs (fused, as cuDNN's norm+quantize does). Keeps its input for backward and
    // its output (the next GEMM's input) unless layernorm is recomputed.
    const double io = rows * cols * d.act;
    const bool low = d.low < d.act;
    const Module outer = b.module;
    b.module = Module::layernorm;
    b.memory(name, 2 * io + (low ? 2 * rows * cols * d.low : 0), 3 * io, low ? 2 : 1, 1,
             rows * cols * (low ? d.low : d.act), keep_input ? io : 0);
    b.module = outer;
}

void add_residual(Builder& b, const Dims& d, const std::string& name) {
    const double io = d.T * d.D * d.act;
    b.memory(name, 3 * io, 0, 1, 0);
}

void add_attention(Builder& b, const OpContext& ctx, const Dims& d) {
    const ModelConfig& m = *ctx.model;
    const Precision prec = ctx.settings.precision;
    const double low_or_act = is_low_precision(prec) ? d.low : d.act;
    b.graphable = true;
    add_norm(b, d, "attn.norm", d.T, d.D, true);
    b.tp_all_gather("attn.ag", d.D);
    const double q_cols = d.h * d.dq;
    if (m.q_lora_rank > 0) {
        // MLA's down-projections are replicated on every TP rank (small), counted once.
        b.gemm("attn.q_a", d.Tf, d.rq, d.D, d.recipe, 1 / d.tp, 0);
        b.gemm("attn.kv_a", d.Tf, d.rkv + d.dr, d.D, d.recipe, 1 / d.tp, 0);
        b.memory("attn.q_kv_norm",
                 2 * d.Tf * (d.rq + d.rkv) * d.act + b.quant_bytes(d.Tf, d.rq + d.rkv),
                 3 * d.Tf * (d.rq + d.rkv) * d.act, 2, 2, d.Tf * (d.rq + d.rkv) * low_or_act,
                 d.Tf * (d.rq + d.rkv + d.dr) * d.act);
        // The convention counts the two latent norms as one MAC per element ("+ 1" terms),
        // fwd + bwd; replicated over TP like the down-projections.
        b.last_forward().model_flops = kMegatronScale * (d.rq + d.rkv) * d.T;
        b.module = Module::mla_up_proj;
        b.gemm("attn.q_b", d.Tf, q_cols, d.rq, d.recipe, 1, 0);
    } else {
        b.gemm("attn.kv_a", d.Tf, d.rkv + d.dr, d.D, d.recipe, 1 / d.tp, 0);
        b.memory("attn.kv_norm", 2 * d.Tf * d.rkv * d.act + b.quant_bytes(d.Tf, d.rkv),
                 3 * d.Tf * d.rkv * d.act, 2, 2, d.Tf * d.rkv * low_or_act,
                 d.Tf * (d.rkv + d.dr) * d.act);
        b.last_forward().model_flops = kMegatronScale * d.rkv * d.T;
        b.module = Module::mla_up_proj;
        b.gemm("attn.q", d.Tf, q_cols, d.D, d.recipe, 1, 0);
    }
    b.gemm("attn.kv_b", d.Tf, d.h * (d.dn + d.dv), d.rkv, d.recipe, 1, 0);
    // RoPE and the q/k/v layout for the attention kernel; q, k, v are kept for its backward.
    const double qkv = d.Tf * d.h * (2 * d.dq + d.dv) * d.act;
    b.memory("attn.rope", d.Tf * d.h * (d.dq + d.dn + d.dv) * d.act + qkv, 2 * qkv, 2, 2, qkv);
    b.module = Module::core_attn;
    {
        Op f = b.make("attn.core", OpKind::attention);
        const double causal_pairs = d.mbs * d.seq * d.seq / 2 / d.cp;  // per head
        f.flops = 2 * causal_pairs * d.h * (d.dq + d.dv);
        f.model_flops = f.flops;
        f.exps = causal_pairs * d.h;
        f.work_per_query = d.seq / d.cp * (d.dq + d.dv);
        f.bytes = qkv + d.Tf * d.h * d.dv * d.act;
        f.kernels = 4;
        f.saved_bytes = d.Tf * d.h * (d.dv * d.act + 4);  // output and log-sum-exp
        b.forward(f);
        Op bw = f;
        bw.name = "attn.core.bwd";
        bw.attention_backward = true;
        bw.flops = 2.5 * f.flops;  // recomputes QK^T: 5 matmuls to the forward's 2
        bw.model_flops = 2 * f.model_flops;
        bw.bytes = qkv + 2 * d.Tf * d.h * d.dv * d.act + qkv;
        bw.saved_bytes = 0;
        b.backward({bw});
    }
    if (ctx.layout.cp > 1) {
        // Ring exchange of K and V chunks, hidden behind the attention core when it is shorter.
        Op f = b.make("attn.cp_kv", OpKind::comm_cp);
        const double kv_bytes = d.Tf * d.h * (d.dq + d.dv) * d.act;
        CommCost step = send_recv_cost(*ctx.cluster, ctx.placement.cp.domains > 1, kv_bytes);
        step.time_s *= static_cast<double>(ctx.layout.cp - 1);
        f.comm = step;
        f.overlappable = true;
        b.forward(f);
        Op bw = f;
        bw.name = "attn.cp_kv.bwd";
        bw.comm.time_s *= 2;  // K/V forward and their gradients back
        b.backward({bw});
    }
    b.module = Module::none;
    b.memory("attn.o_quant", b.quant_bytes(d.Tf, d.h * d.dv), 0, 1, 0,
             is_low_precision(prec) ? d.Tf * d.h * d.dv * d.low : 0);
    b.gemm("attn.o_proj", d.Tf, d.D, d.h * d.dv, d.recipe, 1, 0);
    b.tp_reduce_scatter("attn.rs", d.D);
    add_residual(b, d, "attn.residual");
}

// SwiGLU MLP on `rows` rows (TP-split columns for dense and shared experts).
void add_mlp(Builder& b, const OpContext& ctx, const Dims& d, const std::string& prefix,
             double ffn) {
    const Precision prec = ctx.settings.precision;
    const double low_or_act = is_low_precision(prec) ? d.low : d.act;
    const double cols = ffn / d.tp;
    b.tp_all_gather(prefix + ".ag", d.D);
    // fc1's input is kept by the norm before it.
    b.gemm(prefix + ".fc1", d.Tf, 2 * cols, d.D, d.recipe, 1, 0);
    b.memory(prefix + ".act", d.Tf * 3 * cols * d.act + b.quant_bytes(d.Tf, cols),
             d.Tf * 5 * cols * d.act, is_low_precision(prec) ? 2 : 1, 1, d.Tf * cols * low_or_act,
             d.Tf * 2 * cols * d.act);
    b.gemm(prefix + ".fc2", d.Tf, d.D, cols, d.recipe, 1, 0);
    b.tp_reduce_scatter(prefix + ".rs", d.D);
}

// Bytes per element of a low-precision recipe's dispatch payload: the engine's definition for the
// FP8 recipes (parallel/dispatch_traffic.h); nvfp4, which the engine lacks, keeps its estimate
// (one scale byte per 32 bytes of elements).
double dispatch_payload_bytes(Precision recipe, double low_bytes) {
    switch (recipe) {
        case Precision::mxfp8:
        case Precision::fp8_blockwise:
            return parallel::payload_bytes_per_element(recipe);
        case Precision::fp32:
        case Precision::bf16:
        case Precision::nvfp4:
            break;
    }
    return low_bytes * (1 + 1.0 / 32);
}

void add_moe(Builder& b, const OpContext& ctx, const Dims& d) {
    const ModelConfig& m = *ctx.model;
    const Precision prec = ctx.settings.precision;
    const bool low = is_low_precision(prec);
    const double low_or_act = low ? d.low : d.act;
    const bool two_tier = ctx.settings.dispatcher == parallel::DispatchKind::two_tier;
    const double payload =
        ctx.settings.dispatch_in_recipe && low ? dispatch_payload_bytes(prec, d.low) : d.act;
    RoutingShape routing;
    routing.num_experts = m.n_routed_experts;
    routing.num_groups = m.n_group;
    routing.topk_group = m.topk_group;
    routing.topk = m.num_experts_per_tok;
    routing.ep = ctx.layout.ep;
    routing.ep_ranks_per_domain = ctx.placement.ep.ranks_per_domain;
    const ClusterSpec& c = *ctx.cluster;
    const GroupPlacement& epg = ctx.placement.ep;
    const parallel::DispatchFanout fanout =
        epg.size > 1 ? expected_dispatch_fanout(routing) : parallel::DispatchFanout{};

    add_norm(b, d, "moe.norm", d.T, d.D, true);
    b.in_moe = true;
    b.module = Module::none;
    // Router: fp32 GEMM (Megatron's --moe-router-dtype fp32, on TF32 tensor cores), not counted
    // by the convention.
    b.gemm("moe.router", d.T, d.E, d.D, MathRate::tf32, 0, 0, /*deferred_weight_gradient=*/false);
    b.memory("moe.router_ops", 12 * d.T * d.E * 4, 8 * d.T * d.E * 4, kRouterForwardKernels,
             kRouterBackwardKernels, 0, 3 * d.T * d.E * 4);
    b.memory("moe.preprocess", 4 * d.T * d.E * 4, 0, kPreprocessKernels, 0);
    if (!ctx.settings.cuda_graph_moe_sync_free) {
        Op s = b.make("moe.sync", OpKind::sync);
        s.kernels = 0;
        b.forward(s);
        b.backward({});
    }
    b.graphable = false;  // routed experts: shapes depend on routing
    // Uniform random routing (the published runs force balance with random router scores)
    // leaves multinomial noise: rows per rank have mean R and standard deviation ~sqrt(R), and
    // every rank waits for the busiest of ep at the next all-to-all, about
    // R + sqrt(2 ln ep) sqrt(R) (the expected maximum of ep Gaussians). On top of that noise,
    // skewed expert loads send the busiest rank expert_load_imbalance times the mean.
    const double ep = static_cast<double>(ctx.layout.ep);
    const double noise = ep > 1 ? 1 + std::sqrt(2 * std::log(ep) / d.R) : 1.0;
    const double imbalance = noise * ctx.settings.expert_load_imbalance;
    const double rows = d.R * imbalance;
    if (!two_tier) {
        // A plain all-to-all needs the K copies laid out per destination first.
        b.memory("moe.permute_global", d.T * d.D * d.act + rows * d.D * payload,
                 2 * rows * d.D * d.act, 2, 2);
    }
    {
        Op f = b.make("moe.dispatch", OpKind::comm_ep);
        f.comm = moe_dispatch_cost(c, epg, fanout, ctx.settings.dispatcher, d.T * imbalance,
                                   d.D * payload);
        f.kernels = 3;
        b.forward(f);
        Op bw = b.make("moe.dispatch.bwd", OpKind::comm_ep);  // a combine of bf16 gradients
        bw.comm = moe_dispatch_cost(c, epg, fanout, ctx.settings.dispatcher, d.T * imbalance,
                                    d.D * d.act);
        bw.kernels = 3;
        b.backward({bw});
    }
    b.memory("moe.permute", 2 * rows * d.D * payload, 2 * rows * d.D * d.act, 2, 2);
    if (low && payload >= d.act) {
        b.memory("moe.fc1_quant", b.quant_bytes(rows, d.D), 0, static_cast<int>(d.E_local), 0);
    }
    b.grouped_gemm("moe.fc1", rows, 2 * d.F_expert, d.D, rows * d.D * low_or_act);
    // fc1's output is what the activation's backward (or its recompute) needs.
    const bool cache_low = low && ctx.settings.low_precision_swiglu_input;
    b.last_forward().saved_always_bytes = rows * 2 * d.F_expert * (cache_low ? d.low : d.act);
    if (cache_low) b.last_forward().bytes += rows * 2 * d.F_expert * d.low;  // the cached copy
    b.module = Module::moe_act;
    b.memory("moe.act", rows * 3 * d.F_expert * d.act + b.quant_bytes(rows, d.F_expert),
             rows * 5 * d.F_expert * d.act, low ? 2 : 1, 1, rows * d.F_expert * low_or_act, 0);
    b.module = Module::none;
    b.grouped_gemm("moe.fc2", rows, d.D, d.F_expert, 0);
    b.memory("moe.unpermute", 2 * rows * d.D * d.act, 2 * rows * d.D * d.act, 2, 2, 0, rows * 4);
    {
        Op f = b.make("moe.combine", OpKind::comm_ep);
        f.comm = moe_dispatch_cost(c, epg, fanout, ctx.settings.dispatcher, d.T * imbalance,
                                   d.D * d.act);
        f.kernels = 3;
        b.forward(f);
        Op bw = b.make("moe.combine.bwd", OpKind::comm_ep);  // a dispatch of gradients
        bw.comm = f.comm;
        bw.kernels = 3;
        b.backward({bw});
    }
    if (!two_tier) {
        b.memory("moe.unpermute_global", rows * d.D * d.act + d.T * d.D * d.act,
                 rows * d.D * d.act + d.T * d.D * d.act, 2, 2);
    }
    b.graphable = true;
    b.in_moe = false;
    if (m.n_shared_experts > 0) {
        b.module = Module::shared_expert;
        add_mlp(b, ctx, d, "moe.shared", d.F_shared);
        b.module = Module::none;
    }
    add_residual(b, d, "moe.residual");
}

// The engine computes the head's backward right after its loss, in the forward pass of the
// micro-batch (model_passes.cpp, head_loss), and prices it there.
void add_output_head(Builder& b, const Dims& d, const std::string& prefix) {
    const Builder::Mark mark = b.mark();
    add_norm(b, d, prefix + ".final_norm", d.T, d.D, true);
    b.tp_all_gather(prefix + ".ag", d.D);
    // The LM head stays in the high precision (bf16) in the low-precision recipes.
    b.gemm(prefix + ".logits", d.Tf, d.V / d.tp, d.D, d.high, 1, 0,
           /*deferred_weight_gradient=*/false);
    // Fused vocab-parallel cross-entropy: reads the logits twice, writes their gradient.
    const double logits = d.Tf * d.V / d.tp * d.act;
    b.memory(prefix + ".cross_entropy", 2 * logits, 2 * logits, 3, 2, 0, 0);
    b.fuse_head(mark);
}

}  // namespace

Recompute parse_recompute(const std::string& text) {
    Recompute r;
    if (text.empty() || text == "none") return r;
    if (text == "full") {
        r.full = true;
        return r;
    }
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        bool found = false;
        for (int i = 1; i < kNumModules; ++i) {
            if (item == kModuleNames[i]) {
                r.modules[i] = true;
                found = true;
            }
        }
        MT_CHECK(found,
                 "[sim] unknown recompute module '{}' (known: none, full, layernorm, mla_up_proj, "
                 "core_attn, mlp, moe_act, shared_expert, moe)",
                 item);
    }
    return r;
}

std::string recompute_name(const Recompute& r) {
    if (r.full) return "full";
    std::string out;
    for (int i = 1; i < kNumModules; ++i) {
        if (r.modules[i]) out += fmt::format("{}{}", out.empty() ? "" : ",", kModuleNames[i]);
    }
    return out.empty() ? "none" : out;
}

BlockOps build_block_ops(const OpContext& ctx, BlockKind kind) {
    MT_CHECK(ctx.model != nullptr && ctx.cluster != nullptr, "[sim] op context is incomplete");
    const Dims d = make_dims(ctx);
    Builder b(ctx, d);
    switch (kind) {
        case BlockKind::dense_layer:
            add_attention(b, ctx, d);
            add_norm(b, d, "mlp.norm", d.T, d.D, true);
            b.module = Module::mlp;
            add_mlp(b, ctx, d, "mlp", d.F_dense);
            b.module = Module::none;
            add_residual(b, d, "mlp.residual");
            break;
        case BlockKind::moe_layer:
            add_attention(b, ctx, d);
            add_moe(b, ctx, d);
            break;
        case BlockKind::embedding: {
            // Lookup (vocab-parallel), reduce-scatter into the sequence-parallel shard.
            b.memory("embed.lookup", 2 * d.Tf * d.D * d.act, 3 * d.Tf * d.D * d.act, 2, 2);
            b.tp_reduce_scatter("embed.rs", d.D);
            break;
        }
        case BlockKind::output_head:
            add_output_head(b, d, "head");
            break;
        case BlockKind::mtp_extra: {
            // One MTP depth besides its transformer block: norms of the hidden state and of the
            // next token's embedding, the 2D -> D projection, and its own pass through the head.
            b.memory("mtp.embed", 2 * d.Tf * d.D * d.act, 3 * d.Tf * d.D * d.act, 2, 2);
            add_norm(b, d, "mtp.norms", d.T, 2 * d.D, true);
            // The convention's "eh norm + final norm" term: 3 D MACs per token, fwd + bwd.
            b.last_forward().model_flops = kMegatronScale * 3 * d.D * d.T;
            b.tp_all_gather("mtp.ag", 2 * d.D);
            b.gemm("mtp.eh_proj", d.Tf, d.D / d.tp, 2 * d.D, d.recipe, 1, d.T * 2 * d.D * d.act,
                   /*deferred_weight_gradient=*/d.tp == 1);
            b.tp_all_gather("mtp.eh_gather", d.D);
            add_output_head(b, d, "mtp.head");
            break;
        }
    }
    return b.finish(kind);
}

RecomputedBlock apply_recompute(const BlockOps& block, const Recompute& rc,
                                const Recompute& offload) {
    MT_CHECK(!offload.full, "[sim] activation offloading takes modules, not 'full'");
    RecomputedBlock out;
    std::vector<Op> rerun;
    for (const Op& op : block.forward) {
        if (op.fused_head) {
            // Its backward has run: nothing to rerun. The engine's activation set holds the
            // head's buffers all the same (model_impl.h, HeadScratch), so they stay counted.
            out.saved_bytes += op.saved_bytes + op.saved_always_bytes;
            continue;
        }
        // Its own module rerun keeps the module's inputs (saved_always_bytes); a rerun of an
        // enclosing region (the whole MoE part, or the whole layer) drops them too.
        const bool own = op.module != Module::none && rc.has(op.module);
        const bool enclosing = rc.full || (op.in_moe_block && rc.has(Module::moe));
        const bool offloaded = (op.module != Module::none && offload.has(op.module)) ||
                               (op.in_moe_block && offload.has(Module::moe));
        double& kept = offloaded ? out.offloaded_bytes : out.saved_bytes;
        if (own || enclosing) {
            Op r = op;
            r.is_recompute = true;
            r.name += ".recompute";
            r.saved_bytes = 0;
            r.saved_always_bytes = 0;
            rerun.push_back(std::move(r));
        } else {
            kept += op.saved_bytes;
        }
        if (!enclosing) kept += op.saved_always_bytes;
    }
    if (rc.full) {
        out.saved_bytes = block.layer_input_bytes;
        out.offloaded_bytes = 0;
    }
    out.backward = std::move(rerun);
    out.backward.insert(out.backward.end(), block.backward.begin(), block.backward.end());
    for (const Op& op : block.backward)
        out.weight_gradient_input_bytes += op.weight_gradient_input_bytes;
    return out;
}

}  // namespace moetron::sim
