#!/usr/bin/env bash
# Checkpoint save/load throughput of the `small` model against the disk's sequential write speed,
# both measured here on the same file system:
#   bench/bench_checkpoint.sh [BUILD_DIR] [WORK_DIR]
# dd writes as many bytes as the checkpoint holds with conv=fdatasync (so the figure includes
# reaching the disk, as the checkpoint's fsyncs do). Load reads the file just written, so from the
# page cache: it measures the verify + parse + copy path, not the disk's read speed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
work="${2:-${TMPDIR:-/tmp}/moetron_bench_checkpoint}"
bench="$build/bench/bench_checkpoint"
[ -x "$bench" ] || { echo "build bench_checkpoint first: ninja -C $build bench_checkpoint" >&2; exit 1; }
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

# The small model's checkpoint is about 1.13 GB (94.4M parameters x 3 x 4 bytes).
mib=1080
echo "== dd: sequential write of ${mib} MiB with fdatasync ($work)"
dd if=/dev/zero of="$work/dd.bin" bs=1M count=$mib conv=fdatasync 2>&1 | tail -1
rm -f "$work/dd.bin"
echo "== moetron checkpoint (small preset)"
"$bench" "$work/ckpt" "$here/../configs/models/small.toml" 3
