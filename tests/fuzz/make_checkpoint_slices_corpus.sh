#!/usr/bin/env bash
# Builds make_checkpoint_slices_corpus.cpp from just the sources it needs and writes the
# hand-made seeds of tests/fuzz/corpus/checkpoint_slices (valid-* and invalid-*). Rerun after
# changing a seed:
#   tests/fuzz/make_checkpoint_slices_corpus.sh
# Environment: CXX (default c++), FUZZ_BUILD_DIR (default build-fuzz).
set -euo pipefail
cd "$(dirname "$0")/../.."

build_dir="${FUZZ_BUILD_DIR:-build-fuzz}"
binary="$build_dir/make_checkpoint_slices_corpus"
mkdir -p "$build_dir"
"${CXX:-c++}" -std=c++20 -O1 -Wall -Wextra -Wpedantic -Werror -Isrc -Itests \
  tests/fuzz/make_checkpoint_slices_corpus.cpp \
  src/moetron/checkpoint/checkpoint_pieces.cpp \
  src/moetron/checkpoint/safetensors.cpp \
  src/moetron/checkpoint/checksum.cpp \
  src/moetron/checkpoint/atomic_dir.cpp \
  src/moetron/core/error.cpp \
  src/moetron/core/dtype.cpp \
  src/moetron/core/tensor.cpp \
  src/moetron/core/strings.cpp \
  -lfmt -o "$binary"
"$binary" tests/fuzz/corpus/checkpoint_slices
