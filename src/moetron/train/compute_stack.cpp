#include "moetron/train/compute_stack.h"

#include <fmt/format.h>

#include "moetron/kernels/cpu/cpu_backend.h"

namespace moetron {

ComputeStack::ComputeStack(bool profile_ops) : device_(make_cpu_backend()) {
    if (profile_ops) profiler_ = std::make_unique<ProfilingBackend>(*device_);
}

std::string ComputeStack::describe(Precision precision) const {
    std::string line = device_->describe();
    if (precision != Precision::fp32)
        line += fmt::format("; precision {}: {}", precision_name(precision),
                            device_->describe_gemms(precision));
    return line;
}

}  // namespace moetron
