// Every Backend op, registered once with its shapes (cases.h; kernels/README.md says how to add
// one): data movement, GEMMs, norms, attention, embedding and loss, optimizer, machine probes, and
// op_cases() over every file's sections.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend_ops/cases.h"
#include "backend_ops/registry.h"

namespace moetron::backend_ops {

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

void add_linear_case(Registry& r, const std::string& name, int64_t rows, int64_t in, int64_t out,
                     GemmPrecision gemm, const Fill& weight_fill) {
    r.add(name, fmt::format("M={} I={} O={}", rows, in, out))
        .tensors({input("inp", rows * in), input("weight", out * in, weight_fill),
                  output("out", rows * out).weighted_by("dout"), probe("dout", rows * out),
                  grad("dinp", rows * in).of("inp"), grad_sum("dweight", out * in).of("weight")})
        .forward("linear_forward",
                 [=](Backend& b, const Args& a) {
                     b.linear_forward(a.f32("out"), a.f32("inp"), a.f32("weight"), rows, in, out,
                                      gemm);
                 })
        .backward("linear_backward",
                  [=](Backend& b, const Args& a) {
                      b.linear_backward(a.f32("dinp"), a.f32("dweight"), a.f32("dout"),
                                        a.f32("inp"), a.f32("weight"), rows, in, out, gemm);
                  })
        .parity_tolerance(kGemmParity);
}

void add_grouped_linear_case(Registry& r, const std::string& name,
                             const std::vector<double>& offsets, int64_t in, int64_t out,
                             GemmPrecision gemm, const Fill& weight_fill) {
    const auto experts = static_cast<int64_t>(offsets.size()) - 1;
    const auto rows = static_cast<int64_t>(offsets.back());
    r.add(name, fmt::format("E={} M={} I={} O={}", experts, rows, in, out))
        .tensors({input("inp", rows * in), input("weight", experts * out * in, weight_fill),
                  input_i64("offsets", experts + 1, values(offsets)),
                  output("out", rows * out).weighted_by("dout"), probe("dout", rows * out),
                  grad("dinp", rows * in).of("inp"),
                  grad_sum("dweight", experts * out * in).of("weight")})
        .forward("grouped_linear_forward",
                 [=](Backend& b, const Args& a) {
                     b.grouped_linear_forward(a.f32("out"), a.f32("inp"), a.f32("weight"),
                                              a.i64("offsets"), experts, in, out, gemm);
                 })
        .backward("grouped_linear_backward",
                  [=](Backend& b, const Args& a) {
                      b.grouped_linear_backward(a.f32("dinp"), a.f32("dweight"), a.f32("dout"),
                                                a.f32("inp"), a.f32("weight"), a.i64("offsets"),
                                                experts, in, out, gemm);
                  })
        .parity_tolerance(kGemmParity);
}

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
                                  s.trans_b, s.beta, kFp32Gemm);
                     })
            .parity_tolerance(kGemmParity);
    }

    struct LinearShape {
        int64_t rows, in, out;
    };
    for (const LinearShape s : {LinearShape{7, 13, 5}, {1, 1, 1}, {64, 96, 80}, {0, 4, 3}})
        add_linear_case(r, "linear", s.rows, s.in, s.out, kFp32Gemm, normal());
    // The first layer's linear: no input gradient (null dinp).
    r.add("linear", "M=6 I=5 O=4 dinp=null")
        .tensors({input("inp", 30), input("weight", 20), output("out", 24).weighted_by("dout"),
                  probe("dout", 24), grad_sum("dweight", 20).of("weight")})
        .forward("linear_forward",
                 [](Backend& b, const Args& a) {
                     b.linear_forward(a.f32("out"), a.f32("inp"), a.f32("weight"), 6, 5, 4,
                                      kFp32Gemm);
                 })
        .backward("linear_backward",
                  [](Backend& b, const Args& a) {
                      b.linear_backward(nullptr, a.f32("dweight"), a.f32("dout"), a.f32("inp"),
                                        a.f32("weight"), 6, 5, 4, kFp32Gemm);
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
        add_grouped_linear_case(r, "grouped_linear", s.offsets, s.in, s.out, kFp32Gemm, normal());
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

namespace {

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

}  // namespace

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
        register_recipe_gemms(r);
        return r.cases();
    }();
    return cases;
}

}  // namespace moetron::backend_ops
