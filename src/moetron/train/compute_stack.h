// The backends a run computes with, made once and the same for `moetron train` and
// bench_train_step: a CPU backend of the run's own (the scratch of its low-precision GEMMs is the
// run's), under a profiler when asked (--profile-ops), which then sees every op of the run,
// whatever the recipe: the precision is an argument of each GEMM call, not a layer of the stack.
#pragma once

#include <memory>
#include <string>

#include "moetron/core/precision.h"
#include "moetron/kernels/backend.h"
#include "moetron/kernels/profiling_backend.h"

namespace moetron {

class ComputeStack {
  public:
    explicit ComputeStack(bool profile_ops);

    // What the model and the optimizer run on.
    Backend& ops() { return profiler_ ? static_cast<Backend&>(*profiler_) : *device_; }
    // The profiler, with --profile-ops; null otherwise.
    ProfilingBackend* profiler() { return profiler_.get(); }
    // The run header's backend line: what computes, and how it runs the recipe's GEMMs.
    std::string describe(Precision precision) const;

  private:
    std::unique_ptr<Backend> device_;
    std::unique_ptr<ProfilingBackend> profiler_;
};

}  // namespace moetron
