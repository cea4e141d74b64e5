#!/usr/bin/env bash
# Gradient-sync overlap on vs off in the same run, under mpirun (bench/bench_grad_sync.cpp): the
# steps of the two modes interleave (--steps pairs, default 6, at least 5) and the step time ratio
# on / off is printed as the median and min..max over the pairs.
#   bench/run_grad_sync.sh [build_dir] [ranks] [bench flags...]
# e.g. bench/run_grad_sync.sh build 4 --zero1 --bucket-mb 2
set -euo pipefail
build_dir=${1:-build}
ranks=${2:-4}
shift $(( $# > 2 ? 2 : $# ))
exe="$(cd "$build_dir" && pwd)/bench/bench_grad_sync"
cd "$(dirname "$0")/.."  # the default --config is relative to the repository root
[[ -x "$exe" ]] || { echo "run_grad_sync.sh: $exe not found; build the bench_grad_sync target first" >&2; exit 1; }
# Root is allowed for containers; one compute thread per rank so the ranks do not fight over cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun --oversubscribe -np "$ranks" -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
    "$exe" "$@"
