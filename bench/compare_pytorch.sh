#!/usr/bin/env bash
# CPU training-step throughput, moetron vs PyTorch (Hugging Face DeepseekV3ForCausalLM), on the
# same preset, batch, sequence length and thread count, on this machine, as interleaved pairs
# (moetron, PyTorch, moetron, PyTorch, ...) so that drift in the machine's load hits both alike.
# Prints each run's JSON line and the ratio moetron / PyTorch of tokens/s as the median and
# min..max over the pairs (bench/ratio_stats.py; goal: >= 3).
#
#   bench/compare_pytorch.sh [--config PATH] [--batch-size B] [--seq-len S] [--threads T] [--steps N]
#                            [--pairs P] [--build DIR]
#
# Defaults: configs/models/small.toml, batch 4, seq 256, all cores, 3 timed steps (after one
# warm-up step on each side) per run, 5 pairs (at least 5), build dir build/. The moetron side
# runs without MTP, balance loss and router-bias update, which HF's model lacks
# (bench/pytorch_step.py's docstring). Without PyTorch and transformers it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

config=configs/models/small.toml
batch=4
seq=256
threads=$(nproc)
steps=3
pairs=5
build=build
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --seq-len) seq=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "compare_pytorch.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

if [ "$pairs" -lt 5 ]; then
  echo "compare_pytorch.sh: --pairs $pairs: a ratio needs at least 5 interleaved pairs" >&2
  exit 2
fi
if ! python3 -c 'import torch, transformers' 2>/dev/null; then
  echo "compare_pytorch.sh: PyTorch and transformers are not installed (python3 -c 'import torch," \
    "transformers' fails); nothing to compare against. Install them to run this comparison." >&2
  exit 0
fi

bench_bin="$build/bench/bench_train_step"
if [ ! -x "$bench_bin" ]; then
  echo "compare_pytorch.sh: $bench_bin not found; build it with" >&2
  echo "  cmake --build $build --target bench_train_step" >&2
  exit 1
fi

export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
tokens_per_s() { python3 -c 'import json, sys; print(json.loads(sys.argv[1])["tokens_per_s"])' "$1"; }
echo "== $config, batch $batch, seq $seq, $threads thread(s), $steps steps per run, $pairs pairs" >&2
ratios=""
for pair in $(seq 1 "$pairs"); do
  echo "== pair $pair/$pairs: moetron" >&2
  moetron_json=$("$bench_bin" --config "$config" --batch-size "$batch" --seq-len "$seq" \
    --threads "$threads" --steps "$steps" --no-mtp --no-balance | grep '^{"impl": "moetron"')
  echo "$moetron_json"
  echo "== pair $pair/$pairs: pytorch" >&2
  pytorch_json=$(python3 bench/pytorch_step.py --config "$config" --batch-size "$batch" \
    --seq-len "$seq" --threads "$threads" --warmup 1 --steps "$steps" | grep '^{')
  echo "$pytorch_json"
  ratios+="$(tokens_per_s "$moetron_json") $(tokens_per_s "$pytorch_json")"$'\n'
done
printf '%s' "$ratios" | bench/ratio_stats.py "moetron / pytorch tokens/s (goal >= 3)"
