#!/usr/bin/env bash
# Predicted (moetron simulate on a cluster file written by moetron calibrate) vs measured
# (moetron train --log-jsonl) step time of the tiny and small presets on 1, 2 and 4 ranks.
#   bench/calibrate_vs_train.sh [build_dir] [ranks list] [models list]
# e.g. bench/calibrate_vs_train.sh build "1 2 4" "tiny small"
# Environment: THREADS (per rank; default: cores / ranks, at least 1), STEPS (measured steps after
# the warm-up ones; default 8 for tiny, 3 for small), SMALL_BATCH / SMALL_SEQ (default 8 x 256,
# to keep a CPU run short), OUT (work folder; default a temporary one).
# For each rank count the machine is calibrated once under the same mpirun (so the compute
# kernels are measured with the same number of ranks competing for the cores), then each model
# trains with the default distributed layout (all data parallel, dpN) and is simulated with the
# same global batch, micro-batch (batch / N per rank), sequence length and precision fp32.
# The measured step time is the median over the steps after the first two (warm-up); the table
# also gives their spread (min-max) and the machine's load average, since a shared machine
# makes both the calibration and the measured steps noisy (a spread of more than a few percent,
# or a load above the core count, means the row says little).
# Each row names the machine (CPU model, cores, widest vector ISA) and the date, so that rows
# measured on different machines of a kind can be appended to one table
# (docs/cluster-model.md, "The model of this machine").
set -euo pipefail
build_dir=${1:-build}
ranks_list=${2:-"1 2 4"}
models=${3:-"tiny small"}
exe="$(cd "$build_dir" && pwd)/moetron"
cd "$(dirname "$0")/.."
[[ -x "$exe" ]] || { echo "calibrate_vs_train.sh: $exe not found; build the moetron target" >&2; exit 1; }
out=${OUT:-$(mktemp -d /tmp/calibrate_vs_train.XXXXXX)}
mkdir -p "$out"
cores=$(nproc)
cpu_model=$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo | head -1)
cpu_flags=$(sed -n 's/^flags[[:space:]]*: *//p' /proc/cpuinfo | head -1)
vector_isa=scalar
for isa in avx2 avx512f avx512_bf16; do
    [[ " $cpu_flags " == *" $isa "* ]] && vector_isa=$isa
done
today=$(date -u +%Y-%m-%d)
echo "machine: ${cpu_model:-unknown CPU}, $cores cores, widest vector ISA $vector_isa, $today"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

launch() {  # launch N cmd...: plain on one rank, mpirun otherwise
    local n=$1
    shift
    if [[ $n == 1 ]]; then
        "$@"
    else
        mpirun --oversubscribe --bind-to none -np "$n" "$@"
    fi
}

median_step_ms() {  # the median step_ms of a JSONL log, skipping the first two steps
    python3 - "$1" <<'EOF'
import json, sys
ms = [json.loads(l)["step_ms"] for l in open(sys.argv[1]) if l.strip()]
ms = ms[2:] if len(ms) > 2 else ms
ms.sort()
print(f"{ms[len(ms) // 2]:.3f}")
EOF
}

step_spread() {  # "min-max" of the same steps, in ms
    python3 -c '
import json, sys
ms = [json.loads(l)["step_ms"] for l in open(sys.argv[1]) if l.strip()]
ms = ms[2:] if len(ms) > 2 else ms
print(f"{min(ms):.0f}-{max(ms):.0f}")' "$1"
}

load_average() {  # the 1-minute load average
    cut -d' ' -f1 /proc/loadavg
}

rows=()
for n in $ranks_list; do
    threads=${THREADS:-$(( cores / n > 0 ? cores / n : 1 ))}
    cluster="$out/local-np$n.toml"
    echo "== $n rank(s), $threads thread(s) per rank: calibrating -> $cluster"
    launch "$n" "$exe" calibrate --out "$cluster" --threads "$threads" | sed 's/^/   /'
    for model in $models; do
        config="configs/models/$model.toml"
        if [[ $model == small ]]; then
            batch=${SMALL_BATCH:-8}
            seq=${SMALL_SEQ:-256}
            steps=$(( ${STEPS:-3} + 2 ))
        else
            batch=$(sed -n 's/^batch_size *= *\([0-9]*\).*/\1/p' "$config")
            seq=$(sed -n 's/^seq_len *= *\([0-9]*\).*/\1/p' "$config")
            steps=$(( ${STEPS:-8} + 2 ))
        fi
        if (( batch % n != 0 )); then
            echo "   $model: batch $batch does not split over $n ranks; skipped"
            continue
        fi
        log="$out/$model-np$n.jsonl"
        layout_flag=()
        [[ $n == 1 ]] || layout_flag=(--layout "dp$n")
        launch "$n" "$exe" train --config "$config" --steps "$steps" --batch-size "$batch" \
            --seq-len "$seq" --eval-every 0 --threads "$threads" "${layout_flag[@]}" \
            --log-jsonl "$log" > "$out/$model-np$n.train.txt"
        measured=$(median_step_ms "$log")
        spread=$(step_spread "$log")
        load=$(load_average)
        sim_json="$out/$model-np$n.sim.json"
        "$exe" simulate --cluster "$cluster" --config "$config" --gpus "$n" --layout tp1 \
            --gbs "$batch" --mbs $(( batch / n )) --seq-len "$seq" --precision fp32 --json > "$sim_json"
        predicted=$(python3 -c "import json,sys; print(f'{json.load(open(sys.argv[1]))[\"step_time_s\"] * 1e3:.3f}')" "$sim_json")
        err=$(python3 -c "import sys; p, m = map(float, sys.argv[1:]); print(f'{100 * (p - m) / m:+.1f}%')" "$predicted" "$measured")
        echo "   $model dp$n batch $batch seq $seq: predicted $predicted ms, measured $measured ms" \
            "($err; steps $spread ms, load $load on $cores cores)"
        rows+=("$(printf '| %s, %s cores, %s | %s | %-5s | %5s | %7s | %5s x %-4s | %10s | %10s | %9s | %5s | %7s |' "${cpu_model:-unknown CPU}" "$cores" "$vector_isa" "$today" "$model" "$n" "$threads" "$batch" "$seq" "$predicted" "$measured" "$spread" "$load" "$err")")
    done
done
echo
echo "predicted vs measured step time (simulate on the calibrated file vs moetron train); work files in $out"
echo "| machine | date | model | ranks | threads | batch x seq | predicted ms | measured ms | steps ms | load | error |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "$r"; done
