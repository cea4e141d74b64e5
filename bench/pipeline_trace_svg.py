#!/usr/bin/env python3
"""One step's pipeline schedule as an SVG, from a moetron train --trace file.

    python3 bench/pipeline_trace_svg.py step.json schedule.svg

One row per rank: its 'pipeline forward' and 'pipeline backward' spans (compute track), and
the time it waited on the pp group ('send_recv' spans of the waiting track: the bubble). Ranks
are the trace's processes; time runs from the first pipeline span of the step.
"""
import json
import sys

ROW_H, GAP, LEFT, WIDTH = 26, 8, 70, 1100
COLORS = {"pipeline forward": "#4c78a8", "pipeline backward": "#54a24b", "send_recv": "#e45756"}


def main(trace_path, svg_path):
    with open(trace_path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    spans = [e for e in events if e.get("ph") == "X" and e.get("name") in COLORS]
    # Waits count only on the waiting track (tid 2); the communication track shows transfers.
    spans = [e for e in spans if e["name"] != "send_recv" or e.get("tid") == 2]
    if not spans:
        sys.exit("pipeline_trace_svg.py: no pipeline spans in " + trace_path)
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    ranks = sorted({e["pid"] for e in spans})
    scale = WIDTH / (end - start)
    height = len(ranks) * (ROW_H + GAP) + 50
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 20}" height="{height}" '
        'font-family="sans-serif" font-size="12">'
    ]
    for row, rank in enumerate(ranks):
        y = 10 + row * (ROW_H + GAP)
        out.append(f'<text x="5" y="{y + ROW_H * 0.65}">rank {rank}</text>')
        for e in (e for e in spans if e["pid"] == rank):
            x = LEFT + (e["ts"] - start) * scale
            w = max(e["dur"] * scale, 0.5)
            out.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{ROW_H}" '
                f'fill="{COLORS[e["name"]]}"><title>{e["name"]} {e["dur"] / 1e3:.2f} ms</title></rect>'
            )
    y = 10 + len(ranks) * (ROW_H + GAP) + 15
    x = LEFT
    for name, color in COLORS.items():
        label = "waiting on the pipeline (bubble)" if name == "send_recv" else name
        out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{x + 16}" y="{y}">{label}</text>')
        x += 16 + 8 * len(label) + 20
    out.append(f'<text x="{LEFT + WIDTH - 120}" y="{y}">{(end - start) / 1e3:.1f} ms</text>')
    out.append("</svg>")
    with open(svg_path, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
