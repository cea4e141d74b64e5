#!/usr/bin/env bash
# all_to_all_v bus bandwidth of moetron's communicator against a plain MPI_Alltoallv loop, and the
# progress-thread figure, under mpirun (bench/bench_a2a.cpp).
#   bench/run_a2a.sh [build_dir] [ranks] [extra benchmark flags...]
# e.g. bench/run_a2a.sh build 4 --benchmark_filter=A2A
set -euo pipefail
build_dir=${1:-build}
ranks=${2:-4}
shift $(( $# > 2 ? 2 : $# ))
exe="$build_dir/bench/bench_a2a"
[[ -x "$exe" ]] || { echo "run_a2a.sh: $exe not found; build the bench_a2a target first" >&2; exit 1; }
# Root is allowed for containers; one compute thread per rank so the ranks do not fight over cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun --oversubscribe -np "$ranks" -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
    "$exe" "$@"
