// Runs the moetron binary for the CLI tests: its exit code and its stdout and stderr together.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace moetron::testing {

struct CliOutput {
    int exit_code = -1;
    std::string text;  // stdout and stderr together
};

inline CliOutput run_cli(const std::string& args) {
    const std::string command = std::string(MOETRON_BINARY) + " " + args + " 2>&1";
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

#define EXPECT_CONTAINS(haystack, needle) \
    EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)
#define EXPECT_LACKS(haystack, needle) \
    EXPECT_EQ(std::string(haystack).find(needle), std::string::npos) << (haystack)
