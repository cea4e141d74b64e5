// ProfilingBackend: a decorator over any Backend that forwards every op to it unchanged, counts the
// calls per op and accumulates each op's wall time, so that a training step's time can be broken
// down by op and by category (attention, GEMMs, grouped GEMMs, ...) with format_op_profile().
// GEMMs are kept apart by the number format of the call (GemmPrecision): under a low-precision
// recipe the router's float32 GEMMs and the layers' bf16 or FP8 ones are two rows. On the CPU a
// low-precision GEMM's time includes the quantization of its operands.
//
// Timing: on the CPU every op has finished when it returns, so the time around the call is the
// op's. On a device backend ops only enqueue work; there the decorator synchronizes before and
// after each op to time it, which serializes the stream (no overlap of compute with
// communication) -- profile for the breakdown, not for the step time.
//
// Nothing allocates while profiling: the totals live in a fixed array indexed by op and format.
// The numbers are read (format_op_profile) after the measured steps, never printed inside them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "moetron/kernels/backend_ops.h"
#include "moetron/kernels/forwarding_backend.h"

namespace moetron {

class ProfilingBackend final : public ForwardingBackend {
  public:
    struct OpTotals {
        int64_t calls = 0;
        double seconds = 0;
    };

    explicit ProfilingBackend(Backend& inner = cpu_backend());

    // Calls of `op` since the last reset, in every format (0 for one never called); throws for a
    // name that is no Backend op.
    int64_t calls(std::string_view op) const;
    // Totals of one op in one format (every op but the GEMMs counts as float32).
    const OpTotals& totals(BackendOp op, Precision format = Precision::fp32) const {
        return totals_[static_cast<size_t>(op)][static_cast<size_t>(format)];
    }
    void reset();
    // While paused, ops are forwarded but not counted (a training run's validations, so that its
    // profile is of its steps, as bench_train_step's is).
    void set_paused(bool paused) { paused_ = paused; }
    // Times memory() was asked for (each arena asks once): not an op, so only counted.
    int64_t memory_requests() const { return memory_requests_; }
    MemoryResource& memory() override {
        ++memory_requests_;
        return inner_.memory();
    }

#define MOETRON_OP(ret, op, category, params, args) ret op params override;
#include "moetron/kernels/backend_ops.inc"

  private:
    template <typename Call>
    decltype(auto) timed(BackendOp op, Precision format, Call&& call);

    const bool synchronize_around_ops_;  // a device backend: ops are asynchronous
    std::array<std::array<OpTotals, kNumPrecisions>, kNumBackendOps> totals_{};
    int64_t memory_requests_ = 0;
    bool paused_ = false;
};

// The table of where a step's time goes: per category and, under each, per op (and GEMM format),
// in ms per step, % of the step and calls per step, for totals accumulated over `steps` steps
// that took `step_seconds` in all (ops the backend does not see -- communication, host code --
// make up the rest of the step).
std::string format_op_profile(const ProfilingBackend& profile, int64_t steps, double step_seconds);

}  // namespace moetron
