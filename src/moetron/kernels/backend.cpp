#include "moetron/kernels/backend.h"

#include <fmt/format.h>

namespace moetron {

OpNotImplemented::OpNotImplemented(std::string_view backend, std::string_view op)
    : std::runtime_error(fmt::format("[{}] op '{}' has no {} kernel yet", backend, op, backend)) {}

namespace {

// Names the parameters of an op a backend does not have, so that they count as used.
template <typename... Args>
void unused(const Args&...) {}

}  // namespace

std::string Backend::describe_gemms(Precision format) const {
    return format == Precision::fp32 ? std::string("float32")
                                     : fmt::format("{} GEMMs: no kernel on the {} backend yet",
                                                   precision_name(format), name());
}

#define MOETRON_OP(ret, op, category, params, args) \
    ret Backend::op params {                        \
        unused args;                                \
        throw OpNotImplemented(name(), #op);        \
    }
#include "moetron/kernels/backend_ops.inc"

}  // namespace moetron
