#!/usr/bin/env bash
# The installed layout works on its own: `cmake --install` of this build into a temporary prefix,
# then the installed binary trains and simulates with preset names, which it must find under
# PREFIX/share/moetron/configs (train/preset_path.h), and lists the presets for an unknown name.
#   tests/install_layout.sh CMAKE_COMMAND BUILD_DIR
set -euo pipefail
cmake_command=$1
build_dir=$2
prefix=$(mktemp -d "${TMPDIR:-/tmp}/moetron_install.XXXXXX")
trap 'rm -rf "$prefix"' EXIT
cd "$prefix"  # not the checkout: the current directory must not be where presets are found

"$cmake_command" --install "$build_dir" --prefix "$prefix/usr" > /dev/null
exe="$prefix/usr/bin/moetron"
test -x "$exe" || { echo "FAIL: $exe was not installed"; exit 1; }
test -f "$prefix/usr/share/moetron/configs/models/tiny.toml" ||
  { echo "FAIL: the model presets were not installed"; exit 1; }
test -f "$prefix/usr/share/moetron/configs/clusters/gb300-nvl72.toml" ||
  { echo "FAIL: the cluster configs were not installed"; exit 1; }

train=$("$exe" train --config tiny --steps 2 --batch-size 2 --seq-len 16 --eval-every 0 --threads 1)
echo "$train" | grep -q "moetron train: $prefix/usr/share/moetron/configs/models/tiny.toml" ||
  { echo "FAIL: train did not use the installed tiny preset:"; echo "$train"; exit 1; }
echo "$train" | grep -q "step 2/2" || { echo "FAIL: train did not run 2 steps:"; echo "$train"; exit 1; }

"$exe" simulate --config dsv3-671b --cluster gb300-nvl72 --gpus 256 --layout tp1.pp2.vpp4.ep32 \
  --gbs 4096 --seq-len 4096 --precision mxfp8 | grep -q "delivered TFLOPs/GPU" ||
  { echo "FAIL: simulate with preset names"; exit 1; }

if unknown=$("$exe" train --config tinny --steps 1 2>&1); then
  echo "FAIL: an unknown preset name was accepted"; exit 1
fi
echo "$unknown" | grep -q "dsv3-671b, small, tiny" ||
  { echo "FAIL: an unknown preset name does not list the presets:"; echo "$unknown"; exit 1; }
echo "installed layout OK"
