// The subcommands of the moetron binary. Each lives in its own file and adds itself to the
// CLI11 app through one register_* function listed in commands.cpp.
#pragma once

namespace CLI {
class App;
}

#include <string>

namespace moetron::cli {

// What the build is, for `moetron --version`: main.cpp fills it from the header the build
// generates (cmake/write_build_info.cmake), so that a new commit relinks only the binary.
struct BuildInfo {
    const char* version = "";       // the project's (CMakeLists.txt)
    const char* git_describe = "";  // `git describe --tags --always --dirty`; "" outside git
    const char* build_type = "";    // CMAKE_BUILD_TYPE
    const char* cuda = "";          // "" without the CUDA backend, else e.g. "CUDA 12.4, archs 90"
    const char* mpi = "";           // "" without MPI, else e.g. "MPI 3.1"
};

// The lines `moetron --version` prints.
std::string version_text(const BuildInfo& build);

// Parses argv, runs the chosen subcommand, returns the process exit code.
int run(int argc, char** argv, const BuildInfo& build);

void register_info(CLI::App& app);       // moetron info: parameters, FLOPs and memory of a config
void register_train(CLI::App& app);      // moetron train: single-process training
void register_prepare(CLI::App& app);    // moetron prepare: text -> byte-level token shard
void register_sample(CLI::App& app);     // moetron sample: generate text from saved weights
void register_simulate(CLI::App& app);   // moetron simulate: predict a step on a GPU cluster
void register_plan(CLI::App& app);       // moetron plan: search layouts for a GPU cluster
void register_export(CLI::App& app);     // moetron export: checkpoint -> Hugging Face dir
void register_import(CLI::App& app);     // moetron import: Hugging Face dir -> checkpoint
void register_calibrate(CLI::App& app);  // moetron calibrate: measure this machine for simulate
void register_bench(CLI::App& app);      // moetron bench a2a: flat vs two-tier dispatch (mpirun)

}  // namespace moetron::cli
