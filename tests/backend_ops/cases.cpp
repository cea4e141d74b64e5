// Every Backend op, registered once with its shapes (registry.h; kernels/README.md says how to
// add one). Sections follow kernels/backend.h. Each op has a shape small enough for the
// finite-difference check (harness.h: kMaxFiniteDifferenceElements), odd sizes, a larger shape
// for parity only, and an empty one where the op allows it.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend_ops/registry.h"

namespace moetron::backend_ops {

namespace {

constexpr int32_t kIgnoreIndex = -100;

// ---- data movement and elementwise ----

void register_elementwise(Registry& r) {
    for (int64_t n : {0, 1, 1000, 4099}) {
        const std::string shape = fmt::format("n={}", n);
        r.add("copy", shape)
            .tensors({input("src", n), output("dst", n)})
            .forward("copy", [=](Backend& b, const Args& a) {
                b.copy(a.f32("dst"), a.f32("src"), n * sizeof(float));
            });
        r.add("zero", shape)
            .tensors({output("dst", n)})
            .forward("zero",
                     [=](Backend& b, const Args& a) { b.zero(a.f32("dst"), n * sizeof(float)); });
        r.add("add_inplace", shape)
            .tensors({inout("y", n), input("x", n)})
            .forward("add_inplace",
                     [=](Backend& b, const Args& a) { b.add_inplace(a.f32("y"), a.f32("x"), n); });
        r.add("axpy", shape)
            .tensors({inout("y", n), input("x", n)})
            .forward("axpy",
                     [=](Backend& b, const Args& a) { b.axpy(a.f32("y"), 0.75f, a.f32("x"), n); });
        r.add("add", shape)
            .tensors({input("a", n), input("b", n), output("out", n)})
            .forward("add", [=](Backend& b, const Args& a) {
                b.add(a.f32("out"), a.f32("a"), a.f32("b"), n);
            });
    }
}

// ---- GEMMs ----

// GEMMs sum in different orders on different backends: float32 rounding grows with K.
constexpr double kGemmParity = 1e-4;

void register_gemms(Registry& r) {
    struct MatmulShape {
        int64_t m, n, k;
        bool trans_a, trans_b;
        float beta;
    };
    for (const MatmulShape s : {MatmulShape{5, 7, 3, false, false, 0.0f},
                                {5, 7, 3, true, false, 1.0f},
                                {4, 6, 9, false, true, 0.5f},
                                {4, 6, 9, true, true, 0.0f},
                                {33, 17, 65, false, true, 1.0f},
                                {3, 4, 0, false, false, 0.5f},
                                {3, 4, 0, false, false, 0.0f},
                                {0, 4, 3, false, false, 0.0f}}) {
        // With beta = 0, C is never read: it starts as NaN like every output.
        const TensorSpec c = s.beta == 0.0f ? output("c", s.m * s.n) : inout("c", s.m * s.n);
        r.add("matmul", fmt::format("M={} N={} K={} ta={:d} tb={:d} beta={}", s.m, s.n, s.k,
                                    s.trans_a, s.trans_b, s.beta))
            .tensors({input("a", s.m * s.k), input("b", s.k * s.n), c})
            .forward("matmul",
                     [=](Backend& b, const Args& a) {
                         b.matmul(a.f32("c"), a.f32("a"), a.f32("b"), s.m, s.n, s.k, s.trans_a,
                                  s.trans_b, s.beta);
                     })
            .parity_tolerance(kGemmParity);
    }

    struct LinearShape {
        int64_t rows, in, out;
    };
    for (const LinearShape s : {LinearShape{7, 13, 5}, {1, 1, 1}, {64, 96, 80}, {0, 4, 3}}) {
        r.add("linear", fmt::format("M={} I={} O={}", s.rows, s.in, s.out))
            .tensors({input("inp", s.rows * s.in), input("weight", s.out * s.in),
                      output("out", s.rows * s.out).weighted_by("dout"),
                      probe("dout", s.rows * s.out), grad("dinp", s.rows * s.in).of("inp"),
                      grad_sum("dweight", s.out * s.in).of("weight")})
            .forward("linear_forward",
                     [=](Backend& b, const Args& a) {
                         b.linear_forward(a.f32("out"), a.f32("inp"), a.f32("weight"), s.rows, s.in,
                                          s.out);
                     })
            .backward("linear_backward",
                      [=](Backend& b, const Args& a) {
                          b.linear_backward(a.f32("dinp"), a.f32("dweight"), a.f32("dout"),
                                            a.f32("inp"), a.f32("weight"), s.rows, s.in, s.out);
                      })
            .parity_tolerance(kGemmParity);
    }
    // The first layer's linear: no input gradient (null dinp).
    r.add("linear", "M=6 I=5 O=4 dinp=null")
        .tensors({input("inp", 30), input("weight", 20), output("out", 24).weighted_by("dout"),
                  probe("dout", 24), grad_sum("dweight", 20).of("weight")})
        .forward("linear_forward",
                 [](Backend& b, const Args& a) {
                     b.linear_forward(a.f32("out"), a.f32("inp"), a.f32("weight"), 6, 5, 4);
                 })
        .backward("linear_backward",
                  [](Backend& b, const Args& a) {
                      b.linear_backward(nullptr, a.f32("dweight"), a.f32("dout"), a.f32("inp"),
                                        a.f32("weight"), 6, 5, 4);
                  })
        .parity_tolerance(kGemmParity);

    struct GroupedShape {
        std::vector<double> offsets;  // E + 1 segment boundaries; an empty segment in most
        int64_t in, out;
    };
    for (const GroupedShape& s :
         {GroupedShape{{0, 2, 2, 5}, 4, 3},
          {{0, 40, 40, 97, 130}, 48, 40},
          {{0, 0, 0}, 3, 2},
          {{0}, 3, 2},
          // Ten small ragged experts: enough that threads own whole
          // experts (the small-GEMM kernels), small enough for finite
          // differences; then a dozen of up to 70 tokens.
          {{0, 1, 3, 3, 6, 10, 11, 13, 16, 17, 20}, 5, 3},
          {{0, 64, 65, 65, 135, 138, 202, 219, 226, 290, 291, 324, 388}, 40, 21}}) {
        const auto experts = static_cast<int64_t>(s.offsets.size()) - 1;
        const auto rows = static_cast<int64_t>(s.offsets.back());
        const int64_t in = s.in, out = s.out;
        r.add("grouped_linear", fmt::format("E={} M={} I={} O={}", experts, rows, in, out))
            .tensors({input("inp", rows * in), input("weight", experts * out * in),
                      input_i64("offsets", experts + 1, values(s.offsets)),
                      output("out", rows * out).weighted_by("dout"), probe("dout", rows * out),
                      grad("dinp", rows * in).of("inp"),
                      grad_sum("dweight", experts * out * in).of("weight")})
            .forward("grouped_linear_forward",
                     [=](Backend& b, const Args& a) {
                         b.grouped_linear_forward(a.f32("out"), a.f32("inp"), a.f32("weight"),
                                                  a.i64("offsets"), experts, in, out);
                     })
            .backward("grouped_linear_backward",
                      [=](Backend& b, const Args& a) {
                          b.grouped_linear_backward(a.f32("dinp"), a.f32("dweight"), a.f32("dout"),
                                                    a.f32("inp"), a.f32("weight"), a.i64("offsets"),
                                                    experts, in, out);
                      })
            .parity_tolerance(kGemmParity);
    }
}

// ---- norms, activations, positions ----

void register_norms_and_activations(Registry& r) {
    struct RowShape {
        int64_t rows, dim;
    };
    for (const RowShape s : {RowShape{7, 13}, {1, 5}, {3, 300}, {0, 8}}) {
        const int64_t n = s.rows, d = s.dim;
        r.add("rmsnorm", fmt::format("N={} D={}", n, d))
            .tensors({input("inp", n * d), input("weight", d),
                      output("out", n * d).weighted_by("dout"), output("rstd", n),
                      probe("dout", n * d), grad("dinp", n * d).of("inp"),
                      grad_sum("dweight", d).of("weight")})
            .forward("rmsnorm_forward",
                     [=](Backend& b, const Args& a) {
                         b.rmsnorm_forward(a.f32("out"), a.f32("rstd"), a.f32("inp"),
                                           a.f32("weight"), n, d, 1e-6f);
                     })
            .backward("rmsnorm_backward", [=](Backend& b, const Args& a) {
                b.rmsnorm_backward(a.f32("dinp"), a.f32("dweight"), a.f32("dout"), a.f32("inp"),
                                   a.f32("weight"), a.f32("rstd"), n, d);
            });

        r.add("swiglu", fmt::format("M={} F={}", n, d))
            .tensors({input("inp", n * 2 * d), output("out", n * d).weighted_by("dout"),
                      probe("dout", n * d), grad("dinp", n * 2 * d).of("inp")})
            .forward("swiglu_forward",
                     [=](Backend& b, const Args& a) {
                         b.swiglu_forward(a.f32("out"), a.f32("inp"), n, d);
                     })
            .backward("swiglu_backward", [=](Backend& b, const Args& a) {
                b.swiglu_backward(a.f32("dinp"), a.f32("dout"), a.f32("inp"), n, d);
            });
    }
    // Each gradient alone (a null pointer skips the other).
    r.add("rmsnorm", "N=4 D=6 dinp=null")
        .tensors({input("inp", 24), input("weight", 6), output("out", 24).weighted_by("dout"),
                  output("rstd", 4), probe("dout", 24), grad_sum("dweight", 6).of("weight")})
        .forward("rmsnorm_forward",
                 [](Backend& b, const Args& a) {
                     b.rmsnorm_forward(a.f32("out"), a.f32("rstd"), a.f32("inp"), a.f32("weight"),
                                       4, 6, 1e-6f);
                 })
        .backward("rmsnorm_backward", [](Backend& b, const Args& a) {
            b.rmsnorm_backward(nullptr, a.f32("dweight"), a.f32("dout"), a.f32("inp"),
                               a.f32("weight"), a.f32("rstd"), 4, 6);
        });
    r.add("rmsnorm", "N=4 D=6 dweight=null")
        .tensors({input("inp", 24), input("weight", 6), output("out", 24).weighted_by("dout"),
                  output("rstd", 4), probe("dout", 24), grad("dinp", 24).of("inp")})
        .forward("rmsnorm_forward",
                 [](Backend& b, const Args& a) {
                     b.rmsnorm_forward(a.f32("out"), a.f32("rstd"), a.f32("inp"), a.f32("weight"),
                                       4, 6, 1e-6f);
                 })
        .backward("rmsnorm_backward", [](Backend& b, const Args& a) {
            b.rmsnorm_backward(a.f32("dinp"), nullptr, a.f32("dout"), a.f32("inp"), a.f32("weight"),
                               a.f32("rstd"), 4, 6);
        });
}

// cos or sin (S, R/2) of pos * theta^(-2i/R), as rope_tables writes them.
Fill rope_table(int64_t rope_dim, double theta, bool sine) {
    return [=](std::span<double> out, const ParamRng&) {
        const int64_t half = rope_dim / 2;
        for (size_t j = 0; j < out.size(); ++j) {
            const auto pos = static_cast<double>(j / half), i = static_cast<double>(j % half);
            const double angle = pos * std::pow(theta, -2.0 * i / static_cast<double>(rope_dim));
            out[j] = sine ? std::sin(angle) : std::cos(angle);
        }
    };
}

void register_rope(Registry& r) {
    struct TableShape {
        int64_t seq_len, rope_dim;
    };
    for (const TableShape s : {TableShape{5, 8}, {1, 2}, {33, 64}, {0, 4}}) {
        const int64_t count = s.seq_len * s.rope_dim / 2;
        r.add("rope_tables", fmt::format("S={} R={}", s.seq_len, s.rope_dim))
            .tensors({output("cos", count), output("sin", count)})
            .forward("rope_tables", [=](Backend& b, const Args& a) {
                b.rope_tables(a.f32("cos"), a.f32("sin"), s.seq_len, s.rope_dim, 10000.0f);
            });
    }

    struct RopeShape {
        int64_t tokens, seq_len, heads, head_stride, rope_offset, rope_dim;
    };
    for (const RopeShape s : {RopeShape{6, 3, 2, 10, 4, 6},
                              {4, 4, 1, 4, 0, 4},
                              {64, 16, 4, 48, 16, 32},
                              {0, 2, 2, 4, 0, 4}}) {
        const int64_t count = s.tokens * s.heads * s.head_stride;
        const int64_t table = s.seq_len * s.rope_dim / 2;
        // Forward and backward work in place: each copies its input first (copy has its own case).
        r.add("rope", fmt::format("N={} S={} H={} stride={} offset={} R={}", s.tokens, s.seq_len,
                                  s.heads, s.head_stride, s.rope_offset, s.rope_dim))
            .tensors({input("x_in", count), input("cos", table, rope_table(s.rope_dim, 1e4, false)),
                      input("sin", table, rope_table(s.rope_dim, 1e4, true)),
                      output("x", count).weighted_by("dx_out"), probe("dx_out", count),
                      grad("dx_in", count).of("x_in")})
            .forward("rope_forward",
                     [=](Backend& b, const Args& a) {
                         b.copy(a.f32("x"), a.f32("x_in"), count * sizeof(float));
                         b.rope_forward(a.f32("x"), a.f32("cos"), a.f32("sin"), s.tokens, s.seq_len,
                                        s.heads, s.head_stride, s.rope_offset, s.rope_dim);
                     })
            .backward("rope_backward", [=](Backend& b, const Args& a) {
                b.copy(a.f32("dx_in"), a.f32("dx_out"), count * sizeof(float));
                b.rope_backward(a.f32("dx_in"), a.f32("cos"), a.f32("sin"), s.tokens, s.seq_len,
                                s.heads, s.head_stride, s.rope_offset, s.rope_dim);
            });
    }
}

// ---- attention ----

void register_attention(Registry& r) {
    struct AttentionShape {
        int64_t batch, seq_len, heads, qk_dim, v_dim;
    };
    for (const AttentionShape s :
         {AttentionShape{1, 4, 2, 5, 3},
          {2, 3, 1, 4, 4},
          {2, 17, 3, 24, 16},
          {0, 4, 2, 4, 4},
          {1, 131, 2, 192, 128}}) {  // MLA head dims over three of the CPU kernel's blocks
        const int64_t tokens = s.batch * s.seq_len;
        const int64_t qk = tokens * s.heads * s.qk_dim, v = tokens * s.heads * s.v_dim;
        const float scale = 1.0f / std::sqrt(static_cast<float>(s.qk_dim));
        r.add("attention", fmt::format("B={} S={} H={} Dqk={} Dv={}", s.batch, s.seq_len, s.heads,
                                       s.qk_dim, s.v_dim))
            .tensors({input("q", qk), input("k", qk), input("v", v),
                      output("out", v).weighted_by("dout"), output("lse", tokens * s.heads),
                      probe("dout", v), grad("dq", qk).of("q"), grad("dk", qk).of("k"),
                      grad("dv", v).of("v")})
            .forward("attention_forward",
                     [=](Backend& b, const Args& a) {
                         b.attention_forward(a.f32("out"), a.f32("lse"), a.f32("q"), a.f32("k"),
                                             a.f32("v"), s.batch, s.seq_len, s.heads, s.qk_dim,
                                             s.v_dim, scale);
                     })
            .backward("attention_backward",
                      [=](Backend& b, const Args& a) {
                          b.attention_backward(a.f32("dq"), a.f32("dk"), a.f32("dv"), a.f32("dout"),
                                               a.f32("q"), a.f32("k"), a.f32("v"), a.f32("out"),
                                               a.f32("lse"), s.batch, s.seq_len, s.heads, s.qk_dim,
                                               s.v_dim, scale);
                      })
            // Measured: float32 rounding in the forward leaves 2e-3 in the smallest dq entries.
            .finite_difference(0x1p-5, 5e-3);
    }
}

// ---- embedding and loss ----

void register_embedding(Registry& r) {
    struct EmbeddingShape {
        int64_t tokens, vocab, dim;
    };
    for (const EmbeddingShape s : {EmbeddingShape{9, 11, 5}, {1, 1, 1}, {100, 50, 64}, {0, 7, 3}}) {
        r.add("embedding", fmt::format("N={} V={} D={}", s.tokens, s.vocab, s.dim))
            .tensors(
                {input_i32("tokens", s.tokens, ids_below(s.vocab)), input("table", s.vocab * s.dim),
                 output("out", s.tokens * s.dim).weighted_by("dout"),
                 probe("dout", s.tokens * s.dim), grad_sum("dtable", s.vocab * s.dim).of("table")})
            .forward("embedding_forward",
                     [=](Backend& b, const Args& a) {
                         b.embedding_forward(a.f32("out"), a.i32("tokens"), a.f32("table"),
                                             s.tokens, s.vocab, s.dim);
                     })
            .backward("embedding_backward", [=](Backend& b, const Args& a) {
                b.embedding_backward(a.f32("dtable"), a.f32("dout"), a.i32("tokens"), s.tokens,
                                     s.vocab, s.dim);
            });
    }

    struct PartShape {
        int64_t tokens, vocab, first, part, dim;
    };
    for (const PartShape s : {PartShape{12, 11, 3, 5, 4}, {100, 64, 32, 32, 48}, {0, 8, 0, 4, 2}}) {
        r.add("embedding_part", fmt::format("N={} V={} first={} Vp={} D={}", s.tokens, s.vocab,
                                            s.first, s.part, s.dim))
            .tensors({input_i32("tokens", s.tokens, ids_below(s.vocab)),
                      input("table_part", s.part * s.dim),
                      output("out", s.tokens * s.dim).weighted_by("dout"),
                      probe("dout", s.tokens * s.dim),
                      grad_sum("dtable_part", s.part * s.dim).of("table_part")})
            .forward("embedding_part_forward",
                     [=](Backend& b, const Args& a) {
                         b.embedding_part_forward(a.f32("out"), a.i32("tokens"),
                                                  a.f32("table_part"), s.tokens, s.first, s.part,
                                                  s.dim);
                     })
            .backward("embedding_part_backward", [=](Backend& b, const Args& a) {
                b.embedding_part_backward(a.f32("dtable_part"), a.f32("dout"), a.i32("tokens"),
                                          s.tokens, s.first, s.part, s.dim);
            });
    }
}

void register_cross_entropy(Registry& r) {
    // The backward's dloss_per_token; the loss the finite differences see is sum(losses) times it.
    constexpr float kDlossPerToken = 0.37f;
    struct LossShape {
        int64_t tokens, vocab;
    };
    for (const LossShape s : {LossShape{6, 7}, {1, 1}, {33, 300}, {0, 5}}) {
        const int64_t n = s.tokens, v = s.vocab;
        // Every fourth target is ignored.
        r.add("cross_entropy", fmt::format("N={} V={}", n, v))
            .tensors({input("logits", n * v, normal(2.0)),
                      input_i32("targets", n, ids_below(v, 4, kIgnoreIndex)),
                      output("losses", n).weighted_by("dlosses"), output("lse", n),
                      host_result("loss_sum"), host_result("num_valid"),
                      probe("dlosses", n, constant(kDlossPerToken)),
                      grad("dlogits", n * v).of("logits")})
            .forward("cross_entropy_forward",
                     [=](Backend& b, const Args& a) {
                         const CrossEntropyResult result =
                             b.cross_entropy_forward(a.f32("losses"), a.f32("lse"), a.f32("logits"),
                                                     a.i32("targets"), n, v, kIgnoreIndex);
                         a.result("loss_sum") = result.loss_sum;
                         a.result("num_valid") = static_cast<double>(result.num_valid);
                     })
            .backward("cross_entropy_backward", [=](Backend& b, const Args& a) {
                b.cross_entropy_backward(a.f32("dlogits"), a.f32("logits"), a.f32("lse"),
                                         a.i32("targets"), n, v, kIgnoreIndex, kDlossPerToken);
            });
    }

    // ---- vocabulary-parallel parts ----
    struct PartShape {
        int64_t tokens, vocab, first, part;
    };
    for (const PartShape s :
         {PartShape{5, 9, 0, 9}, {6, 11, 3, 5}, {40, 256, 128, 128}, {0, 4, 0, 4}}) {
        const int64_t n = s.tokens, vp = s.part;
        const std::string shape =
            fmt::format("N={} V={} first={} Vp={}", n, s.vocab, s.first, s.part);
        r.add("cross_entropy_part_max", shape)
            .tensors({input("logits", n * vp, normal(2.0)), output("row_max", n)})
            .forward("cross_entropy_part_max", [=](Backend& b, const Args& a) {
                b.cross_entropy_part_max(a.f32("row_max"), a.f32("logits"), n, vp);
            });
        r.add("cross_entropy_part_sums", shape)
            .tensors({input("logits", n * vp, normal(2.0)), input("row_max", n, uniform(3, 4)),
                      input_i32("targets", n, ids_below(s.vocab, 4, kIgnoreIndex)),
                      output("sum_exp", n, DType::f64), output("target_logit", n, DType::f64)})
            .forward("cross_entropy_part_sums",
                     [=](Backend& b, const Args& a) {
                         b.cross_entropy_part_sums(a.f64("sum_exp"), a.f64("target_logit"),
                                                   a.f32("logits"), a.f32("row_max"),
                                                   a.i32("targets"), n, vp, s.first, kIgnoreIndex);
                     })
            .parity_tolerance(1e-10);
        // One part of the backward, from the full rows' lse (any value does for parity).
        r.add("cross_entropy_part_backward", shape)
            .tensors({input("logits", n * vp, normal(2.0)), input("lse", n, uniform(3, 5)),
                      input_i32("targets", n, ids_below(s.vocab, 4, kIgnoreIndex)),
                      output("dlogits", n * vp)})
            .forward("cross_entropy_part_backward", [=](Backend& b, const Args& a) {
                b.cross_entropy_part_backward(a.f32("dlogits"), a.f32("logits"), a.f32("lse"),
                                              a.i32("targets"), n, vp, s.first, kIgnoreIndex,
                                              kDlossPerToken);
            });
    }
    // A single part holding the whole vocabulary is the loss's whole backward: against finite
    // differences of cross_entropy_forward.
    r.add("cross_entropy_part_backward", "N=6 V=7 single part")
        .tensors({input("logits", 42, normal(2.0)),
                  input_i32("targets", 6, ids_below(7, 4, kIgnoreIndex)),
                  output("losses", 6).weighted_by("dlosses"), output("lse", 6),
                  probe("dlosses", 6, constant(kDlossPerToken)), grad("dlogits", 42).of("logits")})
        .forward("cross_entropy_forward",
                 [](Backend& b, const Args& a) {
                     b.cross_entropy_forward(a.f32("losses"), a.f32("lse"), a.f32("logits"),
                                             a.i32("targets"), 6, 7, kIgnoreIndex);
                 })
        .backward("cross_entropy_part_backward", [](Backend& b, const Args& a) {
            b.cross_entropy_part_backward(a.f32("dlogits"), a.f32("logits"), a.f32("lse"),
                                          a.i32("targets"), 6, 7, 0, kIgnoreIndex, kDlossPerToken);
        });
}

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
constexpr double kHalf = 1056964608, kQuarter = 1048576000, kMinus1p5 = -1077936128,
                 kTwo = 1073741824;

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

// ---- optimizer ----

void register_optimizer(Registry& r) {
    struct AdamWCase {
        int64_t n;
        AdamWParams hp;
        bool fresh;  // step 1 from zero moments, or a later step from moments already there
    };
    for (const AdamWCase& c :
         {AdamWCase{1000, {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1}, true},
          {37, {3e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 5}, false},
          {37, {3e-3f, 0.3f, 0.95f, 1e-6f, 0.1f, 2}, false},  // beta1 < 0.5: the other lerp
          {0, {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1}, true}}) {
        const AdamWParams hp = c.hp;
        r.add("adamw", fmt::format("n={} step={} beta1={}", c.n, hp.step, hp.beta1))
            .tensors({inout("params", c.n), inout("m", c.n, c.fresh ? constant(0) : normal(0.1)),
                      inout("v", c.n, c.fresh ? constant(0) : uniform(0, 0.01)),
                      input("grads", c.n)})
            .forward("adamw_update", [=](Backend& b, const Args& a) {
                b.adamw_update(a.f32("params"), a.f32("m"), a.f32("v"), a.f32("grads"), c.n, hp);
            });
    }
    for (int64_t n : {0, 1, 1000, 100003}) {
        r.add("sum_squares", fmt::format("n={}", n))
            .tensors({input("x", n), host_result("sum")})
            .forward(
                "sum_squares",
                [=](Backend& b, const Args& a) { a.result("sum") = b.sum_squares(a.f32("x"), n); })
            .parity_tolerance(1e-10);
        r.add("scale_inplace", fmt::format("n={}", n))
            .tensors({inout("x", n)})
            .forward("scale_inplace",
                     [=](Backend& b, const Args& a) { b.scale_inplace(a.f32("x"), n, 0.3f); });
    }
}

// ---- machine probes ----

void register_machine_probes(Registry& r) {
    for (int64_t n : {0, 1, 1000, 4099}) {
        const std::string shape = fmt::format("n={}", n);
        r.add("stream_triad", shape)
            .tensors({input("b", n), input("c", n), output("a", n)})
            .forward("stream_triad", [=](Backend& b, const Args& a) {
                b.stream_triad(a.f32("a"), a.f32("b"), a.f32("c"), 0.5f, n);
            });
        r.add("exp_elementwise", shape)
            .tensors({input("inp", n), output("out", n)})
            .forward("exp_elementwise", [=](Backend& b, const Args& a) {
                b.exp_elementwise(a.f32("out"), a.f32("inp"), n);
            });
    }
    // No tensors: the case checks that the op runs (and is implemented) on every backend.
    r.add("empty_launch", "").tensors({}).forward("empty_launch", [](Backend& b, const Args&) {
        b.empty_launch();
    });
}

// ---- model ops ----

// A spec of another dtype than its maker's default (an int64 inout, a double input).
TensorSpec with_dtype(TensorSpec spec, DType dtype) {
    spec.dtype = dtype;
    return spec;
}

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

// ---- low precision: quantization is exact arithmetic, so every backend must agree bit for bit
// (tests/test_kernels_quantize.cpp checks the CPU against an independent reference) ----

void register_low_precision(Registry& r) {
    const auto blocks_covering = [](int64_t extent, int64_t block) {
        return (extent + block - 1) / block;
    };
    struct Shape {
        int64_t rows, cols;
    };
    for (const Shape s : {Shape{3, 70}, {40, 33}, {0, 5}}) {
        const int64_t n = s.rows * s.cols;
        for (const bool down : {false, true}) {
            const int64_t num_scales =
                down ? blocks_covering(s.rows, 32) * s.cols : s.rows * blocks_covering(s.cols, 32);
            const std::string shape =
                fmt::format("M={} N={} {}", s.rows, s.cols, down ? "32x1" : "1x32");
            const auto quantize = [=](Backend& b, const Args& a) {
                b.quantize_mxfp8(a.u8("elements"), a.u8("scales"), a.f32("x"), s.rows, s.cols,
                                 down);
            };
            r.add("quantize_mxfp8", shape)
                .tensors({input("x", n, normal(30.0)), output("elements", n, DType::u8),
                          output("scales", num_scales, DType::u8)})
                .forward("quantize_mxfp8", quantize);
            r.add("dequantize_mxfp8", shape)
                .tensors({input("x", n, normal(30.0)), output("elements", n, DType::u8),
                          output("scales", num_scales, DType::u8), output("y", n)})
                .forward("dequantize_mxfp8",
                         [=](Backend& b, const Args& a) {
                             quantize(b, a);
                             b.dequantize_mxfp8(a.f32("y"), a.u8("elements"), a.u8("scales"),
                                                s.rows, s.cols, down);
                         })
                .parity_tolerance(0.0);
        }
        for (const Shape tile : {Shape{1, 128}, {128, 1}, {128, 128}, {2, 16}}) {
            const int64_t num_scales =
                blocks_covering(s.rows, tile.rows) * blocks_covering(s.cols, tile.cols);
            const std::string shape =
                fmt::format("M={} N={} {}x{}", s.rows, s.cols, tile.rows, tile.cols);
            const auto quantize = [=](Backend& b, const Args& a) {
                b.quantize_fp8_blocks(a.u8("elements"), a.f32("scales"), a.f32("x"), s.rows, s.cols,
                                      tile.rows, tile.cols);
            };
            r.add("quantize_fp8_blocks", shape)
                .tensors({input("x", n, normal(0.01)), output("elements", n, DType::u8),
                          output("scales", num_scales)})
                .forward("quantize_fp8_blocks", quantize)
                .parity_tolerance(0.0);
            r.add("dequantize_fp8_blocks", shape)
                .tensors({input("x", n, normal(0.01)), output("elements", n, DType::u8),
                          output("scales", num_scales), output("y", n)})
                .forward("dequantize_fp8_blocks",
                         [=](Backend& b, const Args& a) {
                             quantize(b, a);
                             b.dequantize_fp8_blocks(a.f32("y"), a.u8("elements"), a.f32("scales"),
                                                     s.rows, s.cols, tile.rows, tile.cols);
                         })
                .parity_tolerance(0.0);
        }
    }
    for (int64_t n : {0, 1, 1000}) {
        r.add("round_to_bf16", fmt::format("n={}", n))
            .tensors({input("x", n), output("out", n)})
            .forward(
                "round_to_bf16",
                [=](Backend& b, const Args& a) { b.round_to_bf16(a.f32("out"), a.f32("x"), n); })
            .parity_tolerance(0.0);
    }
}

}  // namespace

const std::vector<OpCase>& op_cases() {
    static const std::vector<OpCase> cases = [] {
        Registry r;
        register_elementwise(r);
        register_gemms(r);
        register_norms_and_activations(r);
        register_rope(r);
        register_attention(r);
        register_embedding(r);
        register_cross_entropy(r);
        register_routing(r);
        register_optimizer(r);
        register_dispatch(r);
        register_model_ops(r);
        register_machine_probes(r);
        register_low_precision(r);
        return r.cases();
    }();
    return cases;
}

}  // namespace moetron::backend_ops
