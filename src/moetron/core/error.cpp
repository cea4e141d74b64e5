#include "moetron/core/error.h"

#include <cerrno>
#include <cstring>

namespace moetron::detail {

void check_failed(const char* file, int line, std::string_view expr, const std::string& message) {
    std::string where = fmt::format("{}:{}", file, line);
    if (expr.empty()) throw Error(fmt::format("{} ({})", message, where));
    throw Error(fmt::format("{} ({}, check: {})", message, where, expr));
}

std::string errno_message() {
    int saved = errno;
    return fmt::format("{} (errno {})", std::strerror(saved), saved);
}

}  // namespace moetron::detail
