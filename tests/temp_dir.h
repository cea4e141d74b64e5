// Test fixtures for code that touches files: a fresh directory per test, removed with everything
// in it when the test ends, a whole file as text, and the message of the moetron::Error a
// callable throws.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "moetron/core/error.h"

namespace moetron::testing {

// <tmp>/moetron_<suite>_<test>_<pid>: unique per test and per process, since ctest runs test
// processes in parallel.
class TempDir {
  public:
    TempDir() {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        const std::string test =
            info != nullptr ? std::string(info->test_suite_name()) + "_" + info->name() : "none";
        path_ = std::filesystem::temp_directory_path() /
                ("moetron_" + test + "_" + std::to_string(::getpid()));
        std::filesystem::remove_all(path_);
        std::filesystem::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ignored;  // a destructor must not throw
        std::filesystem::remove_all(path_, ignored);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    const std::filesystem::path& path() const { return path_; }
    std::string file(const std::string& name) const { return (path_ / name).string(); }

  private:
    std::filesystem::path path_;
};

// The whole file at path ("" when it cannot be read: the caller's expectation then fails).
inline std::string read_file(const std::filesystem::path& path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

// The message of the moetron::Error that f() throws, or "(no error)".
template <class F>
std::string error_of(const F& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

}  // namespace moetron::testing
