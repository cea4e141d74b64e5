// The op seam: every piece of math and data movement on tensors that model/, parallel/ and train/
// do goes through a Backend, and a Backend owns the memory its tensors live in. The ops are
// declared once, in backend_ops.inc; each throws OpNotImplemented here, and a backend overrides
// those it has kernels for. The CPU backend (kernels/cpu/cpu_backend.h) implements every op and
// is the reference; the CUDA backend (kernels/cuda/cuda_backend.h) implements part of them, and
// the op-parity harness (tests/) reports the rest as skipped.
//
// Conventions (kernels/README.md): pointers are into this backend's memory; outputs first, then
// inputs, then saved statistics, then dimensions; parameter gradients accumulate, activation
// gradients are written; a null output gradient skips its computation. Each op's semantics are
// documented once, at the CPU reference of its name (cpu::<op>). A GEMM's number format is an
// argument of the call (GemmPrecision, op_types.h), never a property of the backend. Work is
// ordered by stream(): on the CPU every call has finished when it returns; on a GPU it runs in
// issue order on the stream, and the communicator calls that touch the same buffers take the
// same stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "moetron/core/precision.h"
#include "moetron/core/stream.h"
#include "moetron/core/tensor.h"
#include "moetron/kernels/op_types.h"

namespace moetron {

class MemoryResource;  // core/arena.h

// Thrown by a backend for an op it has no kernel for (the CUDA backend, for now, for several).
class OpNotImplemented : public std::runtime_error {
  public:
    OpNotImplemented(std::string_view backend, std::string_view op);
};

class Backend {
  public:
    virtual ~Backend() = default;

    // ---- identity, memory, ordering (not ops) ----
    virtual std::string_view name() const = 0;  // "cpu", "cuda"
    virtual Device device() const = 0;
    // One line for a run's header: what computes ("cpu: OpenBLAS 0.3.21 ... kernels Haswell",
    // "cuda: NVIDIA H200 (device 0, 139.8 GiB)"), plus a warning when the setup is known slow.
    virtual std::string describe() const = 0;
    // How this backend runs GEMMs in `format` (for the run header: "native AVX512_BF16 ...",
    // "E4M3 in 32-element blocks ..., dequantized into the float32 GEMM").
    virtual std::string describe_gemms(Precision format) const;
    // Where this backend's arenas come from (core/arena.h): host memory or cudaMalloc.
    virtual MemoryResource& memory() = 0;
    virtual Stream stream() const = 0;

    // ---- the ops (backend_ops.inc), each throwing OpNotImplemented unless the backend has it ----
#define MOETRON_OP(ret, op, category, params, args) virtual ret op params;
#include "moetron/kernels/backend_ops.inc"
};

// The shared CPU backend (cpu/cpu_backend.h), for set-up code, tools and tests; a run makes its
// own with make_cpu_backend, which owns the scratch of its low-precision GEMMs.
Backend& cpu_backend();

}  // namespace moetron
