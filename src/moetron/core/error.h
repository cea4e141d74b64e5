// Errors: one family of checks that throw moetron::Error with an [op] prefix.
// MT_CHECK / MT_THROW are for invariants and failures of the program or the system: their report
// adds the source file, line and condition, which a bug report needs. MT_USER_CHECK /
// MT_USER_THROW are for a user's mistake (a flag, a file, a config value): they throw UserError,
// whose message says what to change and nothing about our sources. MPI_CHECK / CUDA_CHECK /
// NCCL_CHECK live beside their libraries (parallel/, kernels/cuda/) and build on check_failed().
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

// A mistake in the user's input; the message alone tells the user what to change.
class UserError : public Error {
  public:
    using Error::Error;
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

// MT_USER_CHECK(cond, "format {}", args...): throws moetron::UserError when cond is false.
#define MT_USER_CHECK(cond, ...)                                         \
    do {                                                                 \
        if (!(cond)) [[unlikely]] {                                      \
            throw ::moetron::UserError(::fmt::format(__VA_ARGS__));      \
        }                                                                \
    } while (0)

// MT_USER_THROW("format {}", args...): unconditional UserError.
#define MT_USER_THROW(...) throw ::moetron::UserError(::fmt::format(__VA_ARGS__))

// MT_CHECK_ERRNO(ok, what): for C library calls that report failure through errno.
#define MT_CHECK_ERRNO(ok, what) \
    MT_CHECK(ok, "[io] {} failed: {}", what, ::moetron::detail::errno_message())

namespace moetron::detail {
std::string errno_message();
}
