// The bf16 recipe's GEMM on CPUs with AVX512_BF16: both inputs rounded to bfloat16 (nearest even,
// as round_to_bf16 does) while they are packed, then multiplied with vdpbf16ps, which adds the
// exact products of two bfloat16 pairs into float32 lanes. The result is therefore the emulated
// recipe's (round both inputs, float32 GEMM) up to the order of the float32 additions. Two
// differences the instructions impose, both below anything a bf16 GEMM can resolve: subnormal
// inputs count as zero (vcvtne2ps2bf16 flushes float32 subnormals while packing, vdpbf16ps
// bfloat16 ones) and float32 subnormal partial sums are flushed to zero.
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

#include "moetron/kernels/cpu/matmul.h"

namespace moetron::cpu {

// True when the CPU has AVX512_BF16 and the AVX-512 F/BW/DQ/VL the kernel also uses.
bool cpu_has_avx512_bf16();

// C (m, n) = bf16(op(A)) bf16(op(B)) + beta C: matmul.h's Gemm, its operands rounded to bf16.
using Bf16Matmul = Gemm;

// Scratch of the packed operands, one pair of buffers per thread that packs: grows to the largest
// GEMM it has served and is reused after. One call at a time per workspace.
struct Bf16GemmWorkspace {
    struct Buffers {
        std::vector<uint32_t> a_pairs, b_pairs;
    };
    std::vector<Buffers> per_thread;
};

// One GEMM on omp_get_max_threads() threads (one inside a parallel region, or for small ones).
// Needs cpu_has_avx512_bf16().
void bf16_matmul(Bf16GemmWorkspace& workspace, const Bf16Matmul& gemm);

// Many independent GEMMs (the experts' of a grouped linear layer): whole GEMMs handed to threads
// when there are enough of them to keep every thread busy (as matmul.cpp's grouped GEMM does),
// else one after the other, each on all threads. Empty GEMMs (m or n zero) cost nothing.
void bf16_matmul_batch(Bf16GemmWorkspace& workspace, const Bf16Matmul* gemms, int64_t count);

}  // namespace moetron::cpu
