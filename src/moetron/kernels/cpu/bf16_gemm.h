// The bf16 recipe's GEMM on CPUs with AVX512_BF16: both inputs rounded to bfloat16 (nearest even,
// as round_to_bf16 does) while they are packed, then multiplied with vdpbf16ps, which adds the
// exact products of two bfloat16 pairs into float32 lanes. The result is therefore the emulated
// recipe's (round both inputs, float32 GEMM) up to the order of the float32 additions. Two
// differences the instruction imposes, both below anything a bf16 GEMM can resolve: bfloat16
// subnormal inputs count as zero and float32 subnormal partial sums are flushed to zero.
//
// Packing: op(A)'s rows and op(B)'s columns are stored as 32-bit pairs (element 2p in the low
// half, 2p + 1 in the high half) along the reduction dimension, in panels as wide as the register
// tile (bf16_gemm_kernel.h); the micro-kernel broadcasts a pair of A and multiplies it into
// 16 columns' pairs of B per instruction. An odd K is padded with a zero.
//
// Only on CPUs where cpu_has_avx512_bf16() holds (the kernel file alone is compiled for it);
// elsewhere the bf16 recipe stays emulated.
#pragma once

#include <cstdint>
#include <vector>

namespace moetron::cpu {

// True when the CPU has AVX512_BF16 and the AVX-512 F/BW/DQ/VL the kernel also uses.
bool cpu_has_avx512_bf16();

// Scratch of the packed operands: grows to the largest GEMM it has served and is reused after.
// One GEMM at a time per workspace.
struct Bf16GemmWorkspace {
    std::vector<uint32_t> a_pairs, b_pairs;
};

// C (M, N) = bf16(op(A)) bf16(op(B)) + beta C, row-major, with matmul()'s conventions (matmul.h):
// op(A) is (M, K), A stored (K, M) when trans_a; op(B) is (K, N), B stored (N, K) when trans_b.
// Runs on omp_get_max_threads() threads (one inside a parallel region). Needs
// cpu_has_avx512_bf16().
void bf16_matmul(Bf16GemmWorkspace& workspace, float* c, const float* a, const float* b, int64_t m,
                 int64_t n, int64_t k, bool trans_a, bool trans_b, float beta);

}  // namespace moetron::cpu
