#!/usr/bin/env bash
# Installs dependencies, builds moetron, and runs its main job on the built-in default.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2 --target moetron
./build/moetron "${@:-train}"
