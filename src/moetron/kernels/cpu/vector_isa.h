// Which vector instructions the CPU kernels with a run-time choice use (the small GEMMs of
// small_gemm.h, and through them attention): AVX-512 on a CPU with AVX-512 F/BW/DQ/VL, else AVX2,
// the build's baseline (x86-64-v3), so one binary runs on both.
//
// MOETRON_CPU_ISA=avx2 in the environment forces the AVX2 kernels on an AVX-512 CPU, so that such
// a machine can measure what an AVX2-only one runs (BLAS has its own switch, OPENBLAS_CORETYPE,
// see blas_info.h). MOETRON_CPU_ISA=avx512 on a CPU without AVX-512 is an error, as is any other
// value; unset or empty, the CPU decides.
#pragma once

namespace moetron::cpu {

enum class VectorIsa { kAvx2, kAvx512 };

// The choice for this process, made once (from the CPU and MOETRON_CPU_ISA) on first use.
VectorIsa vector_isa();

// The choice for a CPU with or without AVX-512 and a MOETRON_CPU_ISA value (null when unset).
// Throws UserError for a value it does not know or for avx512 on a CPU without it.
VectorIsa choose_vector_isa(bool cpu_avx512, const char* requested);

// "avx2" or "avx512".
const char* vector_isa_name(VectorIsa isa);

// "avx512", or "avx2" with " (forced by MOETRON_CPU_ISA)" when the CPU has AVX-512: the run
// header's note of what the vector kernels run.
const char* describe_vector_isa();

}  // namespace moetron::cpu
