#!/usr/bin/env bash
# The one place that holds the CMake arguments of tools/run.sh and tools/test.sh: both configure
# build/ the same way, so that `tools/run.sh` then `tools/test.sh` compiles only the tests.
#   tools/configure.sh              Release build in build/
#   tools/configure.sh --sanitize   AddressSanitizer + UBSan build in build-asan/
# Prints the build directory on stdout (CMake's own output goes to stderr).
set -euo pipefail
cd "$(dirname "$0")/.."

# A unity build: each room's sources compile in batches of 16, which parses the heavy headers
# (CLI11, nlohmann/json, fmt) once per batch instead of once per file (2.7x less compile time for
# the cli and train rooms, measured). A change to one file recompiles its batch: for editing, a
# plain build (README's cmake commands) is quicker.
unity=(-DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16)
case "${1:-}" in
  "")
    build_dir=build
    cmake_args=(-DCMAKE_BUILD_TYPE=Release "${unity[@]}")
    ;;
  --sanitize)
    build_dir=build-asan
    # The sanitizer build checks host code; the CUDA backend is compiled by the Release build.
    # -O1 -g1 (line tables for the reports): it compiles in half the time of -O2 -g with the
    # sanitizers on, which is most of CI's time budget.
    cmake_args=("${unity[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo
                "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
                -DMOETRON_SANITIZE=ON -DMOETRON_CUDA=OFF -DMOETRON_BUILD_BENCH=OFF)
    ;;
  *)
    echo "usage: tools/configure.sh [--sanitize]" >&2
    exit 2
    ;;
esac

cmake -S . -B "$build_dir" -G Ninja "${cmake_args[@]}" >&2
echo "$build_dir"
