// Helpers for tests that launch `mpirun ... moetron` as a child process and signal its ranks.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include "temp_dir.h"

namespace moetron::testing {

// True when mpirun is on the PATH. Also readies the environment the jobs inherit: Open MPI's
// components leave allocations behind at MPI_Finalize, which LeakSanitizer would report in the
// sanitizer build and fail the ranks for (as tests/mpi/CMakeLists.txt says for the MPI tests);
// an ASAN_OPTIONS someone set is kept.
inline bool mpirun_available() {
    ::setenv("ASAN_OPTIONS", "detect_leaks=0", /*overwrite=*/0);
    return std::system("command -v mpirun > /dev/null 2>&1") == 0;
}

// The process started by mpirun (pid parent) as MPI rank `rank`: its parent in /proc/PID/stat
// and OMPI_COMM_WORLD_RANK in its environment. 0 when none.
inline pid_t rank_process(pid_t parent, int rank) {
    namespace fs = std::filesystem;
    const std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
    for (const auto& entry : fs::directory_iterator("/proc")) {
        const std::string name = entry.path().filename().string();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        const std::string stat = read_file(entry.path() / "stat");
        const size_t close = stat.rfind(')');
        if (close == std::string::npos) continue;
        std::istringstream fields(stat.substr(close + 1));
        std::string state;
        long ppid = 0;
        fields >> state >> ppid;
        if (ppid != parent) continue;
        std::string environ = read_file(entry.path() / "environ");
        std::replace(environ.begin(), environ.end(), '\0', '\n');
        if (environ.find("\n" + want + "\n") != std::string::npos ||
            environ.starts_with(want + "\n"))
            return static_cast<pid_t>(std::stol(name));
    }
    return 0;
}

}  // namespace moetron::testing
