// Helpers for tests that launch `mpirun ... moetron` as a child process and signal its ranks.
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

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

// Starts `mpirun --oversubscribe ARGS...` as a child process, its stdout and stderr in log, with
// root allowed and one compute thread per rank; returns mpirun's pid. The child exits 126 when
// it cannot create the log and 127 when mpirun cannot start.
inline pid_t start_mpirun(const std::filesystem::path& log, const std::vector<std::string>& args) {
    const pid_t child = ::fork();
    if (child != 0) return child;
    const int fd = ::creat(log.c_str(), 0644);
    if (fd < 0) ::_exit(126);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    ::setenv("OMP_NUM_THREADS", "1", 1);
    std::vector<std::string> argv_strings = {"mpirun", "--oversubscribe"};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp("mpirun", argv.data());
    ::_exit(127);
}

}  // namespace moetron::testing
