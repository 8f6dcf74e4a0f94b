#!/usr/bin/env bash
# A cluster of "machines" on one host for tests/cluster/test_cluster.c: one network
# namespace per node, each with its own host name (a UTS namespace per command), joined
# by a bridge. Processes on the nodes share the file system and /dev/shm; the network and
# the host name (so ctrain's same-host test) differ, as between real machines.
#
#   netns.sh check            exit 0 when namespaces can be made here; else 77 and the reason
#   netns.sh up OWNER N       N nodes (1..8) that live while process OWNER does; prints
#                             "ID PREFIX PREFIX6": node i's addresses are PREFIX.(i+1) (a /24)
#                             and PREFIX6(i+1) (IPv6, a /64; PREFIX6 is left out without IPv6)
#   netns.sh down ID          kill every process on the nodes, remove them
#   netns.sh exec ID I CMD..  run CMD on node I (network namespace ID-n<I>, host name ID-n<I>)
#   netns.sh ns ID I          the name of node I's network namespace (for ip netns ... / nft)
#   netns.sh hostif ID I      the name of node I's link on the host side of the bridge
#   netns.sh run N CMD..      up with this shell as owner, CMD with CT_CLUSTER_ID,
#                             CT_CLUSTER_PREFIX and CT_CLUSTER_PREFIX6 exported, down on exit,
#                             failure or interrupt
#   netns.sh gc               remove the nodes of earlier runs whose owner has died
#
# Names: ID is "ctc" + the owner's pid, so parallel runs never collide; namespaces
# ID"n"I, the bridge ID"b", the host side of node I's link ID"v"I (15 characters at most,
# the kernel's limit for interface names: a pid has at most 7 digits). Inside a node the
# link is "eth0". Addresses: 10.231.X.0/24 and fd00:231:X::/64 with X from the owner's pid;
# the bridge has no address, so the host itself is not on the test network and runs cannot
# see each other.
#
# Cleanup: "up" leaves a watcher behind that runs "down" once the owner exits (also when
# it is killed: a test's timeout); "run" traps EXIT INT TERM; "up" and "gc" also remove
# what crashed runs left (their owner pid dead, or alive but started after them). State
# per run lives in $CT_CLUSTER_STATE (default /run/ctrain-cluster).
set -euo pipefail

STATE=${CT_CLUSTER_STATE:-/run/ctrain-cluster}
PATH=$PATH:/usr/sbin:/sbin

die() { echo "netns.sh: $*" >&2; exit 1; }

# the start time of pid (field 22 of /proc/pid/stat), empty when it is gone
start_time() { awk '{ sub(/^.*\) /, ""); print $20 }' "/proc/$1/stat" 2>/dev/null || true; }

check() {
    [ "$(id -u)" -eq 0 ] || { echo "not root (network namespaces need CAP_NET_ADMIN; CI runs as root)"; return 77; }
    command -v ip >/dev/null || { echo "no 'ip' command (Debian package iproute2)"; return 77; }
    command -v unshare >/dev/null || { echo "no 'unshare' command (Debian package util-linux)"; return 77; }
    local probe="ctq$$" # not ctc...: gc leaves it alone; with "b", 11 characters at most
    if ! ip netns add "$probe" 2>/dev/null; then
        echo "'ip netns add' failed: no CAP_NET_ADMIN here (a container without it?)"
        return 77
    fi
    local ok=1
    ip link add "${probe}b" type bridge 2>/dev/null || ok=0
    ip link del "${probe}b" 2>/dev/null || true
    ip netns exec "$probe" unshare --uts true 2>/dev/null || ok=2
    ip netns del "$probe"
    [ $ok -eq 1 ] && return 0
    [ $ok -eq 0 ] && echo "cannot create a bridge (ip link add type bridge failed)" || echo "cannot make a UTS namespace (unshare --uts failed)"
    return 77
}

# every node namespace of ID
nodes_of() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1n[0-9]+$" || true; }

down() {
    local id=$1 ns i
    local -a pids
    [[ $id =~ ^ctc[0-9]+$ ]] || die "down: '$id' is not a cluster id"
    # the watcher, unless it is the caller
    if [ -f "$STATE/$id" ]; then
        local w
        w=$(sed -n 's/^watcher //p' "$STATE/$id")
        if [ -n "$w" ] && [ "$w" != "$$" ]; then kill "$w" 2>/dev/null || true; fi
    fi
    for ns in $(nodes_of "$id"); do
        # frozen processes first get SIGCONT so that SIGKILL is not held up
        for i in 1 2 3 4 5 6 7 8 9 10; do
            mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
            [ ${#pids[@]} -eq 0 ] && break
            kill -CONT "${pids[@]}" 2>/dev/null || true
            kill -KILL "${pids[@]}" 2>/dev/null || true
            sleep 0.1
        done
        ip netns del "$ns" 2>/dev/null || true
    done
    for i in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${id}[bv][0-9]*$" || true); do
        ip link del "$i" 2>/dev/null || true
    done
    rm -f "$STATE/$id"
}

# removes clusters whose owner is gone (or is another process with a reused pid)
gc() {
    local id owner started ns
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^ctc[0-9]+n[0-9]+$' || true); do
        id=${ns%n*}
        owner=${id#ctc}
        started=$(sed -n 's/^started //p' "$STATE/$id" 2>/dev/null || true)
        if [ -z "$(start_time "$owner")" ] || { [ -n "$started" ] && [ "$(start_time "$owner")" != "$started" ]; }; then
            down "$id"
        fi
    done
    # a bridge without namespaces (a run killed half-way through "up")
    for ns in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | grep -E '^ctc[0-9]+b$' || true); do
        id=${ns%b}
        [ -n "$(start_time "${id#ctc}")" ] || down "$id"
    done
}

up() {
    local owner=$1 n=$2 i
    if ! [[ $owner =~ ^[0-9]+$ ]] || [ -z "$(start_time "$owner")" ]; then
        die "up: owner '$owner' is not a running process"
    fi
    [[ $n =~ ^[1-8]$ ]] || die "up: '$n' nodes: expected 1 to 8"
    local id="ctc$owner" prefix="10.231.$((owner % 250 + 1))" prefix6="fd00:231:$((owner % 250 + 1))::" v6=1
    mkdir -p "$STATE"
    gc
    down "$id" # a leftover under the same pid (its owner died and the pid came back)
    printf 'owner %s\nstarted %s\n' "$owner" "$(start_time "$owner")" >"$STATE/$id"
    # the watcher first, so that a failure below is cleaned up too
    setsid bash "$(readlink -f "$0")" watch "$owner" "$id" </dev/null >/dev/null 2>&1 &
    echo "watcher $!" >>"$STATE/$id"
    ip link add "${id}b" type bridge
    ip link set "${id}b" up
    for ((i = 0; i < n; i++)); do
        local ns="${id}n$i"
        ip netns add "$ns"
        ip link add "${id}v$i" type veth peer name "${id}p$i"
        ip link set "${id}p$i" netns "$ns"
        ip -n "$ns" link set "${id}p$i" name eth0
        ip -n "$ns" addr add "$prefix.$((i + 1))/24" dev eth0
        # nodad: usable at once, not after duplicate address detection
        ip -n "$ns" -6 addr add "$prefix6$((i + 1))/64" dev eth0 nodad 2>/dev/null || v6=0
        ip -n "$ns" link set lo up
        ip -n "$ns" link set eth0 up
        ip link set "${id}v$i" master "${id}b"
        ip link set "${id}v$i" up
    done
    # no IPv6 (disabled in the kernel): no third field
    if [ $v6 -eq 1 ]; then echo "$id $prefix $prefix6"; else echo "$id $prefix"; fi
}

watch() {
    local owner=$1 id=$2 started
    started=$(start_time "$owner")
    trap 'down "$id"; exit 0' INT TERM
    while [ -n "$started" ] && [ "$(start_time "$owner")" = "$started" ]; do sleep 0.5; done
    down "$id"
}

node_exec() {
    local id=$1 i=$2
    shift 2
    [ $# -gt 0 ] || die "exec: no command"
    # a host name of its own: ctrain tells machines apart by boot id and host name
    # shellcheck disable=SC2016 # $0 and $@ are the inner shell's
    exec ip netns exec "${id}n$i" unshare --uts sh -c 'hostname "$0" && exec "$@"' "${id}n$i" "$@"
}

run() {
    local n=$1
    shift
    local out
    out=$(up $$ "$n")
    read -r CT_CLUSTER_ID CT_CLUSTER_PREFIX CT_CLUSTER_PREFIX6 <<<"$out"
    export CT_CLUSTER_ID CT_CLUSTER_PREFIX CT_CLUSTER_PREFIX6
    trap 'down "$CT_CLUSTER_ID"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    "$@"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
check) check ;;
up) [ $# -eq 2 ] || die "usage: up OWNER N"; up "$@" ;;
down) [ $# -eq 1 ] || die "usage: down ID"; down "$1" ;;
exec) [ $# -ge 3 ] || die "usage: exec ID I CMD..."; node_exec "$@" ;;
ns) [ $# -eq 2 ] || die "usage: ns ID I"; echo "$1n$2" ;;
hostif) [ $# -eq 2 ] || die "usage: hostif ID I"; echo "$1v$2" ;;
run) [ $# -ge 2 ] || die "usage: run N CMD..."; run "$@" ;;
gc) gc ;;
watch) watch "$@" ;;
*) die "usage: netns.sh check|up OWNER N|down ID|exec ID I CMD...|ns ID I|hostif ID I|run N CMD...|gc" ;;
esac
