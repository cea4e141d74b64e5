#!/usr/bin/env bash
# Builds the fuzzers with clang (libFuzzer + AddressSanitizer + UBSan) from just the sources they
# need, replays their committed corpora, then splits the time between them:
#   fuzz_safetensors        the safetensors reader and writer    corpus/safetensors
#   fuzz_checkpoint_slices  the sharded-checkpoint reader        corpus/checkpoint_slices
#   fuzz_token_shard        the token-file reader                corpus/token_shard
#   fuzz_config             presets, config.json, [train], CLI   corpus/config
#                           numbers
#   tests/fuzz/run_fuzz.sh [SECONDS]       default 60 in all; 0 only builds and replays
# Environment: CLANGXX (default clang++-14, else clang++), FUZZ_BUILD_DIR (default build-fuzz),
# FUZZ_JOBS (parallel fuzzing processes, default 1).
# New inputs go to $FUZZ_BUILD_DIR/corpus-<name>, never into the committed corpora; a crash
# leaves $FUZZ_BUILD_DIR/crash-<sha1>, and the script exits non-zero. To keep new inputs, merge
# them by hand (a committed corpus stays small, < 100 files), e.g.:
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
mkdir -p "$build_dir"
build_dir="$(cd "$build_dir" && pwd)"  # absolute: parallel jobs run from inside it

# The library sources every target links; each target adds its own.
common_sources=(
  src/moetron/checkpoint/safetensors.cpp
  src/moetron/checkpoint/checksum.cpp
  src/moetron/checkpoint/atomic_dir.cpp
  src/moetron/core/error.cpp
  src/moetron/core/dtype.cpp
  src/moetron/core/tensor.cpp
  src/moetron/core/strings.cpp
)
# shellcheck disable=SC2054  # the commas are inside -fsanitize=...
flags=(-std=c++20 -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wpedantic -Werror
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -DTOML_HEADER_ONLY=0 -DTOML_SHARED_LIB=1 -Isrc -Itests)
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# Each source compiles once into $build_dir/obj/ (the common ones are shared by every target), as
# many at a time as there are cores; an object is rebuilt when its source or any header is newer.
headers=(src/moetron/core/*.h src/moetron/checkpoint/*.h src/moetron/train/*.h src/moetron/model/*.h
         src/moetron/cli/*.h tests/fuzz/*.h)
object_of() { echo "$build_dir/obj/${1%.cpp}.o"; }
stale() {  # stale OUTPUT INPUT...: OUTPUT is missing or older than an input
  [ ! -e "$1" ] || [ -n "$(find "${@:2}" -newer "$1" | head -1)" ]
}
compile_objects() {
  local stale_sources=()
  for source in "$@"; do
    if stale "$(object_of "$source")" "$source" "${headers[@]}"; then stale_sources+=("$source"); fi
  done
  [ ${#stale_sources[@]} -gt 0 ] || return 0
  echo "fuzz: compiling ${#stale_sources[@]} source(s) with $clangxx"
  export clangxx build_dir
  export flags_line="${flags[*]}"
  printf '%s\n' "${stale_sources[@]}" | xargs -P "$(nproc)" -I{} bash -c \
    'out="$build_dir/obj/${1%.cpp}.o"; mkdir -p "$(dirname "$out")";
     $clangxx $flags_line -c "$1" -o "$out.tmp" && mv "$out.tmp" "$out"' _ {}
}
# link NAME EXTRA_SOURCE...: links $build_dir/fuzz_NAME when one of its objects is newer.
link() {
  local name="$1"
  shift
  local binary="$build_dir/fuzz_$name" objects=()
  for source in "tests/fuzz/fuzz_$name.cpp" "$@" "${common_sources[@]}"; do
    objects+=("$(object_of "$source")")
  done
  if stale "$binary" "${objects[@]}"; then
    echo "fuzz: linking $binary"
    "$clangxx" "${flags[@]}" "${objects[@]}" -lfmt -ltomlplusplus -o "$binary"
  fi
}

# replay NAME CORPUS DICT MAX_LEN / fuzz NAME CORPUS DICT MAX_LEN SECONDS
options() {
  echo -dict="$1" -max_len="$2" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$build_dir/"
}
replay() {
  local name="$1" corpus="$2"
  echo "fuzz: $name: replaying $(find "$corpus" -type f | wc -l) committed inputs"
  # shellcheck disable=SC2046  # options are single words
  "$build_dir/fuzz_$name" $(options "$3" "$4") -runs=0 "$corpus"
}
fuzz() {
  local name="$1" corpus="$PWD/$2" dict="$PWD/$3" budget="$5"
  local scratch="$build_dir/corpus-$name"
  mkdir -p "$scratch"
  echo "fuzz: $name: fuzzing for $budget s ($jobs job(s))"
  local parallel=()
  if [ "$jobs" -gt 1 ]; then parallel=(-jobs="$jobs" -workers="$jobs"); fi
  # From inside the build folder: parallel jobs write their fuzz-N.log to the working directory.
  # shellcheck disable=SC2046  # options are single words
  if ! (cd "$build_dir" && "$build_dir/fuzz_$name" $(options "$dict" "$4") \
          -max_total_time="$budget" -print_final_stats=1 "${parallel[@]}" "$scratch" "$corpus"); then
    [ "$jobs" -gt 1 ] && tail -n 40 "$build_dir"/fuzz-*.log
    return 1
  fi
}

checkpoint_slices_sources=(src/moetron/checkpoint/checkpoint_pieces.cpp)
token_shard_sources=(src/moetron/train/token_shard.cpp)
config_sources=(src/moetron/model/config.cpp src/moetron/checkpoint/train_config.cpp
                src/moetron/cli/number_options.cpp)
compile_objects "${common_sources[@]}" "${checkpoint_slices_sources[@]}" \
  "${token_shard_sources[@]}" "${config_sources[@]}" tests/fuzz/fuzz_safetensors.cpp \
  tests/fuzz/fuzz_checkpoint_slices.cpp tests/fuzz/fuzz_token_shard.cpp tests/fuzz/fuzz_config.cpp
link safetensors
link checkpoint_slices "${checkpoint_slices_sources[@]}"
link token_shard "${token_shard_sources[@]}"
link config "${config_sources[@]}"
safetensors=(safetensors tests/fuzz/corpus/safetensors tests/fuzz/safetensors.dict 4096)
slices=(checkpoint_slices tests/fuzz/corpus/checkpoint_slices tests/fuzz/checkpoint_slices.dict 8192)
token_shard=(token_shard tests/fuzz/corpus/token_shard tests/fuzz/token_shard.dict 2048)
config=(config tests/fuzz/corpus/config tests/fuzz/config.dict 4096)
# Every replay comes first, so a regression in any corpus fails before any fuzzing.
targets=(safetensors slices token_shard config)
for target in "${targets[@]}"; do
  declare -n args="$target"
  replay "${args[@]}"
done
if [ "$seconds" -gt 0 ]; then
  # An equal share each; the last target gets what the division leaves.
  share=$((seconds / ${#targets[@]}))
  spent=0
  for target in "${targets[@]}"; do
    declare -n args="$target"
    budget=$share
    [ "$target" = "${targets[-1]}" ] && budget=$((seconds - spent))
    fuzz "${args[@]}" "$budget"
    spent=$((spent + budget))
  done
fi
echo "fuzz: done, no crash"
