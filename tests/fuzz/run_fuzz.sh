#!/usr/bin/env bash
# Builds the safetensors fuzzer with clang (libFuzzer + AddressSanitizer + UBSan) from just the
# sources it needs, replays the committed corpus, then fuzzes for a bounded time.
#   tests/fuzz/run_fuzz.sh [SECONDS]       default 60; 0 only builds and replays
# Environment: CLANGXX (default clang++-14, else clang++), FUZZ_BUILD_DIR (default build-fuzz),
# FUZZ_JOBS (parallel fuzzing processes, default 1).
# New inputs go to $FUZZ_BUILD_DIR/corpus-safetensors, never into the committed corpus; a crash
# leaves $FUZZ_BUILD_DIR/crash-<sha1>, and the script exits non-zero. To keep new inputs, merge
# them by hand (the committed corpus stays small, < 100 files):
#   $FUZZ_BUILD_DIR/fuzz_safetensors -merge=1 tests/fuzz/corpus/safetensors \
#       $FUZZ_BUILD_DIR/corpus-safetensors
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds="${1:-60}"
build_dir="${FUZZ_BUILD_DIR:-build-fuzz}"
jobs="${FUZZ_JOBS:-1}"
clangxx="${CLANGXX:-}"
if [ -z "$clangxx" ]; then
  if command -v clang++-14 >/dev/null; then clangxx=clang++-14; else clangxx=clang++; fi
fi
corpus=tests/fuzz/corpus/safetensors
scratch="$build_dir/corpus-safetensors"
binary="$build_dir/fuzz_safetensors"
mkdir -p "$build_dir" "$scratch"

sources=(
  tests/fuzz/fuzz_safetensors.cpp
  src/moetron/train/safetensors.cpp
  src/moetron/train/checksum.cpp
  src/moetron/train/atomic_dir.cpp
  src/moetron/core/error.cpp
  src/moetron/core/dtype.cpp
  src/moetron/core/tensor.cpp
)
# shellcheck disable=SC2054  # the commas are inside -fsanitize=...
flags=(-std=c++20 -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wpedantic -Werror
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -Isrc -Itests)
# Rebuild only when a source or header is newer than the binary.
inputs=("${sources[@]}" src/moetron/core/*.h src/moetron/train/{safetensors,checksum,atomic_dir}.h
        tests/fuzz/safetensors_check.h)
if [ ! -x "$binary" ] || [ -n "$(find "${inputs[@]}" -newer "$binary" | head -1)" ]; then
  echo "fuzz: building $binary with $clangxx"
  "$clangxx" "${flags[@]}" "${sources[@]}" -lfmt -o "$binary"
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
common=(-dict=tests/fuzz/safetensors.dict -max_len=4096 -timeout=10 -rss_limit_mb=2048
        -artifact_prefix="$build_dir/")

echo "fuzz: replaying $(find "$corpus" -type f | wc -l) committed inputs"
"$binary" "${common[@]}" -runs=0 "$corpus"

if [ "$seconds" -gt 0 ]; then
  echo "fuzz: fuzzing for $seconds s ($jobs job(s))"
  if [ "$jobs" -gt 1 ]; then
    "$binary" "${common[@]}" -max_total_time="$seconds" -print_final_stats=1 \
      -jobs="$jobs" -workers="$jobs" "$scratch" "$corpus"
  else
    "$binary" "${common[@]}" -max_total_time="$seconds" -print_final_stats=1 \
      "$scratch" "$corpus"
  fi
fi
echo "fuzz: done, no crash"
