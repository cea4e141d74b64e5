#!/usr/bin/env bash
# Open MPI's remote-shell agent for the test bed (see README.md): where mpirun would run
# `ssh HOST COMMAND...`, it runs `rsh-agent.sh HOST COMMAND...`, and this script runs COMMAND
# inside the emulated host's network and UTS namespaces, through a shell like ssh does.
# The environment is inherited from mpirun (ssh would start a fresh login environment).
set -euo pipefail

readonly state_dir=/run/mtb

# Skip options an rsh-style caller may put before the host name (plm_rsh_args).
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
if [ $# -lt 2 ]; then
    echo "rsh-agent.sh: usage: rsh-agent.sh HOST COMMAND..." >&2
    exit 255
fi
host=$1
shift
if ! [[ "$host" =~ ^node[0-9]+$ ]] || [ ! -e "/run/netns/mtb-$host" ] ||
    [ ! -e "$state_dir/uts-$host" ]; then
    echo "rsh-agent.sh: '$host' is not a host of the running test bed" \
        "(expected node0, node1, ...; is the bed up? tools/testbed/testbed.sh up)" >&2
    exit 255  # ssh's status for "could not connect"
fi
exec nsenter --net="/run/netns/mtb-$host" --uts="$state_dir/uts-$host" -- /bin/sh -c "$*"
