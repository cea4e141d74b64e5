#!/usr/bin/env bash
# Step time of two builds of bench_train_step on the same preset, in interleaved pairs on this
# machine (A, B, A, B, ...), so that load drifts hit both sides alike. Prints each pair's step
# times and the median and spread of the ratio B / A (above 1: B is slower; bench/ratio_stats.py).
#
#   bench/compare_step_time.sh BENCH_A BENCH_B [--config PATH] [--batch-size B] [--seq-len S]
#                              [--steps N] [--pairs P] [--threads T] [--precision P]
#
# BENCH_A/B are bench_train_step binaries (e.g. a copy saved from the commit before a change,
# and build/bench/bench_train_step). Defaults: configs/models/small.toml, batch 2, seq 256,
# 2 timed steps per run, 5 pairs, all cores, fp32.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
bench_a=$1 bench_b=$2
shift 2
config=configs/models/small.toml batch=2 seq=256 steps=2 pairs=5 threads=$(nproc) precision=fp32
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --seq-len) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    *) echo "compare_step_time.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for b in "$bench_a" "$bench_b"; do
  [ -x "$b" ] || { echo "compare_step_time.sh: '$b' is not an executable" >&2; exit 2; }
done

export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
step_ms() {
  "$1" --config "$config" --batch-size "$batch" --seq-len "$seq" --steps "$steps" \
    --threads "$threads" --precision "$precision" 2>/dev/null | grep '^{"impl": "moetron"' |
    python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["step_ms_median"])'
}
echo "$config, batch $batch, seq $seq, $precision, $threads thread(s), $steps steps per run, $pairs pairs" >&2
results=()
for ((i = 1; i <= pairs; ++i)); do
  a=$(step_ms "$bench_a")
  b=$(step_ms "$bench_b")
  echo "pair $i: A $a ms, B $b ms" >&2
  results+=("$a,$b")
done
for r in "${results[@]}"; do echo "${r#*,} ${r%,*}"; done |
  bench/ratio_stats.py "step time B / A (above 1: B is slower)"
