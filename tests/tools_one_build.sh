#!/usr/bin/env bash
# tools/run.sh and tools/test.sh configure build/ with the same CMake arguments (so that the
# tests compile on top of run.sh's build instead of rebuilding it), test.sh --sanitize keeps its
# own build-asan/, and test.sh shows why tests were skipped. Runs the scripts from a copy of
# tools/ with cmake, ctest, the dependency installer and the binary replaced by recorders: it
# checks what they would run, in a second.
#   tests/tools_one_build.sh SOURCE_DIR
set -euo pipefail
source_dir=$(cd "$1" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/moetron_one_build.XXXXXX")
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/repo/build" "$work/bin"
cp -r "$source_dir/tools" "$work/repo/tools"
log="$work/calls.log"
printf '#!/usr/bin/env bash\necho "cmake $*" >> "%s"\n' "$log" > "$work/bin/cmake"
# ctest --test-dir DIR ...: also a log as ctest writes it, with a test that ctest skipped and a
# passing one that skipped a case inside.
cat > "$work/bin/ctest" <<FAKE
#!/usr/bin/env bash
echo "ctest \$*" >> "$log"
mkdir -p "\$2/Testing/Temporary"
cat > "\$2/Testing/Temporary/LastTest.log" <<'LOG'
1/2 Testing: Data.Converges
../tests/t.cpp:9: Skipped
no corpus at X: download Y
Test Pass Reason:
Skip regular expression found in output. Regex=[\[  SKIPPED \]]
2/2 Testing: test_mpi_np1
../tests/mpi/m.cpp:5: Skipped
needs 2 ranks
Test Passed.
LOG
FAKE
chmod +x "$work/bin/cmake" "$work/bin/ctest"
printf '#!/usr/bin/env bash\n' > "$work/repo/tools/install-deps.sh"
printf '#!/usr/bin/env bash\necho "moetron $*" >> "%s"\n' "$log" > "$work/repo/build/moetron"
chmod +x "$work/repo/tools/install-deps.sh" "$work/repo/build/moetron"
export PATH="$work/bin:$PATH"

# The configure lines (cmake -S ...) and build lines (cmake --build ...) of one script's run.
calls_of() {
  : > "$log"
  "$work/repo/tools/$1" "${@:2}" > "$work/stdout"
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
grep -qx '  no corpus at X: download Y (1 test, e.g. Data.Converges)' "$work/stdout" ||
  fail "test.sh --sanitize does not say why a test was skipped: $(cat "$work/stdout")"
! grep -q 'needs 2 ranks' "$work/stdout" ||
  fail "test.sh lists a case skipped inside a passing test: $(cat "$work/stdout")"
echo "one build: run.sh and test.sh configure build/ alike"
