#include "moetron/train/atomic_file.h"

#include <cstdio>

#include "moetron/core/error.h"
#include "moetron/train/atomic_dir.h"

namespace moetron {

namespace fs = std::filesystem;

void write_file_atomically(const fs::path& path,
                           const std::function<void(const std::string& staging_path)>& write) {
    const fs::path staging = staging_path_for(path, this_process_writer());
    const std::string name = staging.string();
    try {
        write(name);
        UniqueFd fd = open_for_reading(name);  // the writer may not have fsync'ed
        fsync_fd(fd.get(), name);
        fd.close(name);
        MT_CHECK(std::rename(name.c_str(), path.c_str()) == 0,
                 "[io] renaming '{}' to '{}' failed: {}", name, path.string(),
                 detail::errno_message());
    } catch (...) {
        std::error_code ignored;  // the first error is the one to report
        fs::remove(staging, ignored);
        throw;
    }
    fsync_directory(path.parent_path());
}

}  // namespace moetron
