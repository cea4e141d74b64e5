#include "moetron/checkpoint/output_paths.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/core/error.h"
#include "moetron/core/user_error.h"

namespace moetron {

namespace fs = std::filesystem;

namespace {

// The directory a file path lies in ("." for a bare name).
fs::path directory_of(const fs::path& file) {
    const fs::path parent = file.parent_path();
    return parent.empty() ? fs::path(".") : parent;
}

// Creates and removes a file in dir: the one sure test that dir takes new files (read-only
// mounts, permissions, quotas of inodes alike; access() would say yes to root on a read-only
// directory).
void check_takes_new_files(const fs::path& dir, const PathOption& option) {
    const fs::path probe = staging_path_for(dir / "write-check", this_process_writer());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        const int error = errno;
        MT_USER_THROW("{} '{}': cannot create files in '{}': {}", option.flag, option.path.string(),
                      dir.string(), std::strerror(error));
    }
    ::close(fd);
    ::unlink(probe.c_str());
}

}  // namespace

void check_output_file(const PathOption& output) {
    MT_USER_CHECK(!output.path.empty(), "{} needs a file name", output.flag);
    std::error_code ec;
    MT_USER_CHECK(!fs::is_directory(output.path, ec),
                  "{} '{}' is a directory; give the name of a file to write", output.flag,
                  output.path.string());
    const fs::path dir = directory_of(output.path);
    const fs::file_status status = fs::status(dir, ec);
    MT_USER_CHECK(fs::exists(status), "{} '{}': the directory '{}' does not exist", output.flag,
                  output.path.string(), dir.string());
    MT_USER_CHECK(fs::is_directory(status), "{} '{}': '{}' is not a directory", output.flag,
                  output.path.string(), dir.string());
    check_takes_new_files(dir, output);
}

void prepare_output_dir(const PathOption& output) {
    MT_USER_CHECK(!output.path.empty(), "{} needs a directory name", output.flag);
    std::error_code ec;
    const fs::file_status status = fs::status(output.path, ec);
    MT_USER_CHECK(!fs::exists(status) || fs::is_directory(status),
                  "{} '{}' is a file, not a directory", output.flag, output.path.string());
    if (!fs::exists(status)) {
        fs::create_directories(output.path, ec);
        MT_USER_CHECK(!ec, "{} '{}': cannot create the directory: {}", output.flag,
                      output.path.string(), ec.message());
    }
    check_takes_new_files(output.path, output);
}

bool same_file(const fs::path& a, const fs::path& b) {
    if (a.empty() || b.empty()) return false;
    std::error_code ec;
    if (fs::exists(a, ec) && fs::exists(b, ec)) {
        const bool same = fs::equivalent(a, b, ec);
        if (!ec) return same;
    }
    // Absolute first: weakly_canonical leaves a relative path relative when no part of it
    // exists, and "new.bin" would not match "./sub/../new.bin".
    const fs::path ca = fs::weakly_canonical(fs::absolute(a, ec), ec);
    if (ec) return false;
    const fs::path cb = fs::weakly_canonical(fs::absolute(b, ec), ec);
    return !ec && ca == cb;
}

void refuse_same_file(const PathOption& output, const std::vector<PathOption>& others) {
    for (const PathOption& other : others)
        MT_USER_CHECK(!same_file(output.path, other.path),
                      "{} '{}' is the same file as {} '{}': writing one would destroy the other; "
                      "choose another {}",
                      output.flag, output.path.string(), other.flag, other.path.string(),
                      output.flag);
}

}  // namespace moetron
