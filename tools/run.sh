#!/usr/bin/env bash
# Installs dependencies, builds moetron, and runs its main job on the built-in default.
# build/ is configured by tools/configure.sh, as tools/test.sh configures it: the tests then
# compile on top of this build instead of rebuilding it.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
build_dir=$(tools/configure.sh)
cmake --build "$build_dir" -j2 --target moetron
"./$build_dir/moetron" "${@:-train}"
