// Errors in what a user gave (a flag, a file, a config value): MT_USER_CHECK / MT_USER_THROW
// throw UserError, whose message says what to change and nothing about our sources. Invariants
// and failures of the program or the system keep MT_CHECK / MT_THROW (core/error.h), whose report
// adds the source file, line and condition that a bug report needs.
#pragma once

#include <fmt/format.h>

#include "moetron/core/error.h"

namespace moetron {

// A mistake in the user's input; the message alone tells the user what to change. An Error, so
// every handler of Error handles it too.
class UserError : public Error {
  public:
    using Error::Error;
};

}  // namespace moetron

// MT_USER_CHECK(cond, "format {}", args...): throws moetron::UserError when cond is false.
#define MT_USER_CHECK(cond, ...)                                    \
    do {                                                            \
        if (!(cond)) [[unlikely]] {                                 \
            throw ::moetron::UserError(::fmt::format(__VA_ARGS__)); \
        }                                                           \
    } while (0)

// MT_USER_THROW("format {}", args...): unconditional UserError.
#define MT_USER_THROW(...) throw ::moetron::UserError(::fmt::format(__VA_ARGS__))
