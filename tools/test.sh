#!/usr/bin/env bash
# Installs dependencies, builds moetron with its tests, and runs the whole suite with ctest.
#   tools/test.sh              Release build in build/ (the one tools/run.sh builds)
#   tools/test.sh --sanitize   AddressSanitizer + UBSan build in build-asan/
# tools/configure.sh holds the CMake arguments of both.
set -euo pipefail
cd "$(dirname "$0")/.."

configure_args=()
ctest_args=()
if [ "${1:-}" = "--sanitize" ]; then
  configure_args=(--sanitize)
  # Real training runs are covered by the Release pass; so are the 4-rank runs of the MPI
  # training and checkpoint tests (84 s of the sanitized suite's 289), whose 1- and 2-rank runs
  # check the same code under the sanitizers.
  ctest_args=(-LE slow -E "^test_mpi_(training|checkpoint)_np4$")
fi

tools/install-deps.sh
build_dir=$(tools/configure.sh "${configure_args[@]}")
cmake --build "$build_dir" -j2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "$build_dir" -j2 --output-on-failure --timeout 900 "${ctest_args[@]}"
