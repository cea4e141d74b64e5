#!/usr/bin/env bash
# Step time and exposed all-to-all time of `moetron train` with the MoE overlap off, shared and
# dual (--moe-overlap, src/moetron/model/moe.h), on the 2-node test bed (tools/testbed/README.md:
# 2 emulated nodes x 4 ranks, the link between them shaped), layout ep8 with one scale-up domain
# per node (--domain-size 4), for --dispatch two_tier and flat. The model is
# bench/moe_overlap.toml (MoE bytes that matter next to the compute). Each variant runs `repeats`
# times, the runs interleaved (off, shared, dual, off, ...) so that load from other work on the
# machine falls on both; the first 2 steps of a run are warm-up. Prints, per variant, the median
# over the remaining steps of rank 0's step_ms and expert_comm_ms (the time the step thread was
# blocked in dispatch/combine: the exposed all-to-all), and shared / off and dual / off.
#
#   bench/testbed_moe_overlap.sh [build_dir] [steps] [repeats]     (root: the bed needs it)
#
# The bed shares the machine's cores with everything else: on a small shared machine the figures
# are noisy; compare the ratios of one run of this script, not figures across runs.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$repo/build}" && pwd)
steps=${2:-8}
repeats=${3:-2}
exe="$build/moetron"
testbed="$repo/tools/testbed/testbed.sh"
[[ -x "$exe" ]] || { echo "testbed_moe_overlap.sh: $exe not found; build moetron first" >&2; exit 1; }
(( steps > 2 )) || { echo "testbed_moe_overlap.sh: steps must be > 2 (2 are warm-up)" >&2; exit 1; }

out=$(mktemp -d /tmp/moe_overlap.XXXXXX)
cleanup() {
    "$testbed" down >/dev/null || echo "testbed_moe_overlap.sh: testbed.sh down failed" >&2
    rm -rf "$out"
}
trap cleanup EXIT
"$testbed" up --nodes 2 --ranks-per-node 4
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

for dispatch in two_tier flat; do
    for ((r = 0; r < repeats; ++r)); do
        for overlap in off shared dual; do
            name="$dispatch.$overlap.$r"
            echo "== $dispatch, --moe-overlap $overlap, run $((r + 1)) of $repeats"
            if ! "$testbed" run -- "$exe" train --config "$repo/bench/moe_overlap.toml" \
                --steps "$steps" --layout ep8 --domain-size 4 --dispatch "$dispatch" \
                --moe-overlap "$overlap" --log-jsonl "$out/$name.jsonl" >"$out/$name.log" 2>&1; then
                cat "$out/$name.log" >&2
                exit 1
            fi
            grep -m1 "experts:" "$out/$name.log" || true
        done
    done
done

python3 - "$out" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
rows = {}
for path in sorted(glob.glob(os.path.join(out, "*.jsonl"))):
    dispatch, overlap, _ = os.path.basename(path).split(".")[:3]
    steps = [json.loads(line) for line in open(path) if line.strip()]
    steps = [s for s in steps if "step_ms" in s][2:]  # the first 2 steps are warm-up
    r = rows.setdefault((dispatch, overlap), {"step_ms": [], "expert_comm_ms": []})
    for key in r:
        r[key] += [s[key] for s in steps if key in s]
med = {k: {key: statistics.median(v) for key, v in r.items() if v} for k, r in rows.items()}
print(f"\n{'dispatch':<10}{'overlap':<9}{'steps':>6}{'step_ms':>10}{'expert_comm_ms':>16}")
order = {"off": 0, "shared": 1, "dual": 2}
for (dispatch, overlap), m in sorted(med.items(), key=lambda kv: (kv[0][0] != "two_tier", order[kv[0][1]])):
    n = len(rows[(dispatch, overlap)]["step_ms"])
    print(f"{dispatch:<10}{overlap:<9}{n:>6}{m['step_ms']:>10.1f}{m.get('expert_comm_ms', float('nan')):>16.1f}")
print("\nmedians of rank 0's steps, against overlap off:")
for dispatch in ("two_tier", "flat"):
    off = med.get((dispatch, "off"))
    for overlap in ("shared", "dual"):
        m = med.get((dispatch, overlap))
        if off and m:
            print(f"  {dispatch:<9} {overlap:<7} / off: step_ms {m['step_ms'] / off['step_ms']:.3f}"
                  f"   expert_comm_ms {m['expert_comm_ms'] / off['expert_comm_ms']:.3f}")
PY
