// Errors: one family of checks that throw moetron::Error with file, line and an [op] prefix.
// MT_CHECK is for invariants and user input; MPI_CHECK / CUDA_CHECK / NCCL_CHECK live beside
// their libraries (parallel/, kernels/cuda/) and build on check_failed() below.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace moetron {

class Error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

namespace detail {
// Builds "[op] message (file:line, check: expr)" and throws. Out of line to keep call sites small.
[[noreturn]] void check_failed(const char* file, int line, std::string_view expr,
                               const std::string& message);
}  // namespace detail

}  // namespace moetron

// MT_CHECK(cond, "format {}", args...): throws moetron::Error when cond is false.
#define MT_CHECK(cond, ...)                                              \
    do {                                                                 \
        if (!(cond)) [[unlikely]] {                                      \
            ::moetron::detail::check_failed(__FILE__, __LINE__, #cond,   \
                                            ::fmt::format(__VA_ARGS__)); \
        }                                                                \
    } while (0)

// MT_THROW("format {}", args...): unconditional failure with the same report.
#define MT_THROW(...) \
    ::moetron::detail::check_failed(__FILE__, __LINE__, "", ::fmt::format(__VA_ARGS__))

// MT_CHECK_ERRNO(ok, what): for C library calls that report failure through errno.
#define MT_CHECK_ERRNO(ok, what) \
    MT_CHECK(ok, "[io] {} failed: {}", what, ::moetron::detail::errno_message())

namespace moetron::detail {
std::string errno_message();
}
