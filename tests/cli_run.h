// Runs the moetron binary for the CLI tests: its exit code and its stdout and stderr together.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "expect_contains.h"

namespace moetron::testing {

struct CliOutput {
    int exit_code = -1;  // -1: killed by a signal, or the command could not start
    std::string text;    // stdout and stderr together
};

// Runs `sh -c "PREFIX MOETRON_BINARY ARGS 2>&1"`: args and prefix are shell text (quote paths
// that may hold spaces); prefix runs first in the same shell, e.g. "ulimit -f 100;".
inline CliOutput run_cli(const std::string& args, const std::string& prefix = "") {
    const std::string command = prefix + " " + MOETRON_BINARY + " " + args + " 2>&1";
    CliOutput out;
    std::FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return out;
    std::array<char, 4096> buffer;
    size_t n;
    while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
        out.text.append(buffer.data(), n);
    const int status = ::pclose(pipe);
    out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return out;
}

}  // namespace moetron::testing
