#include "moetron/kernels/backend.h"

#include <fmt/format.h>

namespace moetron {

OpNotImplemented::OpNotImplemented(std::string_view backend, std::string_view op)
    : std::runtime_error(fmt::format("[{}] op '{}' has no {} kernel yet", backend, op, backend)) {}

}  // namespace moetron
