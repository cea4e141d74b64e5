#!/usr/bin/env bash
# Installs the Debian packages moetron builds against (README.md says what each is for).
# Skips apt-get when everything is already there, so repeated runs are quick.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config     # the build
  libopenblas-dev                      # CPU GEMMs
  libopenmpi-dev openmpi-bin           # distributed engine on CPU
  libtomlplusplus-dev                  # TOML configs
  nlohmann-json3-dev                   # JSON (HF config.json, checkpoints' index, --json output)
  libcli11-dev                         # command line
  libfmt-dev                           # formatting
  libxxhash-dev                        # checkpoint checksums
  libgtest-dev libgmock-dev            # tests
  libbenchmark-dev                     # micro-benchmarks
  clang-14 libclang-rt-14-dev          # fuzzing (tests/fuzz/run_fuzz.sh): libFuzzer + sanitizers
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
