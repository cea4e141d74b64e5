#!/usr/bin/env bash
# Installs dependencies, builds moetron with its tests, and runs the whole suite with ctest.
#   tools/test.sh              Release build in build/ (the one tools/run.sh builds)
#   tools/test.sh --sanitize   AddressSanitizer + UBSan build in build-asan/
# tools/configure.sh holds the CMake arguments of both.
set -euo pipefail
cd "$(dirname "$0")/.."

configure_args=()
ctest_args=()
if [ "${1:-}" = "--sanitize" ]; then
  configure_args=(--sanitize)
  # Real training runs are covered by the Release pass; so are the 4-rank runs of the MPI
  # training and checkpoint tests (84 s of the sanitized suite's 289), whose 1- and 2-rank runs
  # check the same code under the sanitizers.
  ctest_args=(-LE slow -E "^test_mpi_(training|checkpoint)_np4$")
fi

tools/install-deps.sh
build_dir=$(tools/configure.sh "${configure_args[@]}")
cmake --build "$build_dir" -j2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
ctest --test-dir "$build_dir" -j2 --output-on-failure --timeout 900 "${ctest_args[@]}" || status=$?
# ctest says only "Skipped"; a skipped GoogleTest test says why (a missing data file and where to
# get it) on the line after "Skipped" in ctest's log: show each reason of the tests ctest skipped
# (not of those skipped inside a passing run, such as an MPI test's cases for other rank counts).
log="$build_dir/Testing/Temporary/LastTest.log"
if [ -f "$log" ]; then
  reasons=$(awk '
    /^[0-9]+\/[0-9]+ Testing: / { name = $3; reason = ""; next }
    /: Skipped$/ { if ((getline line) > 0 && reason == "") reason = line; next }
    /^Skip regular expression found in output/ && reason != "" {
      if (!(reason in count)) first[reason] = name
      count[reason]++
    }
    END {
      for (r in count)
        printf "  %s (%d test%s, e.g. %s)\n", r, count[r], (count[r] > 1 ? "s" : ""), first[r]
    }' "$log" | sort)
  if [ -n "$reasons" ]; then
    echo "Why tests were skipped:"
    echo "$reasons"
  fi
fi
exit "$status"
