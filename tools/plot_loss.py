#!/usr/bin/env python3
"""Draws the training and validation loss of a `moetron train --log-jsonl` file as an SVG.

usage: tools/plot_loss.py LOG.jsonl OUT.svg [--title TEXT]
Standard library only, so it runs on a fresh machine.
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("out")
    ap.add_argument("--title", default="moetron train")
    args = ap.parse_args()

    rows = [json.loads(line) for line in open(args.log) if line.strip()]
    train = [(r["step"], r["loss"]) for r in rows]
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    if not train:
        raise SystemExit(f"{args.log}: no steps")

    width, height, margin = 640, 360, 50
    max_step = max(s for s, _ in train)
    max_loss = max(l for _, l in train + val)
    min_loss = 0.0

    def x(step):
        return margin + (width - 2 * margin) * step / max_step

    def y(loss):
        return height - margin - (height - 2 * margin) * (loss - min_loss) / (max_loss - min_loss)

    def polyline(points, color, w):
        coords = " ".join(f"{x(s):.1f},{y(l):.1f}" for s, l in points)
        return f'<polyline fill="none" stroke="{color}" stroke-width="{w}" points="{coords}"/>'

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{args.title}</text>',
    ]
    for i in range(6):  # horizontal grid with loss labels
        loss = min_loss + (max_loss - min_loss) * i / 5
        parts.append(f'<line x1="{margin}" x2="{width - margin}" y1="{y(loss):.1f}" '
                     f'y2="{y(loss):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{margin - 6}" y="{y(loss) + 4:.1f}" text-anchor="end">{loss:.1f}</text>')
    for i in range(6):  # step labels
        step = max_step * i / 5
        parts.append(f'<text x="{x(step):.1f}" y="{height - margin + 16}" '
                     f'text-anchor="middle">{step:.0f}</text>')
    parts.append(f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">step</text>')
    parts.append(f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" '
                 'text-anchor="middle">loss (nats/token)</text>')
    parts.append(polyline(train, "#9bb7d4", 1))
    if val:
        parts.append(polyline(val, "#d62728", 2))
    parts.append(f'<text x="{width - margin}" y="{margin}" text-anchor="end" fill="#4a78a8">train</text>')
    parts.append(f'<text x="{width - margin}" y="{margin + 16}" text-anchor="end" fill="#d62728">validation</text>')
    parts.append("</svg>")
    with open(args.out, "w") as f:
        f.write("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
