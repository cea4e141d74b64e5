// A temporary directory that every rank of an MPI job sees (tests under mpirun).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "moetron/core/error.h"
#include "moetron/parallel/communicator.h"

namespace moetron::testing {

// A directory every rank of comm sees: made by rank 0, its name broadcast; removed on
// destruction after a barrier.
class SharedTempDir {
  public:
    explicit SharedTempDir(parallel::Communicator& comm) : comm_(comm) {
        std::string path;
        if (comm.rank() == 0) {
            std::string pattern =
                (std::filesystem::temp_directory_path() / "moetron_mpi_ckpt_XXXXXX").string();
            MT_CHECK(::mkdtemp(pattern.data()) != nullptr, "mkdtemp failed");
            path = pattern;
        }
        int64_t length = static_cast<int64_t>(path.size());
        comm.broadcast(&length, 1, DType::i64, 0, kHostStream);
        path.resize(static_cast<size_t>(length));
        comm.broadcast(path.data(), path.size(), DType::u8, 0, kHostStream);
        path_ = path;
    }
    ~SharedTempDir() {
        comm_.barrier();
        if (comm_.rank() == 0) std::filesystem::remove_all(path_);
    }
    const std::filesystem::path& path() const { return path_; }

  private:
    parallel::Communicator& comm_;
    std::filesystem::path path_;
};

}  // namespace moetron::testing
