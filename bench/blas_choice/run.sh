#!/usr/bin/env bash
# Builds and runs the OpenBLAS vs oneDNN comparison on moetron's training GEMM shapes.
# Needs libopenblas-dev and libdnnl-dev. Not part of the main build: the product does not
# depend on oneDNN. Usage: bench/blas_choice/run.sh [min_seconds_per_measurement]
#
# Each library runs in its own process (their thread pools would steal each other's cores), first
# on one thread timed in thread CPU time (a per-core figure that holds on a busy machine), then on
# all cores in wall time (meaningful only on a quiet machine).
#
# OpenBLAS picks its kernels when it loads, from OPENBLAS_CORETYPE if set, else from its cpuid
# table. This project's machines set OPENBLAS_CORETYPE=Haswell (AVX2) in their environment, while
# OpenBLAS's own choice on their AMD Zen 5 CPUs is Cooperlake (AVX-512): both are measured, plus
# SkylakeX forced, so that the table does not depend on the caller's environment.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${TMPDIR:-/tmp}/moetron-blas-choice"
mkdir -p "$build"
g++ -std=c++20 -O2 -march=x86-64-v3 -fopenmp -Wall -Wextra -Werror \
    $(pkg-config --cflags openblas) "$here/blas_choice.cpp" -o "$build/blas_choice" \
    $(pkg-config --libs openblas) -ldnnl
for threads in one all; do
    echo "######## threads: $threads"
    echo "== oneDNN"
    "$build/blas_choice" onednn "$threads" "$@"
    echo "== OpenBLAS, OPENBLAS_CORETYPE=Haswell (AVX2 kernels; this project's machines set it)"
    OPENBLAS_CORETYPE=Haswell "$build/blas_choice" openblas "$threads" "$@"
    echo "== OpenBLAS, OPENBLAS_CORETYPE unset (its own CPU detection)"
    env -u OPENBLAS_CORETYPE "$build/blas_choice" openblas "$threads" "$@"
    echo "== OpenBLAS, OPENBLAS_CORETYPE=SkylakeX (AVX-512 kernels)"
    OPENBLAS_CORETYPE=SkylakeX "$build/blas_choice" openblas "$threads" "$@"
    echo
done
