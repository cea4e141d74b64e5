#!/usr/bin/env bash
# Flat against two-tier expert dispatch on the two-node test bed (tools/testbed/): 2 emulated
# hosts x 4 ranks, each host one scale-up domain (shared memory inside, a shaped TCP link between),
# top-8 of 64 experts, hidden 1024, uniform routing. Prints `moetron bench a2a --json`: time per
# dispatch+combine, intra- and inter-domain bytes, busbw, and the measured vs analytic
# inter-domain byte ratio (issue 5's targets: ratio within 2% of the analytic 0.367, time <= 0.67x
# flat). Needs root (network namespaces); tears the bed down on exit, whatever happens.
#   bench/testbed_a2a.sh [build_dir] [extra `moetron bench a2a` options]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift $(( $# > 0 ? 1 : 0 ))
exe="$(cd "$build_dir" && pwd)/moetron"
[[ -x "$exe" ]] || { echo "testbed_a2a.sh: $exe not found; build moetron first" >&2; exit 1; }
trap 'tools/testbed/testbed.sh down >/dev/null' EXIT
tools/testbed/testbed.sh up --nodes 2 --ranks-per-node 4
export OMP_NUM_THREADS=1
tools/testbed/testbed.sh run -- "$exe" bench a2a --json --domain-size 4 --experts 64 --top-k 8 \
    --hidden 1024 --tokens-per-rank 1024 --iterations 10 --warmup 2 "$@"
