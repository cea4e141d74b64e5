// The op-parity cases of the low-precision recipes (cases.h): the quantization ops, and the GEMMs
// in each recipe's format.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend_ops/cases.h"
#include "backend_ops/registry.h"

namespace moetron::backend_ops {

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

// The GEMMs in each recipe's format (GemmPrecision): the operands quantized as the format defines,
// then multiplied with float32 sums, so that backends differ only in the order of the sums. Too
// large for finite differences (a quantized GEMM is not differentiable at the rounding steps:
// the float32 cases check the backwards). Shapes with partial blocks of 32 and 128.
void register_recipe_gemms(Registry& r) {
    for (const Precision format : {Precision::bf16, Precision::mxfp8, Precision::fp8_blockwise}) {
        const GemmPrecision gemm{format};
        const std::string name = std::string(precision_name(format));
        struct LinearShape {
            int64_t rows, in, out;
        };
        for (const LinearShape s : {LinearShape{64, 256, 48}, {33, 200, 70}})
            add_linear_case(r, "linear " + name, s.rows, s.in, s.out, gemm, normal(0.05));
        const std::vector<double> offsets = {0, 40, 40, 97, 130};  // an expert without tokens
        const int64_t experts = 4, rows = 130, in = 160, out = 40;
        add_grouped_linear_case(r, "grouped_linear " + name, offsets, in, out, gemm, normal(0.05));
        // Rows that arrived in the format (the expert dispatch's payload): only the weight is
        // quantized, the input taken as it is.
        r.add("grouped_linear " + name + " input_quantized",
              fmt::format("E={} M={} I={} O={}", experts, rows, in, out))
            .tensors({input("inp", rows * in), input("weight", experts * out * in, normal(0.05)),
                      input_i64("offsets", experts + 1, values(offsets)),
                      output("out", rows * out)})
            .forward("grouped_linear_forward",
                     [=](Backend& b, const Args& a) {
                         b.grouped_linear_forward(a.f32("out"), a.f32("inp"), a.f32("weight"),
                                                  a.i64("offsets"), experts, in, out,
                                                  {format, /*input_quantized=*/true});
                     })
            .parity_tolerance(kGemmParity);
    }
}

}  // namespace moetron::backend_ops
