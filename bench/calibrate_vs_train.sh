#!/usr/bin/env bash
# Predicted (moetron simulate on a cluster file written by moetron calibrate) vs measured
# (moetron train --log-jsonl) step time of the tiny and small presets on 1, 2 and 4 ranks.
#   bench/calibrate_vs_train.sh [build_dir] [ranks list] [models list]
# e.g. bench/calibrate_vs_train.sh build "1 2 4" "tiny small"
# Environment: THREADS (per rank; default: cores / ranks, at least 1), RUNS (training runs per
# case; default 3), STEPS (measured steps per run, after WARMUP_STEPS warm-up ones; default 200
# for tiny, 5 for small), WARMUP_STEPS (default 2), SMALL_BATCH / SMALL_SEQ (default 8 x 256, to
# keep a CPU run short), PAIRED (1: calibrate again before each run; default 0: once, first),
# CALIBRATE_FLAGS (added to every moetron calibrate, e.g. "--rounds 9"), OUT (work folder;
# default a temporary one).
# The machine is calibrated under the same mpirun as the runs it predicts (so the compute kernels
# are measured with the same number of ranks competing for the cores) and each model is
# simulated on that file with the same global batch, micro-batch (batch / N per rank), sequence
# length, precision fp32, the engine's AdamW state (fp32 moments) and its parameter all-gather
# (waited for before the next forward: --no-overlap-dp-param). Each case trains RUNS
# times with the default distributed layout (all data parallel, dpN), interleaved (run 1 of
# every case, then run 2, ...), so that a change of the machine's load falls on every case alike
# rather than on one. Paired, every run is
# calibrated right before it trains and compared with its own prediction, which keeps a slow
# drift of the machine's speed on both sides of each ratio and samples the calibration as often
# as the steps. A run's measured step time is the median of its steps after the warm-up; a case's
# is the median of its runs', its prediction the median of its calibrations' (one unpaired), and
# the error is their ratio - 1: each side's noise shrinks with its own repeats, where a median of
# per-run ratios keeps the noise of both. The table also gives the spread of the runs' medians
# (min-max), min..max of the per-run predicted / measured ratio (bench/ratio_stats.py, as the
# other ratio benchmarks print it) and the highest load average seen. tiny's default 200 steps
# (2-3 s a run) span the 2-core VM's speed swings, which last a fraction of a second to seconds
# (30-step windows of one run measured 9.6-15.5 ms), so one run no longer samples one swing;
# 20 steps did (run medians 10-18 ms). On a shared machine both
# the calibration and the steps are noisy: a spread of more than a few percent, or a load above
# the core count, means the row says little.
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
# Family / model / stepping tell apart CPUs that share a model name ("AMD EPYC" on a VM).
cpu_id=$(awk -F': *' '/^cpu family/ {f = $2} /^model[ \t]*:/ {m = $2} /^stepping/ {s = $2}
    END {if (f != "") printf "family %s model %s stepping %s", f, m, s}' /proc/cpuinfo)
cpu_model="${cpu_model:-unknown CPU}${cpu_id:+ ($cpu_id)}"
today=$(date -u +%Y-%m-%d)
echo "machine: $cpu_model, $cores cores, widest vector ISA $vector_isa, $today"
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

runs=${RUNS:-3}
paired=${PAIRED:-0}
warmup=${WARMUP_STEPS:-2}

run_median_ms() {  # the median step_ms of one run's JSONL log, after the warm-up steps
    python3 - "$1" "$warmup" <<'EOF'
import json, statistics, sys
ms = [json.loads(l)["step_ms"] for l in open(sys.argv[1]) if l.strip()][int(sys.argv[2]):]
if not ms:
    sys.exit(f"calibrate_vs_train.sh: {sys.argv[1]} has no step after the warm-up")
print(f"{statistics.median(ms):.3f}")
EOF
}

load_average() {  # the 1-minute load average
    cut -d' ' -f1 /proc/loadavg
}

# Calibrates n ranks into $out/local-np$n.$tag.toml and predicts every model whose batch splits
# over them: sets `fitting` to "model batch seq steps" of each and appends each prediction (ms)
# to predicted_runs[model-npN].
declare -A predicted_runs
calibrate_and_predict() {  # calibrate_and_predict n threads tag
    local n=$1 threads=$2 tag=$3
    local cluster="$out/local-np$n.$tag.toml"
    echo "== $n rank(s), $threads thread(s) per rank: calibrating -> $cluster (load $(load_average))"
    # shellcheck disable=SC2086  # CALIBRATE_FLAGS is a list of words
    launch "$n" "$exe" calibrate --out "$cluster" --threads "$threads" ${CALIBRATE_FLAGS:-} |
        sed 's/^/   /'
    fitting=()
    local model config batch seq steps sim_json predicted
    for model in $models; do
        config="configs/models/$model.toml"
        if [[ $model == small ]]; then
            batch=${SMALL_BATCH:-8}
            seq=${SMALL_SEQ:-256}
            steps=${STEPS:-5}
        else
            batch=$(sed -n 's/^batch_size *= *\([0-9]*\).*/\1/p' "$config")
            seq=$(sed -n 's/^seq_len *= *\([0-9]*\).*/\1/p' "$config")
            steps=${STEPS:-200}
        fi
        if (( batch % n != 0 )); then
            echo "   $model: batch $batch does not split over $n ranks; skipped"
            continue
        fi
        sim_json="$out/$model-np$n.$tag.sim.json"
        # The engine waits for every parameter all-gather at the end of the step (its optimizer
        # posts them bucket by bucket), where Megatron-LM, the sim's default, overlaps them with
        # the next forward: --no-overlap-dp-param simulates the engine's order.
        "$exe" simulate --cluster "$cluster" --config "$config" --gpus "$n" --layout tp1 \
            --gbs "$batch" --mbs $(( batch / n )) --seq-len "$seq" --precision fp32 \
            --exp-avg-dtype fp32 --exp-avg-sq-dtype fp32 --no-overlap-dp-param --json > "$sim_json"
        predicted=$(python3 -c "import json,sys; print(f'{json.load(open(sys.argv[1]))[\"step_time_s\"] * 1e3:.3f}')" "$sim_json")
        predicted_runs[$model-np$n]+="$predicted "
        echo "   $model dp$n batch $batch seq $seq: predicted $predicted ms"
        fitting+=("$model $batch $seq $steps")
    done
}

threads_for() {  # threads per rank for n ranks
    echo "${THREADS:-$(( cores / $1 > 0 ? cores / $1 : 1 ))}"
}

# The cases. Unpaired (the default), each rank count is calibrated once, first, and every run is
# compared with that prediction; paired (PAIRED=1), each run calibrates again right before it
# trains and is compared with its own prediction.
cases=()  # "ranks threads model batch seq steps"
for n in $ranks_list; do
    threads=$(threads_for "$n")
    calibrate_and_predict "$n" "$threads" run1
    for f in "${fitting[@]}"; do cases+=("$n $threads $f"); done
done

# The measurements: run r of every case before run r + 1 of any.
declare -A run_medians max_load
for (( r = 1; r <= runs; ++r )); do
    echo "== run $r of $runs"
    for n in $ranks_list; do
        threads=$(threads_for "$n")
        if (( r > 1 && paired )); then
            calibrate_and_predict "$n" "$threads" "run$r"
        elif (( r > 1 )); then
            for c in "${cases[@]}"; do  # the one prediction again, for this run's ratio
                read -r cn _ model _ <<< "$c"
                [[ $cn == "$n" ]] || continue
                predicted_runs[$model-np$n]+="${predicted_runs[$model-np$n]%% *} "
            done
        fi
        for c in "${cases[@]}"; do
            read -r cn threads model batch seq steps <<< "$c"
            [[ $cn == "$n" ]] || continue
            log="$out/$model-np$n.run$r.jsonl"
            layout_flag=()
            [[ $n == 1 ]] || layout_flag=(--layout "dp$n")
            launch "$n" "$exe" train --config "configs/models/$model.toml" --steps $(( steps + warmup )) \
                --batch-size "$batch" --seq-len "$seq" --eval-every 0 --threads "$threads" \
                "${layout_flag[@]}" --log-jsonl "$log" > "$out/$model-np$n.run$r.train.txt"
            median=$(run_median_ms "$log")
            load=$(load_average)
            run_medians[$model-np$n]+="$median "
            max_load[$model-np$n]=$(python3 -c "import sys; print(max(map(float, sys.argv[1:])))" \
                "$load" "${max_load[$model-np$n]:-0}")
            echo "   $model dp$n: median of $steps steps $median ms (load $load)"
        done
    done
done

echo
pairing="one calibration per rank count"
(( paired )) && pairing="each run calibrated right before it trains (PAIRED=1)"
echo "predicted vs measured step time (simulate on the calibrated file vs moetron train; $runs" \
    "interleaved runs per case, $pairing; a run's step is the median of its steps after" \
    "$warmup warm-up); work files in $out"
rows=()
for c in "${cases[@]}"; do
    read -r n threads model batch seq steps <<< "$c"
    key=$model-np$n
    # shellcheck disable=SC2086  # the predictions and run medians are one word each
    read -r predicted measured run_min run_max <<< "$(python3 -c '
import statistics, sys
cut = sys.argv.index("--")
predicted = [float(x) for x in sys.argv[1:cut]]
medians = [float(x) for x in sys.argv[cut + 1:]]
print(f"{statistics.median(predicted):.3f} {statistics.median(medians):.3f} {min(medians):.0f} {max(medians):.0f}")
' ${predicted_runs[$key]} -- ${run_medians[$key]})"
    # The error: the two sides' medians. The spread: predicted / measured of each run (paired:
    # against its own calibration), min..max over the runs (bench/ratio_stats.py).
    # shellcheck disable=SC2086
    ratio_line=$(paste -d' ' <(printf '%s\n' ${predicted_runs[$key]}) <(printf '%s\n' ${run_medians[$key]}) |
        bench/ratio_stats.py "$model dp$n predicted / measured")
    ratio_range=$(sed -n 's/.*(min\.\.max \([0-9.]*\.\.[0-9.]*\) over.*/\1/p' <<< "$ratio_line")
    err=$(python3 -c "import sys; print(f'{100 * (float(sys.argv[1]) / float(sys.argv[2]) - 1):+.1f}%')" \
        "$predicted" "$measured")
    echo "$ratio_line; median predicted / median measured $predicted / $measured: $err"
    rows+=("$(printf '| %s, %s cores, %s | %s | %-5s | %5s | %7s | %5s x %-4s | %10s | %10s | %2s x %-3s | %9s | %5s | %7s | %s |' "$cpu_model" "$cores" "$vector_isa" "$today" "$model" "$n" "$threads" "$batch" "$seq" "$predicted" "$measured" "$runs" "$steps" "$run_min-$run_max" "${max_load[$key]}" "$err" "$ratio_range")")
done
busiest=$(python3 -c "import sys; print(max(map(float, sys.argv[1:])))" "${max_load[@]}" 0)
if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" \
    "$busiest" "$cores"; then
    echo "the machine was loaded (load up to $busiest on $cores cores): these rows say little" \
        "about the model; measure again on an idle machine"
fi
echo
echo "| machine | date | model | ranks | threads | batch x seq | predicted ms | measured ms | runs x steps | run medians ms | max load | error | predicted / measured, min..max over runs |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "$r"; done
