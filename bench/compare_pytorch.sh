#!/usr/bin/env bash
# CPU training-step throughput, moetron vs PyTorch (Hugging Face DeepseekV3ForCausalLM), on the
# same preset, batch, sequence length and thread count, on this machine, as interleaved runs
# (moetron, PyTorch fp32, PyTorch bf16, moetron, ...) so that drift in the machine's load hits
# every side alike. PyTorch runs in each of its CPU configurations (float32, and bf16 mixed
# precision as HF's Trainer --bf16 runs it: bench/pytorch_step.py --precision bf16); each pair
# compares moetron with the faster of them in that round and says which it was. Prints each
# run's JSON line, one line per pair, and the ratio moetron / best PyTorch of tokens/s as the
# median and min..max over the pairs (bench/ratio_stats.py; goal: >= 3), labeled with both sides'
# precisions.
#
#   bench/compare_pytorch.sh [--config PATH] [--batch-size B] [--seq-len S] [--threads T] [--steps N]
#                            [--pairs P] [--build DIR] [--precision fp32|bf16|mxfp8|fp8-blockwise]
#                            [--pytorch-precisions "fp32 bf16"]
#
# Defaults: configs/models/small.toml, batch 4, seq 256, all cores, 3 timed steps (after one
# warm-up step on each side) per run, 5 pairs (at least 5), build dir build/, PyTorch in fp32 and
# bf16. moetron's --precision defaults to the fastest it runs natively here: bf16 where the CPU
# has AVX512_BF16 (and neither MOETRON_CPU_ISA=avx2 nor MOETRON_BF16_GEMM=emulated hides it),
# else fp32, because without the native kernel bf16 is emulated (rounded copies into the float32
# GEMM) and slower than fp32. The moetron side runs without MTP, balance loss and router-bias
# update, which HF's model lacks (bench/pytorch_step.py's docstring). Without PyTorch and
# transformers it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

config=configs/models/small.toml
batch=4
seq=256
threads=$(nproc)
steps=3
pairs=5
build=build
precision=""
pytorch_precisions="fp32 bf16"
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --seq-len) seq=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    --pytorch-precisions) pytorch_precisions=$2; shift 2 ;;
    *) echo "compare_pytorch.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

if [ "$pairs" -lt 5 ]; then
  echo "compare_pytorch.sh: --pairs $pairs: a ratio needs at least 5 interleaved pairs" >&2
  exit 2
fi
for p in $pytorch_precisions; do
  case "$p" in
    fp32 | bf16) ;;
    *) echo "compare_pytorch.sh: --pytorch-precisions: '$p' is not fp32 or bf16" >&2; exit 2 ;;
  esac
done
if [ -z "$pytorch_precisions" ]; then
  echo "compare_pytorch.sh: --pytorch-precisions is empty; give fp32, bf16 or both" >&2
  exit 2
fi
if [ -z "$precision" ]; then
  if grep -qw avx512_bf16 /proc/cpuinfo && [ "${MOETRON_CPU_ISA:-}" != avx2 ] &&
    [ "${MOETRON_BF16_GEMM:-}" != emulated ]; then
    precision=bf16
  else
    precision=fp32
  fi
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
tokens_per_s() {
  python3 -c 'import json, sys; print("%.1f" % json.loads(sys.argv[1])["tokens_per_s"])' "$1"
}
echo "== $config, batch $batch, seq $seq, $threads thread(s), $steps steps per run, $pairs pairs;" \
  "moetron $precision, PyTorch $pytorch_precisions" >&2
ratios=""
best_counts=""
for pair in $(seq 1 "$pairs"); do
  echo "== pair $pair/$pairs: moetron ($precision)" >&2
  moetron_json=$("$bench_bin" --config "$config" --batch-size "$batch" --seq-len "$seq" \
    --threads "$threads" --steps "$steps" --no-mtp --no-balance --precision "$precision" |
    grep '^{"impl": "moetron"')
  echo "$moetron_json"
  moetron_tps=$(tokens_per_s "$moetron_json")
  best_tps=0
  best_precision=""
  summary=""
  for p in $pytorch_precisions; do
    echo "== pair $pair/$pairs: pytorch ($p)" >&2
    pytorch_json=$(python3 bench/pytorch_step.py --config "$config" --batch-size "$batch" \
      --seq-len "$seq" --threads "$threads" --warmup 1 --steps "$steps" --precision "$p" |
      grep '^{')
    echo "$pytorch_json"
    tps=$(tokens_per_s "$pytorch_json")
    summary+=", pytorch $p $tps"
    if python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)' \
      "$tps" "$best_tps"; then
      best_tps=$tps
      best_precision=$p
    fi
  done
  echo "pair $pair: moetron $precision $moetron_tps$summary tokens/s; PyTorch's best: $best_precision" >&2
  ratios+="$moetron_tps $best_tps"$'\n'
  best_counts+="$best_precision"$'\n'
done
echo "PyTorch's faster configuration, per pair: $(printf '%s' "$best_counts" | sort | uniq -c |
  awk '{printf "%s%s in %d", (NR > 1 ? ", " : ""), $2, $1}')" >&2
printf '%s' "$ratios" |
  bench/ratio_stats.py "moetron $precision / PyTorch best of ($pytorch_precisions), per pair, tokens/s (goal >= 3)"
