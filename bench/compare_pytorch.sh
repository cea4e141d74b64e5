#!/usr/bin/env bash
# CPU training-step throughput, moetron vs PyTorch (Hugging Face DeepseekV3ForCausalLM), on the
# same preset, batch, sequence length and thread count, one after the other on this machine.
# Prints both JSON lines and the ratio moetron / PyTorch of tokens/s (goal: >= 3).
#
#   bench/compare_pytorch.sh [--config PATH] [--batch-size B] [--seq-len S] [--threads T] [--steps N]
#                            [--build DIR]
#
# Defaults: configs/models/small.toml, batch 4, seq 256, all cores, 3 timed steps (after one
# warm-up step on each side), build dir build/. The moetron side runs without MTP, balance loss
# and router-bias update, which HF's model lacks (bench/pytorch_step.py's docstring).
set -euo pipefail
cd "$(dirname "$0")/.."

config=configs/models/small.toml
batch=4
seq=256
threads=$(nproc)
steps=3
build=build
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --seq-len) seq=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "compare_pytorch.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

bench_bin="$build/bench/bench_train_step"
if [ ! -x "$bench_bin" ]; then
  echo "compare_pytorch.sh: $bench_bin not found; build it with" >&2
  echo "  cmake --build $build --target bench_train_step" >&2
  exit 1
fi

export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
echo "== moetron: $config, batch $batch, seq $seq, $threads thread(s), $steps steps" >&2
moetron_json=$("$bench_bin" --config "$config" --batch-size "$batch" --seq-len "$seq" \
  --threads "$threads" --steps "$steps" --no-mtp --no-balance | grep '^{"impl": "moetron"')
echo "$moetron_json"
echo "== pytorch: same settings" >&2
pytorch_json=$(python3 bench/pytorch_step.py --config "$config" --batch-size "$batch" --seq-len "$seq" \
  --threads "$threads" --warmup 1 --steps "$steps" | grep '^{')
echo "$pytorch_json"

python3 - "$moetron_json" "$pytorch_json" <<'PY'
import json, sys
m, p = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ratio = m["tokens_per_s"] / p["tokens_per_s"]
print(f"moetron {m['tokens_per_s']:.1f} tokens/s ({m['model_gflops_per_s']:.1f} model GFLOP/s, "
      f"MFU {100 * m['mfu']:.1f}%), pytorch {p['tokens_per_s']:.1f} tokens/s: "
      f"ratio {ratio:.2f}x (goal >= 3x)")
PY
