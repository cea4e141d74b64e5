// Writing one file atomically: readers, and a crash at any moment, see the old content or the
// new one, never a part (atomic_dir.h does the same for checkpoint directories).
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace moetron {

// write(staging_path) writes the whole content to path's staging name (the same directory; see
// atomic_dir.h's staging names: writer names who writes, "" for this process), which is then
// fsync'ed, renamed over path, and the directory fsync'ed. If write throws (a full disk, say) or
// the rename fails (path is a directory, say), the staging file is removed and path is left as
// it was.
void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(const std::string& staging_path)>& write,
                           std::string_view writer = {});

}  // namespace moetron
