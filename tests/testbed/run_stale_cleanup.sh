#!/usr/bin/env bash
# ctest entry: a killed selftest must not poison the next run. A selftest killed with SIGKILL
# while its bed is up (as ctest's timeout kills it) leaves namespaces and mounts behind; the next
# `up` removes them and starts. A bed brought up by hand is still refused by `up` and kept by
# `clean-stale`. Exits 77 where the bed cannot be built (bed_possible.sh).
set -uo pipefail
# shellcheck source=bed_possible.sh
. "$(dirname "${BASH_SOURCE[0]}")/bed_possible.sh"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail() {
    echo "FAILED: $*"
    cat "$log"
    "$testbed" down >/dev/null 2>&1
    exit 1
}

# A selftest in a session of its own, so that one kill reaches it and everything it started.
setsid "$testbed" selftest --quick --nodes 2 --ranks-per-node 1 >"$log" 2>&1 &
selftest=$!
for _ in $(seq 600); do
    grep -qs '^selftest ' /run/mtb/owner && break
    sleep 0.1
done
grep -qs '^selftest ' /run/mtb/owner || fail "the selftest's bed never came up"
kill -KILL -- "-$selftest"
wait "$selftest" 2>/dev/null
"$testbed" check-clean >/dev/null 2>&1 && fail "the killed selftest left nothing behind to clean"

"$testbed" up --nodes 2 --ranks-per-node 1 >>"$log" 2>&1 ||
    fail "up refused to start after a killed selftest"
"$testbed" up --nodes 2 --ranks-per-node 1 >>"$log" 2>&1 && fail "a second up started over a bed in use"
"$testbed" clean-stale >>"$log" 2>&1
"$testbed" check-clean >/dev/null 2>&1 && fail "clean-stale removed a bed brought up by hand"
"$testbed" down >>"$log" 2>&1 || fail "down did not leave the machine clean"
echo "passed: a killed selftest's bed was removed by the next up; a bed in use was kept"
