#!/usr/bin/env bash
# ctest entry for the multi-node test bed (tools/testbed/): runs `testbed.sh selftest --quick`
# (placement of ranks on emulated hosts and the transport per rank pair; bandwidth is printed
# but not judged). Exits 77, which ctest reports as "Skipped", with the reason, where the bed
# cannot be built: not root, no network/UTS namespaces, no Open MPI, or a bed already up.
set -uo pipefail
# shellcheck source=bed_possible.sh
. "$(dirname "${BASH_SOURCE[0]}")/bed_possible.sh"

exec "$testbed" selftest --quick
