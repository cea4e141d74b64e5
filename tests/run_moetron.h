// Runs the moetron binary from a CLI test: its exit code and everything it printed.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace moetron::testing {

struct CliResult {
    int exit_code = -1;  // -1: killed by a signal, or the command could not start
    std::string text;    // stdout and stderr together
};

// Runs `sh -c "PREFIX MOETRON_BINARY ARGS 2>&1"`: args and prefix are shell text (quote paths
// that may hold spaces); prefix runs first in the same shell, e.g. "ulimit -f 100;".
inline CliResult run_moetron(const std::string& args, const std::string& prefix = "") {
    const std::string command = prefix + " " + MOETRON_BINARY + " " + args + " 2>&1";
    CliResult result;
    std::FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return result;
    std::array<char, 4096> buffer;
    size_t n;
    while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
        result.text.append(buffer.data(), n);
    const int status = ::pclose(pipe);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return result;
}

}  // namespace moetron::testing
