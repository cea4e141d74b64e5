#!/usr/bin/env python3
"""The median and spread of a ratio measured as interleaved pairs (A B A B ...).

Reads one pair per line on stdin, "A B" (the ratio is A / B) or one number (already a ratio), and
prints one line: LABEL: median M (min..max L..H over N interleaved pairs). A single pair says
little on a shared machine; the spread says how far to trust the median. The bench scripts
(compare_pytorch.sh, testbed_a2a.sh) use it; the C++ benches print the same line through
bench/ratio_spread.h.

    printf '2.0 1.0\n2.2 1.0\n' | bench/ratio_stats.py "moetron / pytorch tokens/s"
"""
import statistics
import sys


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    label = sys.argv[1]
    ratios = []
    for line in sys.stdin:
        fields = line.split()
        if not fields:
            continue
        if len(fields) == 1:
            ratios.append(float(fields[0]))
        elif len(fields) == 2:
            ratios.append(float(fields[0]) / float(fields[1]))
        else:
            print(f"ratio_stats.py: expected 'A B' or one ratio per line, got '{line.strip()}'",
                  file=sys.stderr)
            return 2
    if not ratios:
        print("ratio_stats.py: no pairs measured", file=sys.stderr)
        return 1
    print(f"{label}: median {statistics.median(ratios):.3f} "
          f"(min..max {min(ratios):.3f}..{max(ratios):.3f} over {len(ratios)} interleaved pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
