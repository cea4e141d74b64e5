# Sourced by the test bed's ctest entries: exits 77 (ctest's "Skipped"), with the reason, where
# the bed cannot be built here (not root, no network/UTS namespaces, no veth, no Open MPI) or
# where a bed is in use. Sets $testbed to tools/testbed/testbed.sh.
testbed="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../tools/testbed" && pwd)/testbed.sh"

skip() {
    echo "SKIPPED: $*"
    exit 77
}
readonly needs="the test bed needs root, network and UTS namespaces, veth, tc and Open MPI"

[ "$(id -u)" = 0 ] || skip "not root; $needs"
for tool in ip tc nsenter unshare mpicc mpirun; do
    command -v "$tool" >/dev/null || skip "'$tool' not found; $needs"
done
unshare --uts true 2>/dev/null || skip "cannot create a UTS namespace here; $needs"
probe=mtb-ctest-probe
ip netns add "$probe" 2>/dev/null || skip "cannot create a network namespace here; $needs"
veth_ok=1
ip -n "$probe" link add mtb-v0 type veth peer name mtb-v1 2>/dev/null || veth_ok=0
ip netns del "$probe"
[ "$veth_ok" = 1 ] || skip "cannot create veth pairs here; $needs"
# A bed left behind by a killed run (ctest's timeout kills a selftest with its script) goes; a
# bed brought up by hand, or in use by a live selftest, stays.
"$testbed" clean-stale || true
# Never tear down a bed that someone is using for a benchmark.
"$testbed" check-clean >/dev/null 2>&1 || skip "a test bed is already up (or left over;" \
    "see tools/testbed/testbed.sh check-clean)"
