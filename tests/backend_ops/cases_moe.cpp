// The op-parity cases of the MoE's ops (cases.h): routing and token permutation, the expert
// dispatch's row movements and layouts, and the model's own ops.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend_ops/cases.h"
#include "backend_ops/registry.h"

namespace moetron::backend_ops {

// ---- routing and token permutation ----

void register_routing(Registry& r) {
    struct RouterCase {
        RouterShape shape;
        bool bias, dscores_extra;
    };
    for (const RouterCase& c : {RouterCase{{5, 8, 2, 4, 2, 2.5f, true}, true, true},
                                {{7, 6, 3, 1, 1, 1.0f, false}, false, false},
                                {{64, 64, 6, 8, 4, 2.5f, true}, true, true},
                                {{0, 8, 2, 4, 2, 1.0f, true}, true, false}}) {
        const RouterShape s = c.shape;
        const int64_t picks = s.num_tokens * s.top_k, scores = s.num_tokens * s.num_experts;
        TensorSpec scores_out = output("scores", scores);
        if (c.dscores_extra) scores_out = scores_out.weighted_by("dscores");
        // Logits 0.4 apart and a bias too small to reorder them: selection is piecewise
        // constant, and no finite-difference step may change a choice.
        r.add("router", fmt::format("N={} E={} K={} G={} groups={} bias={:d} dscores={:d}",
                                    s.num_tokens, s.num_experts, s.top_k, s.num_groups,
                                    s.topk_groups, c.bias, c.dscores_extra))
            .tensors({input("logits", scores, levels_per_row(s.num_experts, 0.4)),
                      input("bias", s.num_experts, levels_per_row(s.num_experts, 1e-3)),
                      output("topk_ids", picks, DType::i32),
                      output("topk_weights", picks).weighted_by("dtopk"), scores_out,
                      probe("dtopk", picks), probe("dscores", scores),
                      grad("dlogits", scores).of("logits")})
            .forward("router_forward",
                     [=](Backend& b, const Args& a) {
                         b.router_forward(a.i32("topk_ids"), a.f32("topk_weights"), a.f32("scores"),
                                          a.f32("logits"), c.bias ? a.f32("bias") : nullptr, s);
                     })
            .backward("router_backward", [=](Backend& b, const Args& a) {
                b.router_backward(a.f32("dlogits"), a.f32("dtopk"),
                                  c.dscores_extra ? a.f32("dscores") : nullptr, a.f32("scores"),
                                  a.i32("topk_ids"), s);
            });
    }

    struct PermuteShape {
        int64_t tokens, top_k, experts, dim;
    };
    for (const PermuteShape s :
         {PermuteShape{6, 2, 5, 3}, {1, 1, 1, 1}, {100, 4, 16, 32}, {0, 2, 3, 4}}) {
        const int64_t copies = s.tokens * s.top_k;
        const std::string shape =
            fmt::format("N={} K={} E={} D={}", s.tokens, s.top_k, s.experts, s.dim);
        r.add("moe_permute_layout", shape)
            .tensors({input_i32("topk_ids", copies, distinct_ids_per_row(s.top_k, s.experts)),
                      output("copy_to_row", copies, DType::i32),
                      output("expert_offsets", s.experts + 1, DType::i64)})
            .forward("moe_permute_layout", [=](Backend& b, const Args& a) {
                b.moe_permute_layout(a.i32("copy_to_row"), a.i64("expert_offsets"),
                                     a.i32("topk_ids"), s.tokens, s.top_k, s.experts);
            });
        r.add("permute", shape)
            .tensors({input("inp", s.tokens * s.dim),
                      input_i32("copy_to_row", copies, permutation()),
                      output("out", copies * s.dim).weighted_by("dout"),
                      probe("dout", copies * s.dim), grad("dinp", s.tokens * s.dim).of("inp")})
            .forward("permute_forward",
                     [=](Backend& b, const Args& a) {
                         b.permute_forward(a.f32("out"), a.f32("inp"), a.i32("copy_to_row"),
                                           s.tokens, s.top_k, s.dim);
                     })
            .backward("permute_backward", [=](Backend& b, const Args& a) {
                b.permute_backward(a.f32("dinp"), a.f32("dout"), a.i32("copy_to_row"), s.tokens,
                                   s.top_k, s.dim);
            });
        r.add("unpermute", shape)
            .tensors({input("inp", copies * s.dim), input("weights", copies),
                      input_i32("copy_to_row", copies, permutation()),
                      output("out", s.tokens * s.dim).weighted_by("dout"),
                      probe("dout", s.tokens * s.dim), grad("dinp", copies * s.dim).of("inp"),
                      grad("dweights", copies).of("weights")})
            .forward("unpermute_forward",
                     [=](Backend& b, const Args& a) {
                         b.unpermute_forward(a.f32("out"), a.f32("inp"), a.f32("weights"),
                                             a.i32("copy_to_row"), s.tokens, s.top_k, s.dim);
                     })
            .backward("unpermute_backward", [=](Backend& b, const Args& a) {
                b.unpermute_backward(a.f32("dinp"), a.f32("dweights"), a.f32("dout"), a.f32("inp"),
                                     a.f32("weights"), a.i32("copy_to_row"), s.tokens, s.top_k,
                                     s.dim);
            });
    }
}

// ---- dispatch ----

// Route records (source, K ids, K weight bits) of fixed routings, K = 2; the weights 0.5, 0.25,
// -1.5 and 2.0 as their float bits.
namespace {
constexpr double kHalf = 1056964608, kQuarter = 1048576000, kMinus1p5 = -1077936128,
                 kTwo = 1073741824;
}  // namespace

void register_dispatch(Registry& r) {
    // A hop of 4 input rows: rows 0..3 own slots {0, 1}, {2}, {3, 4}, {5}; slots 4 and 5 are this
    // rank's own (they land in recv rows 0 and 1), slots 0..3 rows of send. Every row is written.
    for (int64_t width : {int64_t{3}, int64_t{70}}) {
        const SlotPlacement own{4, 2, 0};
        r.add("dispatch_fan", fmt::format("rows=4 slots=6 width={}", width))
            .tensors({input("input", 4 * width),
                      input_i32("slot_begin", 5, values({0, 2, 3, 5, 6})),
                      input_i32("row_slots", 6, values({3, 0, 2, 1, 4, 5})),
                      output("send", 4 * width).weighted_by("dsend"),
                      output("recv", 2 * width).weighted_by("drecv"), probe("dsend", 4 * width),
                      probe("drecv", 2 * width), grad("dinput", 4 * width).of("input")})
            .forward("dispatch_fan_out",
                     [=](Backend& b, const Args& a) {
                         b.dispatch_fan_out(a.f32("send"), a.f32("recv"), a.f32("input"),
                                            a.i32("slot_begin"), a.i32("row_slots"), 4,
                                            width * static_cast<int64_t>(sizeof(float)), own);
                     })
            .backward("dispatch_fan_in", [=](Backend& b, const Args& a) {
                b.dispatch_fan_in(a.f32("dinput"), a.f32("dsend"), a.f32("drecv"),
                                  a.i32("slot_begin"), a.i32("row_slots"), 4, width, own, false);
            });
    }
    // 4 staging rows with 2, 1, 0 and 2 copies on 5 expert rows.
    for (bool weighted : {true, false}) {
        const int64_t D = 4;
        r.add("dispatch_expand", fmt::format("staging=4 copies=5 D={} weighted={:d}", D, weighted))
            .tensors({input("staging", 4 * D), input("copy_weight", 5),
                      input_i32("copy_begin", 5, values({0, 2, 3, 3, 5})),
                      input_i32("copy_row", 5, values({3, 0, 4, 1, 2})),
                      output("expert_rows", 5 * D).weighted_by("dexpert"), probe("dexpert", 5 * D),
                      grad("dstaging", 4 * D).of("staging")})
            .forward("dispatch_expand",
                     [=](Backend& b, const Args& a) {
                         b.dispatch_expand(a.f32("expert_rows"), a.f32("staging"),
                                           a.i32("copy_begin"), a.i32("copy_row"),
                                           weighted ? a.f32("copy_weight") : nullptr, 4, D);
                     })
            .backward("dispatch_reduce", [=](Backend& b, const Args& a) {
                b.dispatch_reduce(a.f32("dstaging"), a.f32("dexpert"), a.i32("copy_begin"),
                                  a.i32("copy_row"), weighted ? a.f32("copy_weight") : nullptr, 4,
                                  D);
            });
    }
    r.add("dispatch_weight_grads", "staging=4 copies=5 K=2 D=6")
        .tensors({input("dout", 4 * 6), input("expert_out", 5 * 6),
                  input_i32("copy_begin", 5, values({0, 2, 3, 3, 5})),
                  input_i32("copy_row", 5, values({3, 0, 4, 1, 2})),
                  input_i32("copy_choice", 5, values({1, 0, 0, 0, 1})), output("dweights", 4 * 2)})
        .forward("dispatch_weight_grads", [](Backend& b, const Args& a) {
            b.dispatch_weight_grads(a.f32("dweights"), a.f32("dout"), a.f32("expert_out"),
                                    a.i32("copy_begin"), a.i32("copy_row"), a.i32("copy_choice"), 4,
                                    2, 6);
        });
    for (bool weighted : {true, false}) {
        r.add("unpermute_add", fmt::format("N=3 K=2 D=67 weighted={:d}", weighted))
            .tensors({inout("out", 3 * 67), input("inp", 6 * 67), input("weights", 6),
                      input_i32("copy_to_row", 6, permutation())})
            .forward("unpermute_add", [=](Backend& b, const Args& a) {
                b.unpermute_add(a.f32("out"), a.f32("inp"), weighted ? a.f32("weights") : nullptr,
                                a.i32("copy_to_row"), 3, 2, 67);
            });
    }

    // Routing metadata: 6 tokens, K = 2, E = 4 experts of one per rank, 2 ranks per domain.
    const std::vector<double> ids = {0, 1, 0, 2, 0, 3, 1, 2, 3, 0, 1, 2};
    r.add("dispatch_route_records", "N=6 K=2 E=4")
        .tensors({input_i32("topk_ids", 12, values(ids)), input("topk_weights", 12),
                  output("records", 6 * 5, DType::i32)})
        .forward("dispatch_route_records", [](Backend& b, const Args& a) {
            b.dispatch_route_records(a.i32("records"), a.i32("topk_ids"), a.f32("topk_weights"), 6,
                                     2, 4, 3);
        });
    r.add("dispatch_layout", "N=6 K=2 El=1 L=2 ranks=4")
        .tensors({input_i32("topk_ids", 12, values(ids)), output("copies_per_rank", 4, DType::i64),
                  host_result("rank_sum"), host_result("rank_max"), host_result("domain_sum"),
                  host_result("domain_max")})
        .forward("dispatch_layout", [](Backend& b, const Args& a) {
            const RoutingSpread s =
                b.dispatch_layout(a.i64("copies_per_rank"), a.i32("topk_ids"), 6, 2, 1, 2, 4);
            a.result("rank_sum") = static_cast<double>(s.rank_sum);
            a.result("rank_max") = static_cast<double>(s.rank_max);
            a.result("domain_sum") = static_cast<double>(s.domain_sum);
            a.result("domain_max") = static_cast<double>(s.domain_max);
        });
    // Budget 2 copies per rank: tokens [0, 2) and [2, 6).
    r.add("dispatch_split_rounds", "N=6 K=2 El=1 ranks=4 budget=2")
        .tensors({input_i32("topk_ids", 12, values(ids)), output("ends", 2, DType::i64),
                  output("copies_per_rank", 4, DType::i64), host_result("rounds")})
        .forward("dispatch_split_rounds", [](Backend& b, const Args& a) {
            a.result("rounds") = static_cast<double>(b.dispatch_split_rounds(
                a.i64("ends"), a.i64("copies_per_rank"), a.i32("topk_ids"), 6, 2, 1, 4, 2));
        });
    // Rows with experts {1, 5}, {2, 3}, {7, 0}, {4, 6} over 4 peers of 2 experts: peers {0, 2},
    // {1}, {0, 3}, {2, 3}: 7 slots.
    r.add("dispatch_hop_layout", "rows=4 K=2 peers=4")
        .tensors(
            {input_i32("records", 20, values({0, 1, 5, kHalf, kQuarter,  0, 2, 3, kHalf,    kHalf,
                                              1, 7, 0, kTwo,  kMinus1p5, 1, 4, 6, kQuarter, kTwo})),
             output("slot_begin", 5, DType::i32), output("row_slots", 7, DType::i32),
             output("rows_per_peer", 4, DType::i32), output("first_slot_of_peer", 4, DType::i32)})
        .forward("dispatch_hop_layout", [](Backend& b, const Args& a) {
            b.dispatch_hop_layout(a.i32("slot_begin"), a.i32("row_slots"), a.i32("rows_per_peer"),
                                  a.i32("first_slot_of_peer"), a.i32("records"), 4, 2, 0, 8, 2, 4);
        });
    // Staging rows from sources 0, 1, 0, 1 with experts {2, 5}, {3, 2}, {0, 1}, {3, 4}; this rank
    // owns experts 2 and 3: 4 copies.
    r.add("dispatch_expert_layout", "staging=4 K=2 El=2 sources=2")
        .tensors({input_i32("records", 20,
                            values({0, 2, 5, kHalf, kQuarter, 1, 3, 2, kTwo,     kMinus1p5,
                                    0, 0, 1, kHalf, kHalf,    1, 3, 4, kQuarter, kTwo})),
                  output("expert_offsets", 3, DType::i64), output("copy_begin", 5, DType::i32),
                  output("copy_row", 4, DType::i32), output("copy_choice", 4, DType::i32),
                  output("copy_weight", 4), output("rows_by_source", 4, DType::i64),
                  host_result("rows")})
        .forward("dispatch_expert_layout", [](Backend& b, const Args& a) {
            a.result("rows") = static_cast<double>(b.dispatch_expert_layout(
                a.i64("expert_offsets"), a.i32("copy_begin"), a.i32("copy_row"),
                a.i32("copy_choice"), a.f32("copy_weight"), a.i64("rows_by_source"),
                a.i32("records"), 4, 2, 2, 2, 2, 10));
        });
}

// ---- model ops ----

namespace {

// A spec of another dtype than its maker's default (an int64 inout, a double input).
TensorSpec with_dtype(TensorSpec spec, DType dtype) {
    spec.dtype = dtype;
    return spec;
}

}  // namespace

void register_model_ops(Registry& r) {
    struct MlaKvShape {
        int64_t tokens, heads, nope, rope, v;
    };
    for (const MlaKvShape s : {MlaKvShape{3, 2, 4, 3, 5}, {40, 8, 16, 8, 16}, {0, 2, 4, 3, 5}}) {
        const int64_t n = s.tokens, h = s.heads, qk = s.nope + s.rope, kv = s.nope + s.v;
        r.add("mla_kv", fmt::format("N={} H={} nope={} R={} Dv={}", n, h, s.nope, s.rope, s.v))
            .tensors({input("kv", n * h * kv), input("k_rope", n * s.rope),
                      output("k", n * h * qk).weighted_by("dk"),
                      output("v", n * h * s.v).weighted_by("dv"), probe("dk", n * h * qk),
                      probe("dv", n * h * s.v), grad("d_kv", n * h * kv).of("kv"),
                      grad("d_k_rope", n * s.rope).of("k_rope")})
            .forward("mla_kv_forward",
                     [=](Backend& b, const Args& a) {
                         b.mla_kv_forward(a.f32("k"), a.f32("v"), a.f32("kv"), a.f32("k_rope"), n,
                                          h, s.nope, s.rope, s.v);
                     })
            .backward("mla_kv_backward", [=](Backend& b, const Args& a) {
                b.mla_kv_backward(a.f32("d_kv"), a.f32("d_k_rope"), a.f32("dk"), a.f32("dv"), n, h,
                                  s.nope, s.rope, s.v);
            });
    }

    struct RowsShape {
        int64_t rows, width, dst_stride, src_stride;
    };
    for (const RowsShape s :
         {RowsShape{5, 3, 6, 3}, {5, 3, 3, 6}, {300, 64, 128, 64}, {0, 3, 6, 3}}) {
        r.add("copy_rows_strided", fmt::format("rows={} width={} dst_stride={} src_stride={}",
                                               s.rows, s.width, s.dst_stride, s.src_stride))
            .tensors({input("src", s.rows * s.src_stride), inout("dst", s.rows * s.dst_stride)})
            .forward("copy_rows_strided", [=](Backend& b, const Args& a) {
                b.copy_rows_strided(a.f32("dst"), a.f32("src"), s.rows, s.width, s.dst_stride,
                                    s.src_stride);
            });
    }
    for (const int64_t shift : {0, 1, 3}) {
        for (const int64_t batch : {int64_t{0}, int64_t{3}}) {
            const int64_t seq = 7;
            r.add("shift_sequences", fmt::format("B={} S={} shift={}", batch, seq, shift))
                .tensors({input_i32("inp", batch * seq, ids_below(50)),
                          output("out", batch * seq, DType::i32)})
                .forward("shift_sequences", [=](Backend& b, const Args& a) {
                    b.shift_sequences(a.i32("out"), a.i32("inp"), batch, seq, shift, -1);
                });
        }
    }

    // The balance loss: its sum over sequences goes to the host, and (as a one-element output
    // weighted by loss_grad / B) into the finite-difference loss that checks the backward.
    constexpr float kBalanceGrad = 0.75f;
    struct BalanceShape {
        int64_t batch, seq, experts, top_k;
    };
    for (const BalanceShape s : {BalanceShape{2, 5, 6, 2}, {4, 64, 32, 4}, {0, 5, 6, 2}}) {
        const int64_t n = s.batch * s.seq, e = s.experts;
        const double weight = s.batch > 0 ? kBalanceGrad / static_cast<double>(s.batch) : 0.0;
        r.add("balance_loss", fmt::format("B={} S={} E={} K={}", s.batch, s.seq, e, s.top_k))
            .tensors({input_i32("topk_ids", n * s.top_k, distinct_ids_per_row(s.top_k, e)),
                      input("scores", n * e, uniform(0.2, 0.9)),
                      output("load_fraction", s.batch * e), host_result("loss_sum"),
                      output("loss", 1, DType::f64).weighted_by("dloss"),
                      probe("dloss", 1, constant(weight)), grad("d_scores", n * e).of("scores")})
            .forward("balance_loss_forward",
                     [=](Backend& b, const Args& a) {
                         const double loss =
                             b.balance_loss_forward(a.f32("load_fraction"), a.i32("topk_ids"),
                                                    a.f32("scores"), s.batch, s.seq, e, s.top_k);
                         a.result("loss_sum") = loss;
                         b.copy_from_host(a.f64("loss"), &loss, sizeof loss);
                     })
            .backward("balance_loss_backward",
                      [=](Backend& b, const Args& a) {
                          b.balance_loss_backward(a.f32("d_scores"), a.f32("scores"),
                                                  a.f32("load_fraction"), s.batch, s.seq, e,
                                                  kBalanceGrad);
                      })
            .parity_tolerance(1e-6);  // the loss sums in double, the order per backend
    }

    for (const int64_t ids : {int64_t{0}, int64_t{12}, int64_t{4000}}) {
        r.add("count_expert_load", fmt::format("ids={} E=8", ids))
            .tensors({input_i32("topk_ids", ids, ids_below(8)),
                      with_dtype(inout("counts", 8, ids_below(100)), DType::i64)})
            .forward("count_expert_load", [=](Backend& b, const Args& a) {
                b.count_expert_load(a.i64("counts"), a.i32("topk_ids"), ids, 8);
            });
    }
    for (const int64_t e : {int64_t{1}, int64_t{8}, int64_t{256}}) {
        r.add("router_bias_update", fmt::format("E={}", e))
            .tensors({inout("bias", e), input_i64("counts", e, ids_below(20))})
            .forward("router_bias_update", [=](Backend& b, const Args& a) {
                b.router_bias_update(a.f32("bias"), a.i64("counts"), e, 0.001f);
            });
    }

    struct CombineShape {
        int64_t parts, tokens;
    };
    for (const CombineShape s : {CombineShape{1, 5}, {3, 7}, {8, 300}, {2, 0}}) {
        const int64_t n = s.tokens;
        r.add("cross_entropy_combine", fmt::format("parts={} N={}", s.parts, n))
            .tensors({input("part_max", s.parts * n, normal(2.0)), output("row_max", n)})
            .forward("cross_entropy_combine_max", [=](Backend& b, const Args& a) {
                b.cross_entropy_combine_max(a.f32("row_max"), a.f32("part_max"), s.parts, n);
            });
        r.add("cross_entropy_combine_losses", fmt::format("N={}", n))
            .tensors({with_dtype(input("sum_exp", n, uniform(1, 50)), DType::f64),
                      with_dtype(input("target_logit", n, normal(2.0)), DType::f64),
                      input("row_max", n, normal(2.0)),
                      input_i32("targets", n, ids_below(30, 4, kIgnoreIndex)), output("losses", n),
                      output("lse", n), host_result("loss_sum"), host_result("num_valid")})
            .forward("cross_entropy_combine_losses", [=](Backend& b, const Args& a) {
                const CrossEntropyResult result = b.cross_entropy_combine_losses(
                    a.f32("losses"), a.f32("lse"), a.f64("sum_exp"), a.f64("target_logit"),
                    a.f32("row_max"), a.i32("targets"), n, kIgnoreIndex);
                a.result("loss_sum") = result.loss_sum;
                a.result("num_valid") = static_cast<double>(result.num_valid);
            });
    }

    struct InitShape {
        int64_t runs, length, first, stride;
    };
    for (const InitShape s :
         {InitShape{1, 1000, 0, 0}, {6, 3, 4, 10}, {3, 70001, 5, 100000}, {0, 4, 0, 4}}) {
        r.add("init_normal", fmt::format("runs={} length={} first={} stride={}", s.runs, s.length,
                                         s.first, s.stride))
            .tensors({output("out", s.runs * s.length)})
            .forward("init_normal", [=](Backend& b, const Args& a) {
                b.init_normal(a.f32("out"), 42, 0x1234abcdULL, s.runs, s.length, s.first, s.stride,
                              0.02f);
            });
    }
    for (const int64_t n : {0, 1, 100003}) {
        r.add("fill", fmt::format("n={}", n))
            .tensors({output("x", n)})
            .forward("fill", [=](Backend& b, const Args& a) { b.fill(a.f32("x"), n, 1.0f); });
    }
}

}  // namespace moetron::backend_ops
