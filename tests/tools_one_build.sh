#!/usr/bin/env bash
# tools/run.sh and tools/test.sh configure build/ with the same CMake arguments (so that the
# tests compile on top of run.sh's build instead of rebuilding it), and test.sh --sanitize keeps
# its own build-asan/. Runs the scripts from a copy of tools/ with cmake, ctest, the dependency
# installer and the binary replaced by recorders: it checks what they would run, in a second.
#   tests/tools_one_build.sh SOURCE_DIR
set -euo pipefail
source_dir=$(cd "$1" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/moetron_one_build.XXXXXX")
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/repo/build" "$work/bin"
cp -r "$source_dir/tools" "$work/repo/tools"
log="$work/calls.log"
for tool in cmake ctest; do
  printf '#!/usr/bin/env bash\necho "%s $*" >> "%s"\n' "$tool" "$log" > "$work/bin/$tool"
  chmod +x "$work/bin/$tool"
done
printf '#!/usr/bin/env bash\n' > "$work/repo/tools/install-deps.sh"
printf '#!/usr/bin/env bash\necho "moetron $*" >> "%s"\n' "$log" > "$work/repo/build/moetron"
chmod +x "$work/repo/tools/install-deps.sh" "$work/repo/build/moetron"
export PATH="$work/bin:$PATH"

# The configure lines (cmake -S ...) and build lines (cmake --build ...) of one script's run.
calls_of() {
  : > "$log"
  "$work/repo/tools/$1" "${@:2}" > /dev/null
  cat "$log"
}
fail() { echo "FAIL: $*" >&2; exit 1; }

run_calls=$(calls_of run.sh)
test_calls=$(calls_of test.sh)
sanitize_calls=$(calls_of test.sh --sanitize)
echo "tools/run.sh:"; echo "$run_calls"
echo "tools/test.sh:"; echo "$test_calls"
echo "tools/test.sh --sanitize:"; echo "$sanitize_calls"

run_configure=$(grep '^cmake -S' <<< "$run_calls") || fail "run.sh configures nothing"
test_configure=$(grep '^cmake -S' <<< "$test_calls") || fail "test.sh configures nothing"
sanitize_configure=$(grep '^cmake -S' <<< "$sanitize_calls") || fail "--sanitize configures nothing"
[ "$(wc -l <<< "$run_configure")" -eq 1 ] || fail "run.sh configures more than once"
[ "$run_configure" = "$test_configure" ] ||
  fail "run.sh and test.sh configure differently: '$run_configure' vs '$test_configure'"
grep -q -- '-B build ' <<< "$run_configure" || fail "run.sh does not configure build/"
grep -q -- '^cmake --build build ' <<< "$run_calls" || fail "run.sh does not build build/"
grep -q -- '^cmake --build build ' <<< "$test_calls" || fail "test.sh does not build build/"
grep -q -- '^ctest --test-dir build ' <<< "$test_calls" || fail "test.sh does not test build/"
grep -q -- '^moetron train$' <<< "$run_calls" || fail "run.sh does not run build/moetron train"
grep -q -- '-B build-asan .*-DMOETRON_SANITIZE=ON' <<< "$sanitize_configure" ||
  fail "test.sh --sanitize does not configure build-asan/ with the sanitizers"
grep -q -- '^ctest --test-dir build-asan .*-LE slow' <<< "$sanitize_calls" ||
  fail "test.sh --sanitize does not test build-asan/ without the slow tests"
echo "one build: run.sh and test.sh configure build/ alike"
