#include "moetron/kernels/cuda/cuda_check.h"

#include "moetron/core/error.h"

namespace moetron::cuda::detail {

void call_failed(const char* file, int line, const char* call, const char* library, int code,
                 const char* message) {
    moetron::detail::check_failed(file, line, call,
                                  fmt::format("[{}] {} ({})", library, message, code));
}

void argument_failed(const char* file, int line, const char* message) {
    moetron::detail::check_failed(file, line, "", fmt::format("[cuda] {}", message));
}

}  // namespace moetron::cuda::detail
