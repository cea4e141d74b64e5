// An anonymous in-memory file for the fuzz checks (fuzz/*_check.h): each input goes through the
// real open() path of a reader without touching the disk.
#pragma once

#include <sys/mman.h>

#include <string>

#include "moetron/checkpoint/atomic_dir.h"
#include "moetron/core/error.h"

namespace moetron::fuzz {

// An anonymous in-memory file, reachable by path through /proc, so each input goes through the
// real open() path without touching the disk.
class MemoryFile {
  public:
    MemoryFile() : fd_(::memfd_create("moetron-fuzz", MFD_CLOEXEC)) {
        MT_CHECK(fd_.valid(), "[fuzz] memfd_create failed: {}", detail::errno_message());
        path_ = "/proc/self/fd/" + std::to_string(fd_.get());
    }
    const std::string& path() const { return path_; }
    int fd() const { return fd_.get(); }

  private:
    UniqueFd fd_;
    std::string path_;
};

}  // namespace moetron::fuzz
