#!/usr/bin/env bash
# Installs dependencies, builds moetron with its tests, and runs the whole suite with ctest.
#   tools/test.sh              Release build in build/
#   tools/test.sh --sanitize   AddressSanitizer + UBSan build in build-asan/
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build
# A unity build: each room's sources compile in batches of 16, which parses the heavy headers
# (CLI11, nlohmann/json, fmt) once per batch instead of once per file (2.7x less compile time for
# the cli and train rooms, measured). A change to one file recompiles its batch: for editing, a
# plain build (README's cmake commands) is quicker.
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16)
ctest_args=()
if [ "${1:-}" = "--sanitize" ]; then
  build_dir=build-asan
  # Real training runs are covered by the Release pass; so are the 4-rank runs of the MPI
  # training and checkpoint tests (84 s of the sanitized suite's 289), whose 1- and 2-rank runs
  # check the same code under the sanitizers.
  ctest_args=(-LE slow -E "^test_mpi_(training|checkpoint)_np4$")
  # The sanitizer build checks host code; the CUDA backend is compiled by the Release build.
  # -O1 -g1 (line tables for the reports): it compiles in half the time of -O2 -g with the
  # sanitizers on, which is most of CI's time budget.
  cmake_args=(-DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
              -DMOETRON_SANITIZE=ON -DMOETRON_CUDA=OFF -DMOETRON_BUILD_BENCH=OFF)
fi

tools/install-deps.sh
cmake -S . -B "$build_dir" -G Ninja "${cmake_args[@]}"
cmake --build "$build_dir" -j2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "$build_dir" -j2 --output-on-failure --timeout 900 "${ctest_args[@]}"
