#!/usr/bin/env bash
# Runs the README's quick commands as a new user pastes them: every ```sh block of README.md, in
# order, in one bash session, in an empty temporary directory, with the built binary first on the
# PATH (as the README's `export PATH=...` puts it). Blocks fenced ```bash are the long or
# privileged ones (the build, the whole suite, the root-only test bed, downloads, minutes-long
# runs) and ```text blocks are synopses: neither is run here. Stops at the first failing command.
#   tools/check_readme_commands.sh [BUILD_DIR]      (default: build)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build_dir=$(cd "${1:-$repo/build}" && pwd)
test -x "$build_dir/moetron" || { echo "no $build_dir/moetron: build it first" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/moetron_readme.XXXXXX")
trap 'rm -rf "$work"' EXIT
commands="$work/readme_commands.sh"
awk '/^```sh$/ { inside = 1; next } /^```/ { inside = 0; next } inside { print }' \
  "$repo/README.md" > "$commands"
test -s "$commands" || { echo "README.md has no \`\`\`sh blocks" >&2; exit 1; }
cd "$work"
export PATH="$build_dir:$PATH"
export OMP_NUM_THREADS=1
# -e but not pipefail: a pasted `yes ... | head` must work as it does in an interactive shell.
bash -ex "$commands"
echo "README commands OK ($(grep -c . "$commands") lines)"
