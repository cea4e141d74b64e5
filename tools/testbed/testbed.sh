#!/usr/bin/env bash
# A multi-node MPI test bed on one machine (see README.md in this folder).
#
#   testbed.sh up [--nodes 2] [--ranks-per-node 4] [--rate RATE] [--delay DELAY]
#   testbed.sh run [MPIRUN OPTIONS...] -- PROGRAM [ARGS...]
#   testbed.sh down
#   testbed.sh check-clean
#   testbed.sh clean-stale      removes a bed whose selftest was killed; keeps a bed in use
#   testbed.sh status
#   testbed.sh selftest [--quick] [the options of up]
#
# Emulated hosts node0..nodeN-1 are network + UTS namespaces (mtb-node<i>, hostname node<i>)
# with one interface eth0 (198.18.0.<i+1>/24, the RFC 2544 benchmarking range, no route out),
# cabled by veth pairs to a bridge inside a "switch" namespace (mtb-switch). The host's own
# network is not touched. Each cable is shaped in both directions with htb (RATE) and, where
# the kernel has sch_netem, netem (DELAY). `run` starts mpirun inside node0 with an rsh agent
# that enters the other nodes' namespaces, so ranks on one node share memory (vader) and ranks
# on different nodes talk TCP over the shaped cables.
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly here
readonly state_dir=/run/mtb          # bed.conf, hostfile, UTS namespace files, probe binary
readonly ns_prefix=mtb-              # every namespace, link and process marker starts with it
readonly switch_ns=mtb-switch
readonly bridge=mtb-br
readonly subnet=198.18.0             # node i is $subnet.(i+1)/24
readonly marker=MTB_TESTBED=1        # in the environment of every process `run` starts
# Who owns the bed: "manual" for one brought up by `up` (kept until `down`), or
# "<building|selftest> <pid> <start time>" while an `up` builds it or a selftest uses it. A bed
# whose owner process is gone was left behind by a killed run, and the next `up` removes it.
readonly owner_file=$state_dir/owner
up_owner=manual                      # what a finished `up` records; selftest sets "selftest"

# The default link rate is 125 MB/s per rank (500 MB/s for a 4-rank node): about 1/10 of the
# shared-memory bandwidth one rank gets when every rank is busy, as `selftest` measured it on
# the 2-core development VM (1.1-1.2 GB/s; one pair alone gets 10-12 GB/s, but 1/10 of that
# is more than the kernel's TCP path can carry there). README.md has the figures.
readonly default_rate_per_rank=125mbps
readonly default_delay=50us

die() {
    echo "testbed.sh: $*" >&2
    exit 1
}
note() { echo "testbed.sh: $*" >&2; }

usage() {
    sed -n '2,10s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

require_root_and_tools() {
    [ "$(id -u)" = 0 ] || die "must run as root (network namespaces, veth, tc)"
    local tool
    for tool in ip tc nsenter unshare mountpoint flock; do
        command -v "$tool" >/dev/null || die "'$tool' not found (iproute2 / util-linux)"
    done
}

# Serializes up/down/selftest against each other, from any checkout: the namespaces are
# machine-wide. The lock is taken on the /run directory itself, so no lock file is left behind.
take_lock() {
    exec 9</run
    flock -w 60 9 || die "another testbed.sh up/down/selftest has held the lock for 60 s"
}

# --- units ------------------------------------------------------------------------------
# tc's rate syntax (SI multiples; "bit" = bits/s, "bps" = bytes/s) -> bytes per second.
rate_bytes_per_s() {
    local rate=$1
    [[ "$rate" =~ ^([0-9]+(\.[0-9]+)?)([kmgt]?)(bit|bps)$ ]] ||
        die "bad rate '$rate': use tc's syntax, e.g. 800mbit, 100mbps, 2gbit"
    local number=${BASH_REMATCH[1]} prefix=${BASH_REMATCH[3]} unit=${BASH_REMATCH[4]}
    local multiplier=1
    case $prefix in k) multiplier=1e3 ;; m) multiplier=1e6 ;; g) multiplier=1e9 ;; t) multiplier=1e12 ;; esac
    awk -v n="$number" -v m="$multiplier" -v u="$unit" \
        'BEGIN { printf "%.0f\n", n * m / (u == "bit" ? 8 : 1) }'
}

# RATE x N in tc syntax (bytes/s, so that no rounding to bits is needed).
scale_rate() {
    awk -v b="$(rate_bytes_per_s "$1")" -v n="$2" 'BEGIN {
        x = b * n; if (x % 1e6 == 0) printf "%.0fmbps\n", x / 1e6; else printf "%.0fbps\n", x }'
}

check_delay() {
    [[ "$1" =~ ^(0|[0-9]+(\.[0-9]+)?(us|ms))$ ]] || die "bad delay '$1': use e.g. 50us, 0.1ms or 0"
}

kernel_has_netem() {
    # Try it on the loopback device of a throwaway namespace: nothing to clean if it fails.
    local probe=${ns_prefix}netem-probe ok=1
    ip netns add "$probe"
    tc -n "$probe" qdisc add dev lo root netem delay 1us 2>/dev/null || ok=0
    ip netns del "$probe"
    [ "$ok" = 1 ]
}

# --- leftovers ----------------------------------------------------------------------------
our_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep "^$ns_prefix" || true; }

# Every process that `run` started or that lives in one of our namespaces.
our_processes() {
    local ns pid self=$$ uts_inodes=""
    {
    for ns in $(our_namespaces); do ip netns pids "$ns" 2>/dev/null || true; done
    if [ -d "$state_dir" ]; then
        local file
        for file in "$state_dir"/uts-node*; do
            [ -e "$file" ] && uts_inodes+=" $(stat -L -c %i "$file")"
        done
    fi
    for pid in /proc/[0-9]*; do
        pid=${pid#/proc/}
        [ "$pid" = "$self" ] && continue
        if [ -n "$uts_inodes" ]; then
            local inode
            inode=$(stat -L -c %i "/proc/$pid/ns/uts" 2>/dev/null) || continue
            [[ " $uts_inodes " == *" $inode "* ]] && { echo "$pid"; continue; }
        fi
        tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qx "$marker" && echo "$pid"
    done
    } | sort -un | grep -vx -e "$self" -e "${BASHPID:-$self}" || true
}

# Prints one line per leftover of a test bed; prints nothing when the machine is clean.
list_leftovers() {
    local ns pid link mount
    for ns in $(our_namespaces); do echo "network namespace $ns"; done
    for pid in $(our_processes); do
        echo "process $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-80))"
    done
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
        grep "^$ns_prefix" || true); do
        echo "link $link in the host namespace"
    done
    while read -r mount; do echo "mount $mount"; done < <(awk '{print $5}' /proc/self/mountinfo |
        grep -e "^$state_dir" -e "^/run/netns/$ns_prefix" || true)
    [ -e "$state_dir" ] && echo "state directory $state_dir"
    return 0
}

cmd_check_clean() {
    local leftovers
    leftovers=$(list_leftovers)
    if [ -n "$leftovers" ]; then
        echo "testbed.sh check-clean: NOT CLEAN, a test bed left these behind:" >&2
        echo "${leftovers//$'\n'/$'\n'  }" | sed '1s/^/  /' >&2
        echo "testbed.sh check-clean: run 'tools/testbed/testbed.sh down' to remove them" >&2
        return 1
    fi
    echo "testbed.sh check-clean: clean (no mtb- namespaces, links, mounts, processes or $state_dir)"
}

# --- stale beds ---------------------------------------------------------------------------
# The start time of process $1 (field 22 of /proc/PID/stat, after the command name, which may
# hold spaces); empty when there is no such process. With the pid it names one process for good.
process_start_time() {
    sed -E 's/^.*\) //' "/proc/$1/stat" 2>/dev/null | awk '{ print $20 }' || true
}

record_owner() {
    if [ "$1" = manual ]; then
        echo manual >"$owner_file"
    else
        echo "$1 $$ $(process_start_time $$)" >"$owner_file"
    fi
}

# True when a bed's owner was a selftest or an `up` still building, and that process is gone.
bed_is_stale() {
    local kind="" pid="" start=""
    [ -f "$owner_file" ] || return 1
    read -r kind pid start <"$owner_file" || true
    [ "$kind" = building ] || [ "$kind" = selftest ] || return 1
    [ -n "$pid" ] && [ "$(process_start_time "$pid")" != "$start" ]
}

# A killed run (ctest's timeout, SIGKILL) cannot tear its bed down; the next start does, but
# only a bed whose owner is gone: a bed brought up by hand, or in use by a live selftest, stays.
remove_stale_bed() {
    [ -n "$(list_leftovers)" ] || return 0
    bed_is_stale || return 0
    note "removing a test bed left behind by a killed run (owner: $(cat "$owner_file"))"
    teardown
}

cmd_clean_stale() {
    require_root_and_tools
    take_lock
    remove_stale_bed
}

# --- down ---------------------------------------------------------------------------------
teardown() {
    local pids pid attempt
    # Processes first: a namespace with a process in it outlives `ip netns del`.
    for attempt in 1 2 3 4 5 6 7 8 9 10; do
        pids=$(our_processes)
        [ -z "$pids" ] && break
        local signal=TERM
        [ "$attempt" -gt 5 ] && signal=KILL
        for pid in $pids; do kill -s "$signal" "$pid" 2>/dev/null || true; done
        sleep 0.3
    done
    # Namespaces take their veths, the bridge and every qdisc with them.
    local ns
    for ns in $(our_namespaces); do ip netns del "$ns" 2>/dev/null || note "could not delete $ns"; done
    local link
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
        grep "^$ns_prefix" || true); do
        ip link del "$link" 2>/dev/null || true
    done
    if [ -d "$state_dir" ]; then
        local file
        for file in "$state_dir"/uts-*; do
            [ -e "$file" ] || continue
            if mountpoint -q "$file"; then umount "$file" || note "could not unmount $file"; fi
            rm -f "$file"
        done
        rm -rf "$state_dir"
    fi
}

cmd_down() {
    require_root_and_tools
    take_lock
    teardown
    cmd_check_clean
}

# --- up -----------------------------------------------------------------------------------
# Shapes the egress of one end of a cable: htb for the rate, netem under it for the delay.
shape() {
    local ns=$1 dev=$2 rate=$3 delay=$4
    local burst
    # About 1 ms of traffic per burst (at least 64 KiB, one GSO packet): htb refills on
    # timer ticks, and a smaller bucket cannot reach the rate at Gbit/s speeds.
    burst=$(awk -v b="$(rate_bytes_per_s "$rate")" 'BEGIN { x = b / 1000; if (x < 65536) x = 65536; printf "%.0f\n", x }')
    tc -n "$ns" qdisc add dev "$dev" root handle 1: htb default 1
    tc -n "$ns" class add dev "$dev" parent 1: classid 1:1 htb rate "$rate" ceil "$rate" \
        burst "$burst" cburst "$burst" quantum 65536
    if [ "$delay" != 0 ]; then
        tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: netem delay "$delay" limit 100000
    fi
}

cmd_up() {
    local nodes=2 ranks_per_node=4 rate="" delay=$default_delay delay_given=0
    while [ $# -gt 0 ]; do
        case $1 in
            --nodes) nodes=${2:?}; shift 2 ;;
            --ranks-per-node) ranks_per_node=${2:?}; shift 2 ;;
            --rate) rate=${2:?}; shift 2 ;;
            --delay) delay=${2:?}; delay_given=1; shift 2 ;;
            *) die "up: unknown option '$1'" ;;
        esac
    done
    if ! [[ "$nodes" =~ ^[0-9]+$ ]] || [ "$nodes" -lt 2 ] || [ "$nodes" -gt 64 ]; then
        die "--nodes must be 2..64, got '$nodes'"
    fi
    if ! [[ "$ranks_per_node" =~ ^[0-9]+$ ]] || [ "$ranks_per_node" -lt 1 ]; then
        die "--ranks-per-node must be a positive integer, got '$ranks_per_node'"
    fi
    [ -n "$rate" ] || rate=$(scale_rate "$default_rate_per_rank" "$ranks_per_node")
    local rate_bytes
    rate_bytes=$(rate_bytes_per_s "$rate")
    [ "$rate_bytes" -ge 1000 ] || die "--rate must be at least 1kbps, got '$rate'"
    check_delay "$delay"
    require_root_and_tools
    take_lock
    remove_stale_bed

    local leftovers
    leftovers=$(list_leftovers)
    if [ -n "$leftovers" ]; then
        echo "testbed.sh up: refusing, an earlier test bed left these behind:" >&2
        echo "${leftovers//$'\n'/$'\n'  }" | sed '1s/^/  /' >&2
        die "run 'tools/testbed/testbed.sh down' first"
    fi
    if [ "$delay" != 0 ] && ! kernel_has_netem; then
        [ "$delay_given" = 1 ] &&
            die "--delay $delay needs sch_netem, which this kernel lacks; use --delay 0"
        note "this kernel has no sch_netem: the links get the rate limit but no added delay"
        delay=0
    fi

    # From here on a failure tears the half-built bed down.
    trap 'status=$?; note "up failed (line $LINENO); tearing the half-built bed down"; teardown; exit $status' ERR
    trap 'note "interrupted; tearing the half-built bed down"; teardown; exit 130' INT TERM

    mkdir -p "$state_dir"
    record_owner building
    ip netns add "$switch_ns"
    nsenter --net="/run/netns/$switch_ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 \
        net.ipv6.conf.default.disable_ipv6=1
    ip -n "$switch_ns" link set lo up
    ip -n "$switch_ns" link add "$bridge" type bridge
    ip -n "$switch_ns" link set "$bridge" up
    local i node_ns port
    : >"$state_dir/hostfile"
    for ((i = 0; i < nodes; ++i)); do
        node_ns=${ns_prefix}node$i
        port=${ns_prefix}port$i
        ip netns add "$node_ns"
        # IPv4 only: the bed's addresses are the 198.18.0.0/24 ones (no IPv6 link-local
        # addresses for Open MPI to pick up besides them).
        nsenter --net="/run/netns/$node_ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 \
            net.ipv6.conf.default.disable_ipv6=1
        # Both ends are born inside namespaces: nothing ever appears in the host's.
        ip -n "$switch_ns" link add "$port" type veth peer name eth0 netns "$node_ns"
        ip -n "$switch_ns" link set "$port" master "$bridge" up
        ip -n "$node_ns" link set lo up
        ip -n "$node_ns" addr add "$subnet.$((i + 1))/24" dev eth0
        ip -n "$node_ns" link set eth0 up
        shape "$node_ns" eth0 "$rate" "$delay"         # what node i sends
        shape "$switch_ns" "$port" "$rate" "$delay"    # what node i receives
        touch "$state_dir/uts-node$i"
        unshare --uts="$state_dir/uts-node$i" hostname "node$i"
        echo "node$i slots=$ranks_per_node" >>"$state_dir/hostfile"
    done
    cat >"$state_dir/bed.conf" <<EOF
nodes=$nodes
ranks_per_node=$ranks_per_node
rate=$rate
rate_bytes_per_s=$(rate_bytes_per_s "$rate")
delay=$delay
EOF
    record_owner "$up_owner"
    trap - ERR INT TERM
    echo "testbed.sh up: $nodes nodes x $ranks_per_node ranks; each node's link shaped to" \
        "$rate each way ($(awk -v b="$(rate_bytes_per_s "$rate")" 'BEGIN{printf "%.1f", b/1e6}') MB/s)," \
        "delay $delay; nodes at $subnet.1-$((nodes)) (hostnames node0-node$((nodes - 1)))"
}

# --- run ----------------------------------------------------------------------------------
read_bed_conf() {
    [ -f "$state_dir/bed.conf" ] || die "no test bed is up (tools/testbed/testbed.sh up)"
    # shellcheck source=/dev/null
    . "$state_dir/bed.conf"
}

cmd_run() {
    local extra=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do extra+=("$1"); shift; done
    [ $# -ge 2 ] || die "run: usage: testbed.sh run [MPIRUN OPTIONS...] -- PROGRAM [ARGS...]"
    shift
    require_root_and_tools
    read_bed_conf
    local status=0
    # 9<&-: the job must not inherit the lock that `selftest` holds on /run.
    env "$marker" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 9<&- \
        nsenter --net="/run/netns/${ns_prefix}node0" --uts="$state_dir/uts-node0" -- \
        mpirun --hostfile "$state_dir/hostfile" -np $((nodes * ranks_per_node)) \
        --map-by slot --bind-to none \
        --mca plm_rsh_agent "$here/rsh-agent.sh" --mca plm_rsh_no_tree_spawn 1 \
        --mca pml ob1 --mca btl self,vader,tcp \
        --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24" \
        --mca mpi_yield_when_idle 1 \
        "${extra[@]}" "$@" || status=$?
    return "$status"
}

cmd_status() {
    if [ -f "$state_dir/bed.conf" ]; then
        echo "test bed is up:"
        sed 's/^/  /' "$state_dir/bed.conf"
        local ns
        for ns in $(our_namespaces); do
            echo "  $ns:"
            ip -n "$ns" -br addr | sed 's/^/    /'
            tc -n "$ns" qdisc show | grep -v 'noqueue' | sed 's/^/    /'
        done
    else
        echo "no test bed is up"
    fi
}

# --- selftest -----------------------------------------------------------------------------
cmd_selftest() {
    local quick=0 up_args=() messages=64 repeats=3
    while [ $# -gt 0 ]; do
        case $1 in
            --quick) quick=1; messages=8; repeats=1; shift ;;
            *) up_args+=("$1"); shift ;;
        esac
    done
    require_root_and_tools
    command -v mpicc >/dev/null || die "mpicc not found (libopenmpi-dev)"
    up_owner=selftest
    cmd_up "${up_args[@]}"
    trap 'note "interrupted; tearing the bed down"; teardown; exit 130' INT TERM
    local status=0
    selftest_body "$quick" "$messages" "$repeats" || status=$?
    teardown
    cmd_check_clean || status=1
    [ "$status" = 0 ] && echo "testbed.sh selftest: passed" || echo "testbed.sh selftest: FAILED" >&2
    return "$status"
}

selftest_body() {
    local quick=$1 messages=$2 repeats=$3
    read_bed_conf
    mpicc -O2 -o "$state_dir/mtb_probe" "$here/mtb_probe.c" || return 1
    local probe=("$state_dir/mtb_probe" --ranks-per-node "$ranks_per_node" --messages "$messages"
        --repeats "$repeats")
    # Timing is reported always but judged only in the full selftest (never in ctest).
    [ "$quick" = 0 ] && probe+=(--link-rate-bytes-per-s "$rate_bytes_per_s")
    echo "== placement and bandwidth (mtb_probe)"
    cmd_run -- "${probe[@]}" || return 1

    # Which transport Open MPI picked between each pair of processes: ob1's BML prints one line
    # per peer at this verbosity, naming both hosts. Same host must mean vader (shared memory),
    # different hosts tcp (the shaped link).
    echo "== transports chosen by Open MPI (btl_base_verbose)"
    local log
    log=$(cmd_run --mca btl_base_verbose 100 -- "$state_dir/mtb_probe" \
        --ranks-per-node "$ranks_per_node" --messages 1 --message-bytes 1024 --repeats 1 2>&1) || {
        echo "$log" >&2
        return 1
    }
    sed -nE 's/^\[(node[0-9]+):[0-9]+\] mca: bml: Using ([a-z0-9]+) btl for send to .* on node (node[0-9]+).*/\1 \3 \2/p' \
        <<<"$log" | grep -v ' self$' | sort | uniq -c | awk '
        { pairs[$2 " -> " $3] = pairs[$2 " -> " $3] " " $4 "(" $1 ")"
          if (($2 == $3) != ($4 == "vader")) wrong = wrong "\n  " $2 " -> " $3 " used " $4
          if ($2 == $3) inside += $1; else across += $1 }
        END { for (p in pairs) printf "%s:%s\n", p, pairs[p] | "sort"; close("sort")
              if (inside == 0 || across == 0 || wrong != "") {
                  printf "check: transports FAILED (need vader inside a node, tcp across;" \
                         " %d pairs inside, %d across)%s\n", inside, across, wrong; exit 1 }
              printf "check: vader on all %d connections inside a node, tcp on all %d" \
                     " between nodes: ok\n", inside, across }'
}

main() {
    [ $# -ge 1 ] || usage
    local command=$1
    shift
    case $command in
        up) cmd_up "$@" ;;
        down) cmd_down ;;
        run) cmd_run "$@" ;;
        check-clean) cmd_check_clean ;;
        clean-stale) cmd_clean_stale ;;
        status) cmd_status ;;
        selftest) cmd_selftest "$@" ;;
        -h | --help | help) usage ;;
        *) die "unknown command '$command' (up, down, run, check-clean, clean-stale, status, selftest)" ;;
    esac
}

main "$@"
