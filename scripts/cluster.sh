#!/bin/bash
# cluster.sh: a test cluster of N "hosts" on one machine, made of network namespaces.
#
# Usage:
#   cluster.sh up --hosts N [--link RATE|none] [--burst BYTES] [--prefix NAME] [--subnet A.B.C]
#                 [--mtu BYTES] [--owner PID]
#   cluster.sh down [--prefix NAME] [--all]
#   cluster.sh status [--prefix NAME]
#   cluster.sh exec [--prefix NAME] HOST CMD...
#   cluster.sh addr [--prefix NAME] HOST
#   cluster.sh launch [--prefix NAME] [--ranks-per-host K] [--hosts H] [--timeout SECONDS]
#                     [--port PORT] [--env NAME=VALUE]... [--no-label] -- PROGRAM ARGS...
#   cluster.sh check      exit 0 if this machine can make clusters (installing iproute2 if
#                         needed), else print why and exit 2
#   cluster.sh gc         take down clusters whose --owner process has exited
#
# Layout (prefix P, default "tutti"; every name below belongs to the cluster and nothing else):
#   namespace P-br   the "switch": bridge br0 with one port hI per host
#   namespace P-hI   host I (0..N-1): loopback and eth0 = A.B.C.(I+1)/24 (default 10.233.0.0/24),
#                    the other end of a veth pair whose bridge end is hI in P-br
# Nothing is added to the root namespace: no routes, no links, no addresses, so traffic can only
# go between the namespaces this script made. Two clusters with different prefixes are separate
# networks, even with the same subnet.
#
#   up      creates the cluster, or, if it exists with the same shape, only (re)applies the link
#           limit; a cluster of another shape under the same prefix is recreated. --link RATE
#           (tc units: 100mbit, 1gbit, 10gbit) puts a tbf qdisc on both ends of each host's veth:
#           on eth0 (what the host sends) and on hI in the switch (what the host receives), so
#           each host has RATE up and RATE down, like a NIC on a switch. --link none (the
#           default) removes any limit. --burst is the tbf bucket (default: 2 ms at RATE, at
#           least 256kb); tbf limits throughput only, it adds no latency.
#   down    kills every process still running inside the cluster's namespaces and deletes them.
#           Safe to run when nothing exists. --all takes down every cluster made by this script.
#   exec    runs CMD inside host HOST (an index 0..N-1, or hI).
#   launch  starts hosts x K ranks of PROGRAM, rank r on host r / K, each as
#             ip netns exec P-hI env TUTTI_RANK=r TUTTI_WORLD_SIZE=n TUTTI_LOCAL_RANK=r%K
#               TUTTI_MASTER_ADDR=<host 0's address> TUTTI_MASTER_PORT=PORT TUTTI_TOKEN=<32 hex>
#               CLUSTER_HOST=I CLUSTER_HOSTS=H CLUSTER_RANKS_PER_HOST=K [--env ...] PROGRAM ARGS
#           (the caller's environment passes through too, e.g. TUTTI_ALGO). Output lines are
#           labelled "[r]" unless --no-label. If a rank fails, the others are killed and launch
#           exits with the first failure's exit code; after --timeout seconds (default 300) all
#           ranks are killed and it exits with 124. PORT defaults to a random port in 20000-29999.
#
# Needs root, iproute2 (ip, tc; installed with apt-get when missing) and a kernel with veth,
# bridge and sch_tbf. Registry of clusters: $CLUSTER_STATE (default /run/tutti-cluster).
set -u
set -o pipefail

SELF=$(basename "$0")
STATE=${CLUSTER_STATE:-/run/tutti-cluster}
DEV=eth0
BR=br0

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "$SELF: $*" >&2; exit 1; }
say() { echo "$SELF: $*"; }
is_root() { [ "$(id -u)" = 0 ]; }

need_tools() {
  is_root || die "needs root (network namespaces and tc)"
  if ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
    say "ip or tc missing: apt-get install -y iproute2"
    command -v apt-get > /dev/null || die "no apt-get: install iproute2 by hand"
    { apt-get install -y iproute2 > /dev/null 2>&1 || { apt-get update > /dev/null 2>&1 && apt-get install -y iproute2 > /dev/null 2>&1; }; } ||
      die "apt-get install iproute2 failed"
  fi
  ip netns list > /dev/null 2>&1 || die "'ip netns' does not work here"
}

check_prefix() {
  [[ $PREFIX =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$ ]] ||
    die "bad prefix '$PREFIX' (letters, digits, _ . -; at most 40 characters)"
}

ns_br() { echo "$PREFIX-br"; }
ns_host() { echo "$PREFIX-h$1"; }
ns_exists() { [ -e "/run/netns/$1" ] || ip netns list 2> /dev/null | awk '{print $1}' | grep -qxF "$1"; }

# every namespace of this cluster, bridge last
cluster_namespaces() {
  ip netns list 2> /dev/null | awk '{print $1}' | grep -E "^$(printf '%s' "$PREFIX" | sed 's/[.]/[.]/g')-h[0-9]+$" |
    sed -E 's/^(.*-h)([0-9]+)$/\2 \1\2/' | sort -n | cut -d' ' -f2
  ns_exists "$(ns_br)" && ns_br
}

reg_file() { echo "$STATE/$PREFIX"; }
# reg_get KEY: a value from the registry file of this cluster (empty if none)
reg_get() { [ -f "$(reg_file)" ] && awk -F= -v k="$1" '$1 == k { print substr($0, length(k) + 2) }' "$(reg_file)"; }

# default tbf bucket: 2 ms worth of RATE, at least 256 KiB (tbf needs burst >= rate / HZ)
default_burst() {
  local r=$1 num unit bits
  num=$(echo "$r" | sed -E 's/^([0-9.]+).*/\1/')
  unit=$(echo "$r" | sed -E 's/^[0-9.]+//' | tr '[:upper:]' '[:lower:]')
  case $unit in
    bit | "") bits=$num ;;
    kbit) bits=$(awk -v n="$num" 'BEGIN { print n * 1e3 }') ;;
    mbit) bits=$(awk -v n="$num" 'BEGIN { print n * 1e6 }') ;;
    gbit) bits=$(awk -v n="$num" 'BEGIN { print n * 1e9 }') ;;
    tbit) bits=$(awk -v n="$num" 'BEGIN { print n * 1e12 }') ;;
    bps) bits=$(awk -v n="$num" 'BEGIN { print n * 8 }') ;;
    kbps) bits=$(awk -v n="$num" 'BEGIN { print n * 8e3 }') ;;
    mbps) bits=$(awk -v n="$num" 'BEGIN { print n * 8e6 }') ;;
    gbps) bits=$(awk -v n="$num" 'BEGIN { print n * 8e9 }') ;;
    *) die "cannot read rate '$r' (use tc units: 100mbit, 1gbit, 10gbit)" ;;
  esac
  awk -v b="$bits" 'BEGIN { x = b / 8 * 0.002; if (x < 262144) x = 262144; printf "%d\n", x }'
}

kill_ns_procs() {
  local ns=$1 pids i
  pids=$(ip netns pids "$ns" 2> /dev/null | tr '\n' ' ')
  [ -n "${pids// /}" ] || return 0
  say "killing processes left in $ns: $pids"
  # shellcheck disable=SC2086
  kill -TERM $pids 2> /dev/null
  for i in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(ip netns pids "$ns" 2> /dev/null | tr '\n' ' ')
    [ -n "${pids// /}" ] || return 0
    sleep 0.2
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2> /dev/null
  sleep 0.1
}

cmd_down() {
  local nss ns n=0
  nss=$(cluster_namespaces)
  for ns in $nss; do kill_ns_procs "$ns"; done
  for ns in $nss; do
    ip netns del "$ns" 2> /dev/null || ip netns del "$ns" || say "warning: could not delete namespace $ns"
    n=$((n + 1))
  done
  rm -f "$(reg_file)"
  if [ -n "$(cluster_namespaces)" ]; then
    echo "$SELF: namespaces still present:" >&2; cluster_namespaces >&2; return 1
  fi
  if [ "$n" = 0 ]; then say "cluster '$PREFIX': nothing to remove"; else say "cluster '$PREFIX': removed $n namespaces"; fi
}

cmd_down_all() {
  local f rc=0
  [ -d "$STATE" ] || { say "no clusters registered in $STATE"; return 0; }
  for f in "$STATE"/*; do
    [ -f "$f" ] || continue
    PREFIX=$(basename "$f")
    cmd_down || rc=1
  done
  return $rc
}

cmd_gc() {
  local f owner rc=0
  [ -d "$STATE" ] || return 0
  for f in "$STATE"/*; do
    [ -f "$f" ] || continue
    PREFIX=$(basename "$f")
    owner=$(reg_get owner)
    if [ -n "$owner" ] && ! kill -0 "$owner" 2> /dev/null; then
      say "cluster '$PREFIX': owner $owner has exited"
      cmd_down || rc=1
    fi
  done
  return $rc
}

# set or remove the limit on both ends of every host's link
apply_link() {
  local i hosts=$1 what
  for ((i = 0; i < hosts; i++)); do
    if [ -n "$LINK" ]; then
      tc -n "$(ns_host "$i")" qdisc replace dev "$DEV" root tbf rate "$LINK" burst "$BURST" latency 50ms ||
        die "tc tbf on $(ns_host "$i")/$DEV failed"
      tc -n "$(ns_br)" qdisc replace dev "h$i" root tbf rate "$LINK" burst "$BURST" latency 50ms ||
        die "tc tbf on $(ns_br)/h$i failed"
    else
      tc -n "$(ns_host "$i")" qdisc del dev "$DEV" root 2> /dev/null
      tc -n "$(ns_br)" qdisc del dev "h$i" root 2> /dev/null
    fi
  done
  if [ -n "$LINK" ]; then what="limited to $LINK each way (tbf burst $BURST)"; else what="not limited"; fi
  say "links of $hosts hosts $what"
}

# is host J reachable from host 0? ping if there is one, else a TCP connect that must be refused
reachable() {
  local a=$SUBNET.$(($1 + 1)) out
  if command -v ping > /dev/null; then
    ip netns exec "$(ns_host 0)" ping -c 1 -W 1 "$a" > /dev/null 2>&1
  else
    out=$(ip netns exec "$(ns_host 0)" timeout 2 bash -c "exec 3<>/dev/tcp/$a/9" 2>&1) || [[ $out == *refused* ]]
  fi
}

create() {
  local i ns sub
  mkdir -p "$STATE" || die "cannot create $STATE"
  printf 'hosts=%s\nsubnet=%s\nmtu=%s\nowner=%s\ncreated=%s\n' "$HOSTS" "$SUBNET" "$MTU" "$OWNER" "$(date '+%F %T')" > "$(reg_file)"
  sub=$SUBNET.0/24
  if ip route show 2> /dev/null | awk '{print $1}' | grep -qxF "$sub"; then
    say "note: $sub is also routed in the root namespace; harmless, the cluster is a separate network"
  fi
  ns=$(ns_br)
  ip netns add "$ns" &&
    ip -n "$ns" link set lo up &&
    ip -n "$ns" link add "$BR" type bridge stp_state 0 forward_delay 0 &&
    ip -n "$ns" link set "$BR" up || return 1
  for ((i = 0; i < HOSTS; i++)); do
    ns=$(ns_host "$i")
    ip netns add "$ns" &&
      ip -n "$(ns_br)" link add "h$i" mtu "$MTU" type veth peer name "$DEV" netns "$ns" mtu "$MTU" &&
      ip -n "$(ns_br)" link set "h$i" master "$BR" &&
      ip -n "$(ns_br)" link set "h$i" up &&
      ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev "$DEV" &&
      ip -n "$ns" link set lo up &&
      ip -n "$ns" link set "$DEV" up || return 1
    # keep the hosts' traffic to what is sent on purpose (no IPv6 router solicitations, DAD)
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 > /dev/null 2>&1
  done
  ip netns exec "$(ns_br)" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 > /dev/null 2>&1
  return 0
}

# does the cluster exist with exactly this shape?
same_shape() {
  local i
  [ "$(reg_get hosts)" = "$HOSTS" ] && [ "$(reg_get subnet)" = "$SUBNET" ] && [ "$(reg_get mtu)" = "$MTU" ] || return 1
  ns_exists "$(ns_br)" || return 1
  [ "$(cluster_namespaces | grep -c -- '-h[0-9]*$')" = "$HOSTS" ] || return 1
  for ((i = 0; i < HOSTS; i++)); do
    ip -n "$(ns_host "$i")" -br addr show dev "$DEV" 2> /dev/null | grep -qF "$SUBNET.$((i + 1))/24" || return 1
  done
}

cmd_up() {
  local i ok
  [ -n "$HOSTS" ] || die "up needs --hosts N"
  [[ $HOSTS =~ ^[0-9]+$ ]] && [ "$HOSTS" -ge 1 ] && [ "$HOSTS" -le 250 ] || die "--hosts must be 1..250"
  [[ $SUBNET =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--subnet takes three octets, e.g. 10.233.0"
  case ${LINK,,} in none | off | 0 | unlimited) LINK="" ;; esac
  [ -n "$LINK" ] && [ -z "$BURST" ] && BURST=$(default_burst "$LINK")
  if same_shape; then
    say "cluster '$PREFIX' exists with $HOSTS hosts; re-applying the link limit"
    if [ -n "$OWNER" ]; then sed -i "s/^owner=.*/owner=$OWNER/" "$(reg_file)"; fi
  else
    if [ -n "$(cluster_namespaces)" ] || [ -f "$(reg_file)" ]; then
      say "cluster '$PREFIX' exists with another shape or half made; recreating it"
      cmd_down > /dev/null || die "could not remove the old cluster '$PREFIX'"
    fi
    if ! create; then
      echo "$SELF: creating cluster '$PREFIX' failed; cleaning up" >&2
      cmd_down > /dev/null 2>&1
      exit 1
    fi
    say "cluster '$PREFIX': switch $(ns_br) (bridge $BR), hosts $(ns_host 0)..$(ns_host $((HOSTS - 1))) at $SUBNET.1..$SUBNET.$HOSTS/24 on $DEV, mtu $MTU"
  fi
  apply_link "$HOSTS"
  for ((i = 1; i < HOSTS; i++)); do
    ok=0
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      if reachable "$i"; then ok=1; break; fi
      sleep 0.3
    done
    [ "$ok" = 1 ] || die "host $i ($SUBNET.$((i + 1))) is not reachable from host 0"
  done
  [ "$HOSTS" -gt 1 ] && say "all $HOSTS hosts reach each other"
  [ "$QUIET" = 1 ] || cmd_status
}

cmd_status() {
  local nss ns n
  nss=$(cluster_namespaces)
  if [ -z "$nss" ]; then say "cluster '$PREFIX': not up"; return 1; fi
  local o; o=$(reg_get owner)
  echo "cluster '$PREFIX': $(reg_get hosts) hosts, subnet $(reg_get subnet).0/24${o:+, owner pid $o}"
  for ns in $nss; do
    n=$(ip netns pids "$ns" 2> /dev/null | wc -l)
    if [ "$ns" = "$(ns_br)" ]; then
      echo "  $ns: bridge $BR, ports: $(ip -n "$ns" -o link show master "$BR" 2> /dev/null | awk -F': ' '{sub(/@.*/, "", $2); printf "%s ", $2}')"
      ip -n "$ns" -o link show master "$BR" 2> /dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | while read -r p; do
        echo "    $p egress: $(tc -n "$ns" qdisc show dev "$p" root | head -1)"
      done
    else
      echo "  $ns: $(ip -n "$ns" -br -4 addr show dev "$DEV" 2> /dev/null | awk '{sub(/@.*/, "", $1); print $1, $3}'), $n processes"
      echo "    $DEV egress: $(tc -n "$ns" qdisc show dev "$DEV" root | head -1)"
    fi
  done
}

host_index() {
  local h=${1#h}
  [[ $h =~ ^[0-9]+$ ]] || die "bad host '$1' (use an index 0..N-1 or hI)"
  ns_exists "$(ns_host "$h")" || die "cluster '$PREFIX' has no host $h"
  echo "$h"
}

cmd_exec() {
  [ $# -ge 2 ] || die "exec needs HOST and a command"
  local h
  h=$(host_index "$1") || exit 1
  shift
  exec ip netns exec "$(ns_host "$h")" "$@"
}

cmd_addr() {
  [ $# = 1 ] || die "addr needs HOST"
  local h subnet
  h=$(host_index "$1") || exit 1
  subnet=$(reg_get subnet)
  echo "${subnet:-$SUBNET}.$((h + 1))"
}

cmd_check() {
  local probe="tcheck$$" out
  is_root || { echo "not root: network namespaces need root"; exit 2; }
  if { ! command -v ip || ! command -v tc; } > /dev/null && command -v apt-get > /dev/null; then
    apt-get install -y iproute2 > /dev/null 2>&1 || { apt-get update > /dev/null 2>&1 && apt-get install -y iproute2 > /dev/null 2>&1; }
  fi
  command -v ip > /dev/null || { echo "ip (iproute2) not installed"; exit 2; }
  command -v tc > /dev/null || { echo "tc (iproute2) not installed"; exit 2; }
  out=$(ip netns add "$probe" 2>&1) || { echo "ip netns add failed: $out"; exit 2; }
  out=$( { ip -n "$probe" link add tc0 type veth peer name tc1 && ip -n "$probe" link add tb0 type bridge &&
    ip -n "$probe" link set tc0 up && tc -n "$probe" qdisc add dev tc0 root tbf rate 1gbit burst 256kb latency 50ms; } 2>&1)
  local rc=$?
  ip netns del "$probe" 2> /dev/null
  [ $rc = 0 ] || { echo "veth, bridge or tbf not available: $out"; exit 2; }
  echo "ok: root, ip netns, veth, bridge and tbf work"
}

cmd_launch() {
  local K=1 H="" TIMEOUT=300 PORT="" LABEL=1 envs=() hosts subnet master token n r h pids=() wd
  while [ $# -gt 0 ]; do
    case $1 in
      --ranks-per-host | -k) K=${2:?}; shift ;;
      --hosts) H=${2:?}; shift ;;
      --timeout) TIMEOUT=${2:?}; shift ;;
      --port) PORT=${2:?}; shift ;;
      --env) [[ ${2:-} == *=* ]] || die "--env takes NAME=VALUE"; envs+=("$2"); shift ;;
      --no-label) LABEL=0 ;;
      --prefix) PREFIX=${2:?}; check_prefix; shift ;;
      --) shift; break ;;
      *) die "launch: unknown option $1 (the program goes after --)" ;;
    esac
    shift
  done
  [ $# -ge 1 ] || die "launch needs -- PROGRAM [ARGS...]"
  [[ $K =~ ^[0-9]+$ ]] && [ "$K" -ge 1 ] || die "--ranks-per-host must be at least 1"
  hosts=$(reg_get hosts)
  [ -n "$hosts" ] || hosts=$(cluster_namespaces | grep -c -- '-h[0-9]*$')
  [ "$hosts" -ge 1 ] 2> /dev/null || die "cluster '$PREFIX' is not up (run: $SELF up --hosts N --prefix $PREFIX)"
  H=${H:-$hosts}
  [ "$H" -ge 1 ] && [ "$H" -le "$hosts" ] || die "--hosts $H: the cluster has $hosts hosts"
  subnet=$(reg_get subnet)
  subnet=${subnet:-$SUBNET}
  master=$subnet.1
  PORT=${PORT:-$((20000 + RANDOM % 10000))}
  token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
  n=$((H * K))
  say "launching $n ranks ($H hosts x $K) of $1, master $master:$PORT, timeout ${TIMEOUT}s"
  set -m # each rank in its own process group, so that it can be killed with its children
  for ((r = 0; r < n; r++)); do
    h=$((r / K))
    if [ "$LABEL" = 1 ]; then
      (
        ip netns exec "$(ns_host "$h")" env TUTTI_RANK=$r TUTTI_WORLD_SIZE=$n TUTTI_LOCAL_RANK=$((r % K)) \
          TUTTI_MASTER_ADDR="$master" TUTTI_MASTER_PORT="$PORT" TUTTI_TOKEN="$token" \
          CLUSTER_HOST=$h CLUSTER_HOSTS="$H" CLUSTER_RANKS_PER_HOST="$K" ${envs[@]+"${envs[@]}"} "$@" 2>&1 |
          sed -u "s/^/[$r] /"
        exit "${PIPESTATUS[0]}"
      ) &
    else
      ip netns exec "$(ns_host "$h")" env TUTTI_RANK=$r TUTTI_WORLD_SIZE=$n TUTTI_LOCAL_RANK=$((r % K)) \
        TUTTI_MASTER_ADDR="$master" TUTTI_MASTER_PORT="$PORT" TUTTI_TOKEN="$token" \
        CLUSTER_HOST=$h CLUSTER_HOSTS="$H" CLUSTER_RANKS_PER_HOST="$K" ${envs[@]+"${envs[@]}"} "$@" &
    fi
    pids+=($!)
  done
  sleep "$TIMEOUT" &
  wd=$!
  set +m
  local live=("${pids[@]}") first_rc=0 first="" done_pid rc i t0=$SECONDS
  kill_ranks() {
    local p
    for p in "${live[@]}"; do kill -TERM -- "-$p" 2> /dev/null; done
    sleep 0.5
    for p in "${live[@]}"; do kill -KILL -- "-$p" 2> /dev/null; done
  }
  trap 'echo "$SELF: interrupted; killing the ranks" >&2; kill_ranks; kill "$wd" 2> /dev/null; exit 130' INT TERM HUP
  while [ ${#live[@]} -gt 0 ]; do
    done_pid=""
    wait -n -p done_pid "${live[@]}" "$wd"
    rc=$?
    [ -n "$done_pid" ] || continue
    if [ "$done_pid" = "$wd" ]; then
      local which=()
      for p in "${live[@]}"; do for ((i = 0; i < n; i++)); do [ "${pids[$i]}" = "$p" ] && which+=("$i"); done; done
      echo "$SELF: timeout after ${TIMEOUT}s; ranks still running: ${which[*]}; killing them" >&2
      kill_ranks
      trap - INT TERM HUP
      return 124
    fi
    for ((i = 0; i < n; i++)); do [ "${pids[$i]}" = "$done_pid" ] && r=$i; done
    local rest=()
    for p in "${live[@]}"; do [ "$p" != "$done_pid" ] && rest+=("$p"); done
    live=(${rest[@]+"${rest[@]}"})
    if [ "$rc" != 0 ]; then
      first=$r first_rc=$rc
      echo "$SELF: rank $r (host $((r / K))) failed with exit code $rc after $((SECONDS - t0))s; killing the other ${#live[@]} ranks" >&2
      kill_ranks
      break
    fi
  done
  kill "$wd" 2> /dev/null
  wait "$wd" 2> /dev/null
  trap - INT TERM HUP
  if [ -n "$first" ]; then return "$first_rc"; fi
  say "all $n ranks exited with 0 in $((SECONDS - t0))s"
}

# ---- arguments ----
CMD=${1:-}
[ -n "$CMD" ] && shift
case $CMD in
  -h | --help | help | "") usage; exit 0 ;;
esac
PREFIX=${CLUSTER_PREFIX:-tutti}
HOSTS="" LINK="" BURST="" SUBNET=${CLUSTER_SUBNET:-10.233.0} MTU=1500 OWNER="" ALL=0 QUIET=0
if [ "$CMD" = launch ]; then
  need_tools
  cmd_launch "$@"
  exit $?
fi
if [ "$CMD" = exec ] || [ "$CMD" = addr ]; then
  # options first, then HOST CMD...
  while [ $# -gt 0 ]; do
    case $1 in
      --prefix) PREFIX=${2:?}; shift ;;
      --prefix=*) PREFIX=${1#--prefix=} ;;
      *) break ;;
    esac
    shift
  done
  check_prefix
  need_tools
  "cmd_$CMD" "$@"
  exit $?
fi
while [ $# -gt 0 ]; do
  case $1 in
    --hosts) HOSTS=${2:?--hosts needs a value}; shift ;;
    --hosts=*) HOSTS=${1#--hosts=} ;;
    --link | --rate) LINK=${2:?--link needs a value}; shift ;;
    --link=* | --rate=*) LINK=${1#*=} ;;
    --burst) BURST=${2:?--burst needs a value}; shift ;;
    --prefix) PREFIX=${2:?--prefix needs a value}; shift ;;
    --prefix=*) PREFIX=${1#--prefix=} ;;
    --subnet) SUBNET=${2:?--subnet needs a value}; shift ;;
    --mtu) MTU=${2:?--mtu needs a value}; shift ;;
    --owner) OWNER=${2:?--owner needs a pid}; shift ;;
    --all) ALL=1 ;;
    --quiet | -q) QUIET=1 ;;
    *) die "unknown option $1 (see $SELF --help)" ;;
  esac
  shift
done
check_prefix
case $CMD in
  up) need_tools; cmd_up ;;
  down) need_tools; if [ "$ALL" = 1 ]; then cmd_down_all; else cmd_down; fi ;;
  status) need_tools; cmd_status ;;
  check) cmd_check ;;
  gc) need_tools; cmd_gc ;;
  *) die "unknown command '$CMD' (up, down, status, exec, addr, launch, check, gc)" ;;
esac
