#!/usr/bin/env python3
"""Trains tiny on Tiny Shakespeare in the four precisions and compares them.

usage: tools/low_precision_convergence.py [--binary build/moetron] [--steps 1500]
           [--text FILE] [--out-dir /tmp/moetron_precision]
           [--svg docs/low_precision_convergence.svg] [--timing-rounds 3 --timing-steps 20]
           [--seeds 1234,1,2]

For each of fp32, bf16, mxfp8 and fp8-blockwise: one run of --steps steps per seed (same data
and schedule; validation every 100 steps) logged as JSONL, then the validation curves of the
first seed in one SVG and a Markdown table of the final validation losses: per recipe the mean
over seeds, its gap to fp32's mean, and the per-seed gaps (min..max), so that a gap can be set
against the seed-to-seed spread of fp32 itself (also printed). The CPU cost per step comes from
separate short runs, interleaved (fp32, bf16, bf16 emulated, mxfp8, fp8-blockwise, fp32, ...) so
that a load change on a shared machine hits every recipe alike; the table gives each recipe's
median ms per step (the median over rounds of each run's median step time) and its ratio to
fp32. "bf16 emulated" is bf16 with MOETRON_BF16_GEMM=emulated (rounded inputs into the float32
GEMM), timed only: on a CPU without AVX512_BF16 bf16 is emulated anyway.

The text is Tiny Shakespeare: --text, else the file the MOETRON_SHAKESPEARE environment variable
names, else ../shared/data/tinyshakespeare.txt beside the repository (where
TrainConvergence.TinyLearnsShakespeareBelow2p5NatsPerByte looks too). Without it, exits 0 with a
message saying where to get it. Standard library only.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

PRECISIONS = ["fp32", "bf16", "mxfp8", "fp8-blockwise"]
SHAKESPEARE_VARIABLE = "MOETRON_SHAKESPEARE"
SHAKESPEARE_DEFAULT = (pathlib.Path(__file__).resolve().parent.parent.parent
                       / "shared" / "data" / "tinyshakespeare.txt")
SHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
                   "tinyshakespeare/input.txt")
# The timed variants: (label, precision, extra environment).
TIMED = [("fp32", "fp32", {}), ("bf16", "bf16", {}),
         ("bf16 emulated", "bf16", {"MOETRON_BF16_GEMM": "emulated"}),
         ("mxfp8", "mxfp8", {}), ("fp8-blockwise", "fp8-blockwise", {})]
COLORS = {"fp32": "#222222", "bf16": "#1f77b4", "mxfp8": "#d62728", "fp8-blockwise": "#2ca02c"}


def train(binary, text, precision, steps, extra, environment=None):
    command = [binary, "train", "--config", "tiny", "--text", text, "--steps", str(steps),
               "--precision", precision, "--threads", "1"] + extra
    env = dict(os.environ, **(environment or {}))
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return done


def median_step_ms(jsonl):
    """The median of a run's per-step times, its first step (warm-up) left out."""
    rows = [json.loads(line) for line in pathlib.Path(jsonl).read_text().splitlines() if line]
    return statistics.median(r["step_ms"] for r in rows[1:])


def svg(curves, out, steps):
    width, height, margin = 720, 400, 60
    values = [v for points in curves.values() for _, v in points]
    low, high = min(values), max(values)
    low, high = low - 0.02 * (high - low), high + 0.02 * (high - low)

    def x(step):
        return margin + (width - 2 * margin) * step / steps

    def y(loss):
        return height - margin - (height - 2 * margin) * (loss - low) / (high - low)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{width / 2}" y="20" text-anchor="middle">tiny on Tiny Shakespeare: '
             f'validation loss by precision</text>',
             f'<line x1="{margin}" y1="{height - margin}" x2="{width - margin}" '
             f'y2="{height - margin}" stroke="black"/>',
             f'<line x1="{margin}" y1="{margin}" x2="{margin}" y2="{height - margin}" '
             f'stroke="black"/>',
             f'<text x="{width / 2}" y="{height - 20}" text-anchor="middle">step</text>']
    for i in range(6):
        loss = low + (high - low) * i / 5
        parts.append(f'<text x="{margin - 6}" y="{y(loss) + 4}" text-anchor="end">'
                     f'{loss:.2f}</text>')
        step = steps * i // 5
        parts.append(f'<text x="{x(step)}" y="{height - margin + 16}" text-anchor="middle">'
                     f'{step}</text>')
    for row, (precision, points) in enumerate(curves.items()):
        path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in points)
        parts.append(f'<polyline fill="none" stroke="{COLORS[precision]}" stroke-width="1.5" '
                     f'points="{path}"/>')
        parts.append(f'<text x="{width - margin - 110}" y="{margin + 16 * row}" '
                     f'fill="{COLORS[precision]}">{precision}</text>')
    parts.append("</svg>")
    pathlib.Path(out).write_text("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default="build/moetron")
    ap.add_argument("--text", default=os.environ.get(SHAKESPEARE_VARIABLE) or str(SHAKESPEARE_DEFAULT),
                    help=f"the Tiny Shakespeare text (default: ${SHAKESPEARE_VARIABLE}, else "
                         f"{SHAKESPEARE_DEFAULT})")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--out-dir", default="/tmp/moetron_precision")
    ap.add_argument("--svg", default="docs/low_precision_convergence.svg")
    ap.add_argument("--timing-rounds", type=int, default=3)
    ap.add_argument("--timing-steps", type=int, default=20)
    ap.add_argument("--seeds", default="1234",
                    help="comma-separated training seeds; each recipe trains once per seed")
    ap.add_argument("--reuse-logs", action="store_true",
                    help="take the curves from --out-dir's logs of an earlier run; time only")
    args = ap.parse_args()
    if not pathlib.Path(args.text).is_file():
        print(f"skipped: no Tiny Shakespeare (char-rnn's 1.1 MB text, the corpus these runs train "
              f"on) at {args.text}; download {SHAKESPEARE_URL} there, or pass --text FILE or set "
              f"{SHAKESPEARE_VARIABLE}=FILE")
        return 0
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    seeds = [int(s) for s in args.seeds.split(",")]
    curves, final = {}, {p: {} for p in PRECISIONS}
    for seed in seeds:
        for precision in PRECISIONS:
            # The first seed's logs keep the names of single-seed runs (--reuse-logs reads them).
            suffix = "" if seed == seeds[0] else f"-seed{seed}"
            log = out_dir / f"{precision}{suffix}.jsonl"
            if not args.reuse_logs:
                train(args.binary, args.text, precision, args.steps,
                      ["--eval-every", "100", "--seed", str(seed), "--log-jsonl", str(log)])
            rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            points = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
            if seed == seeds[0]:
                curves[precision] = points
            final[precision][seed] = points[-1][1]
            print(f"{precision} seed {seed}: final validation loss {points[-1][1]:.4f}",
                  flush=True)

    times = {label: [] for label, _, _ in TIMED}
    for _ in range(args.timing_rounds):
        for label, precision, environment in TIMED:
            timing_log = out_dir / f"timing-{label.replace(' ', '-')}.jsonl"
            timing_log.unlink(missing_ok=True)
            train(args.binary, args.text, precision, args.timing_steps,
                  ["--eval-every", str(args.timing_steps), "--log-jsonl", str(timing_log)],
                  environment)
            times[label].append(median_step_ms(timing_log))
    median = {label: statistics.median(t) for label, t in times.items()}

    svg(curves, args.svg, args.steps)
    mean = {p: statistics.mean(final[p].values()) for p in PRECISIONS}
    fp32_seeds = list(final["fp32"].values())
    if len(seeds) > 1:
        print(f"\nfp32 across seeds {args.seeds}: {min(fp32_seeds):.4f}..{max(fp32_seeds):.4f} "
              f"({100 * (max(fp32_seeds) / min(fp32_seeds) - 1):.2f}% apart)")
    print(f"\n| precision | final val loss ({args.steps} steps, mean of {len(seeds)} seed(s)) "
          f"| vs fp32 | per-seed gap to fp32 (min..max) | ms/step (median of "
          f"{args.timing_rounds} interleaved x {args.timing_steps} steps) | vs fp32 |")
    print("|---|---|---|---|---|---|")
    for label, precision, _ in TIMED:
        if label in PRECISIONS:
            gaps = [100 * (final[label][s] / final["fp32"][s] - 1) for s in seeds]
            loss = (f"{mean[label]:.4f} | {100 * (mean[label] / mean['fp32'] - 1):+.2f}% | "
                    f"{min(gaps):+.2f}%..{max(gaps):+.2f}%")
        else:
            loss = "(timed only) | | "
        print(f"| {label} | {loss} | {median[label]:.1f} | "
              f"{median[label] / median['fp32']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
