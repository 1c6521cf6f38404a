#!/usr/bin/env bash
# An emulated rail-optimised cluster on one machine: K node network namespaces, R rails each,
# every link shaped to RATE in both directions, one railyardd per node (issue 14).
#
#   scripts/fabric.sh up --nodes K --rails R --rate RATE [--ranks-per-node G] [--pace BW|none]
#                        [--intra BW] [--dir DIR] [--prefix P] [--daemon-flags "FLAGS"]
#   scripts/fabric.sh status [--dir DIR]
#   scripts/fabric.sh down   [--dir DIR]
#   scripts/fabric.sh probe  [--dir DIR] [--seconds S]   # single-TCP-flow throughput n0 -> n1
#
# Layout (P = --prefix, default "ry-"): namespaces Pn0 .. Pn{K-1} and a hub namespace Pfabric
# holding one Linux bridge per rail (br<i>). Node k's rail i is a veth pair: "rail<i>" inside
# Pn<k> with address 10.77.<i>.<k+1>/24, and "n<k>r<i>" in the hub, a port of br<i> -- so rail i
# of a node reaches only rail i of the other nodes (one switch per rail). The subnets exist only
# inside these namespaces; the host's own namespace is not touched. Both ends of every veth are
# shaped with tbf to RATE: the node end's egress is what the node transmits on the rail, the
# hub end's egress what it receives.
#
# Each node runs `ip netns exec Pn<k> railyardd` (binaries from ${RAILYARD_BUILD_DIR:-build})
# with --socket=DIR/n<k>.sock (Admin on DIR/n<k>.sock.admin), --peer_listen and --metrics_listen
# on its rail0 address (ports 7077 and 9090; plaintext peer plane, --peer_insecure, and
# --insecure_first_session_token: an emulation, not a cluster), --state_dir=DIR/n<k>.state and
# the topology DIR/n<k>.json naming its rails (device rail<i>, speed_gbps RATE, pace), then
# --daemon-flags (words split on spaces, e.g. "--rail_stall_timeout=2s"). DIR/
# fabric.json describes the whole cluster for the cost model:
#   railctl model allreduce --size 64MiB --topology DIR/fabric.json
# Clients (railyard-perf, railctl) run in the host namespace: they reach a daemon over its Unix
# socket and shared memory, which namespaces do not separate; the daemons' traffic to each other
# crosses the shaped veths. Metrics: ip netns exec Pn<k> curl http://ADDRESS/metrics.
#
# RATE: a rate in bits per second, 1gbit, 100mbit, 2.5Gbit/s, 1Gbps. --pace: the rate each
# daemon paces a rail to (topology rails[i].pace); default 88% of RATE: below what the link
# delivers (one TCP flow: 95.6% of RATE, 1448 B of payload per 1514 B frame; one job's ring
# AllReduce here: ~90%), so the backlog waits in the daemons' fair queues (docs/fair-share.md;
# paced at 94%, weights 3:1 gave 2.1-2.4:1, at 88% 2.9:1); "none" leaves it out. The same rate is
# fabric.json's inter-node bandwidth (alpha 50us, a rough TCP-over-veth latency). --intra:
# fabric.json's intra-node (shared memory) bandwidth, default 4GB/s (alpha 2us): a modest
# default for a small machine, not measured by this script; pass what your daemon reaches.
# --ranks-per-node G (default R) only enters fabric.json.
#
# tbf: burst max(16 KiB, RATE x 4 ms) and a 25 ms queue (latency). tbf counts whole frames
# (1514 B for 1448 B of TCP payload), so one TCP flow tops out at 95.6% of RATE. Measured with
# `probe` (one TCP flow n0 -> n1 on rail0, python sockets, 2-3 s, on the 2-core machine this was
# written on): 1gbit -> 947.6 and 956.5 Mbit/s of payload (two runs), 100mbit -> 95.2 Mbit/s:
# a single flow fills the shaped link.
#
# What up made is recorded in DIR/fabric.state (namespaces, daemon pids, files); down removes
# exactly that and stops exactly those pids. up is idempotent: the same fabric already up
# prints its lines again; different parameters tear the old one down first. down twice is fine.
# up prints one line per node:
#   node NAME netns NS socket PATH peer ADDRESS metrics ADDRESS
# Exit status: 0 ok; 1 a daemon failed to start (its log is printed); 2 bad arguments or a
# machine that cannot do it (not root, no ip netns, no tc/tbf, no bridge).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/netns.sh
. "$root/scripts/lib/netns.sh"

peer_port=7077
metrics_port=9090
subnet=10.77

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die() {  # CODE MESSAGE
  echo "fabric: $2" >&2
  exit "$1"
}

cmd=${1:-}
[ -n "$cmd" ] || usage
shift
nodes="" rails="" rate="" rpn="" pace="" intra="4GB/s" dir=/tmp/railyard-fabric prefix=ry- seconds=3
daemon_flags=""
while [ $# -gt 0 ]; do
  case $1 in
    --nodes | --rails | --rate | --ranks-per-node | --pace | --intra | --dir | --prefix | --seconds | \
      --daemon-flags)
      [ $# -ge 2 ] || die 2 "$1 needs a value"
      case $1 in
        --nodes) nodes=$2 ;;
        --rails) rails=$2 ;;
        --rate) rate=$2 ;;
        --ranks-per-node) rpn=$2 ;;
        --pace) pace=$2 ;;
        --intra) intra=$2 ;;
        --dir) dir=$2 ;;
        --prefix) prefix=$2 ;;
        --seconds) seconds=$2 ;;
        --daemon-flags) daemon_flags=$2 ;;
      esac
      shift 2
      ;;
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
    -h | --help) usage ;;
    *) die 2 "unknown argument '$1' (try $0 --help)" ;;
  esac
done
case $dir in /*) ;; *) dir=$(pwd)/$dir ;; esac
state=$dir/fabric.state
hub=${prefix}fabric
build=${RAILYARD_BUILD_DIR:-build}
case $build in /*) ;; *) build=$root/$build ;; esac

need_machine() {  # exit 2 unless this machine can build a fabric
  local why
  if why=$(netns_unavailable); then die 2 "cannot build a fabric: $why"; fi
  command -v tc >/dev/null 2>&1 || die 2 "cannot shape links: no tc command (install iproute2's tc)"
}

# ---- the state file: "params ...", "netns NAME", "pid PID", "file PATH", "line ..." ----
record() { echo "$*" >>"$state"; }
recorded() {  # KIND: the values recorded under KIND
  [ -f "$state" ] || return 0
  awk -v k="$1" '$1 == k { sub(/^[^ ]+ /, ""); print }' "$state"
}
is_daemon() {  # PID: running and a railyardd (a recycled pid is left alone)
  [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q railyardd
}
healthy() {  # the recorded fabric is whole: every namespace, every daemon, every socket
  [ -f "$state" ] || return 1
  local ns pid line sock
  for ns in $(recorded netns); do [ -e "/run/netns/$ns" ] || return 1; done
  for pid in $(recorded pid); do is_daemon "$pid" || return 1; done
  while read -r line; do
    sock=$(echo "$line" | awk '{print $6}')
    [ -S "$sock" ] || return 1
  done < <(recorded line)
  [ -n "$(recorded line)" ]
}

do_down() {
  [ -f "$state" ] || return 0
  local pid ns f
  for pid in $(recorded pid); do is_daemon "$pid" && kill -TERM "$pid" 2>/dev/null; done
  for pid in $(recorded pid); do
    for _ in $(seq 50); do is_daemon "$pid" || break; sleep 0.1; done
    if is_daemon "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
  # Deleting a namespace deletes its veth ends, bridges and qdiscs with it.
  for ns in $(recorded netns); do
    [ -e "/run/netns/$ns" ] && ip netns del "$ns" 2>/dev/null
  done
  for f in $(recorded file); do rm -rf "$f"; done
  local made_dir
  made_dir=$(recorded dir)
  rm -f "$state"
  [ -n "$made_dir" ] && rmdir "$made_dir" 2>/dev/null
  return 0
}

print_lines() { recorded line; }

# ---- up ----
check_up_args() {
  if ! [[ $nodes =~ ^[0-9]+$ ]] || [ "$nodes" -lt 2 ]; then die 2 "--nodes K: need an integer K >= 2 (got '${nodes}')"; fi
  if ! [[ $rails =~ ^[0-9]+$ ]] || [ "$rails" -lt 1 ]; then die 2 "--rails R: need an integer R >= 1 (got '${rails}')"; fi
  [ "$nodes" -le 250 ] || die 2 "--nodes $nodes: at most 250 (addresses are 10.77.<rail>.<node+1>)"
  [ "$rails" -le 64 ] || die 2 "--rails $rails: at most 64"
  [ -n "$rate" ] || die 2 "--rate RATE is required (e.g. 1gbit, 100mbit)"
  rate_bps=$(rate_bits "$rate") || die 2 "--rate '$rate': not a rate (use bits per second: 1gbit, 100mbit, 2.5Gbit/s, 1Gbps)"
  rpn=${rpn:-$rails}
  if ! [[ $rpn =~ ^[0-9]+$ ]] || [ "$rpn" -lt 1 ]; then die 2 "--ranks-per-node G: need an integer G >= 1 (got '$rpn')"; fi
  [[ $prefix =~ ^[A-Za-z0-9_.-]{1,8}$ ]] || die 2 "--prefix '$prefix': 1-8 characters of [A-Za-z0-9_.-]"
  [[ $intra =~ ^[0-9.]+[A-Za-z/]+$ ]] || die 2 "--intra '$intra': a bandwidth such as 4GB/s"
  # The pace: 88% of the line rate, in bytes per second (see the header).
  payload=$(awk -v b="$rate_bps" 'BEGIN { v = b * 0.88 / 8; if (v >= 1e6) printf "%.4gMB/s\n", v / 1e6; else printf "%.4gKB/s\n", v / 1e3 }')
  case $pace in
    "") pace=$payload ;;
    none) ;;
    *) [[ $pace =~ ^[0-9.]+[A-Za-z/]+$ ]] || die 2 "--pace '$pace': a bandwidth such as 117MB/s, or none" ;;
  esac
  if [ "$pace" = none ]; then inter=$payload; else inter=$pace; fi
  gbps=$(awk -v b="$rate_bps" 'BEGIN { printf "%.6g\n", b / 1e9 }')
  # tbf: a burst of 4 ms at the rate (at least 16 KiB, so a GSO super-packet is not split more
  # than needed) and a queue of 25 ms: what lets one TCP flow fill the link (see the header).
  burst=$(awk -v b="$rate_bps" 'BEGIN { v = b / 8 * 0.004; if (v < 16384) v = 16384; printf "%.0f\n", v }')
  params="nodes=$nodes rails=$rails rate=$rate_bps rpn=$rpn pace=$pace intra=$intra prefix=$prefix build=$build flags=$daemon_flags"
}

up_failed() {
  local rc=$?
  if [ "$rc" != 0 ] && [ -n "${up_running:-}" ]; then
    echo "fabric: up failed (exit $rc); removing what it made" >&2
    do_down
  fi
  exit "$rc"
}

wait_link_up() {  # NS DEV: bounded wait for the link to be up with a carrier
  for _ in $(seq 200); do
    ip -n "$1" link show dev "$2" 2>/dev/null | grep -q 'state UP' && return 0
    sleep 0.02
  done
  die 1 "link $2 in namespace $1 did not come up"
}

shape() {  # NS DEV: tbf to the rate on DEV's egress
  local err
  if ! err=$(ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${rate_bps}bit" \
    burst "$burst" latency 25ms 2>&1); then
    die 2 "cannot shape $2 in $1 with tc tbf (kernel module sch_tbf missing?): $err"
  fi
}

do_up() {
  check_up_args
  need_machine
  if [ -f "$state" ]; then
    if [ "$(recorded params)" = "$params" ] && healthy; then
      print_lines
      return 0
    fi
    if [ "$(recorded params)" = "$params" ]; then
      echo "fabric: the fabric in $dir is broken (a namespace, daemon or socket is gone); rebuilding it" >&2
    else
      echo "fabric: a different fabric is up in $dir; tearing it down first" >&2
    fi
    do_down
  fi
  [ -x "$build/daemon/railyardd" ] || die 2 "no $build/daemon/railyardd (run scripts/build.sh, or set RAILYARD_BUILD_DIR)"
  local k i ns
  for ((k = 0; k < nodes; k++)); do
    [ -e "/run/netns/${prefix}n$k" ] && die 2 "namespace ${prefix}n$k exists but is not this fabric's ($state does not list it): delete it (ip netns del ${prefix}n$k) or use another --prefix"
  done
  [ -e "/run/netns/$hub" ] && die 2 "namespace $hub exists but is not this fabric's: delete it (ip netns del $hub) or use another --prefix"

  up_running=1
  trap up_failed EXIT
  if [ ! -d "$dir" ]; then
    mkdir -p "$dir"
    echo "dir $dir" >"$state"
  else
    : >"$state"
  fi
  chmod 755 "$dir"
  record "params $params"
  local err
  err=$(ip netns add "$hub" 2>&1) || die 2 "ip netns add $hub failed: $err"
  record "netns $hub"
  ip -n "$hub" link set lo up
  for ((i = 0; i < rails; i++)); do
    err=$(ip -n "$hub" link add "br$i" type bridge forward_delay 0 stp_state 0 2>&1) ||
      die 2 "cannot make a Linux bridge (kernel module bridge missing?): $err"
    ip -n "$hub" link set "br$i" up
  done
  for ((k = 0; k < nodes; k++)); do
    ns=${prefix}n$k
    err=$(ip netns add "$ns" 2>&1) || die 2 "ip netns add $ns failed: $err"
    record "netns $ns"
    ip -n "$ns" link set lo up
    for ((i = 0; i < rails; i++)); do
      err=$(ip link add "rail$i" netns "$ns" type veth peer name "n${k}r$i" netns "$hub" 2>&1) ||
        die 2 "cannot make a veth pair: $err"
      ip -n "$ns" addr add "$subnet.$i.$((k + 1))/24" dev "rail$i"
      ip -n "$hub" link set "n${k}r$i" master "br$i"
      shape "$ns" "rail$i"
      shape "$hub" "n${k}r$i"
      ip -n "$hub" link set "n${k}r$i" up
      ip -n "$ns" link set "rail$i" up
    done
  done
  # UCX offers only devices that are up with a carrier.
  for ((k = 0; k < nodes; k++)); do
    for ((i = 0; i < rails; i++)); do wait_link_up "${prefix}n$k" "rail$i"; done
  done

  # Topology files and daemons.
  local fabric_rails="" rail_json node sock addr
  for ((k = 0; k < nodes; k++)); do
    node=n$k
    rail_json=""
    for ((i = 0; i < rails; i++)); do
      rail_json+="${rail_json:+, }{\"name\": \"rail$i\", \"device\": \"rail$i\", \"speed_gbps\": $gbps"
      [ "$pace" != none ] && rail_json+=", \"pace\": \"$pace\""
      rail_json+="}"
    done
    [ "$k" = 0 ] && fabric_rails=$rail_json
    echo "{\"node\": \"$node\", \"rails\": [$rail_json]}" >"$dir/$node.json"
    record "file $dir/$node.json"
  done
  cat >"$dir/fabric.json" <<JSON
{
  "description": "scripts/fabric.sh: $nodes emulated nodes x $rpn ranks, $rails rails of $rate (tbf), one bridge per rail",
  "node": "n0",
  "rails": [$fabric_rails],
  "intra": {"alpha": "2us", "bandwidth": "$intra"},
  "fabric": {
    "kind": "rail_optimized",
    "nodes": $nodes,
    "ranks_per_node": $rpn,
    "rails": $rails,
    "inter": {"alpha": "50us", "bandwidth": "$inter"}
  }
}
JSON
  record "file $dir/fabric.json"
  local pids=() extra=()
  read -r -a extra <<<"$daemon_flags"
  for ((k = 0; k < nodes; k++)); do
    node=n$k ns=${prefix}n$k sock=$dir/n$k.sock addr=$subnet.0.$((k + 1))
    rm -f "$sock" "$sock.admin" "$sock.fd"
    record "file $sock"
    record "file $sock.admin"
    record "file $sock.fd"
    record "file $dir/$node.log"
    record "file $dir/$node.state"
    mkdir -p "$dir/$node.state"
    # setsid: the daemons outlive this script and its terminal; ip netns exec execs railyardd,
    # so $! is the daemon's pid.
    setsid ip netns exec "$ns" "$build/daemon/railyardd" --socket="$sock" \
      --insecure_first_session_token --peer_listen="$addr:$peer_port" --peer_insecure \
      --metrics_listen="$addr:$metrics_port" --node_name="$node" --topology="$dir/$node.json" \
      --state_dir="$dir/$node.state" "${extra[@]}" </dev/null >"$dir/$node.log" 2>&1 &
    pids+=($!)
    record "pid $!"
  done
  for ((k = 0; k < nodes; k++)); do
    sock=$dir/n$k.sock
    for _ in $(seq 200); do
      [ -S "$sock" ] && break
      kill -0 "${pids[$k]}" 2>/dev/null || break
      sleep 0.05
    done
    if [ ! -S "$sock" ]; then
      echo "fabric: railyardd of n$k (pid ${pids[$k]}) did not create $sock; its log:" >&2
      sed 's/^/  /' "$dir/n$k.log" >&2
      exit 1
    fi
  done
  for ((k = 0; k < nodes; k++)); do
    addr=$subnet.0.$((k + 1))
    record "line node n$k netns ${prefix}n$k socket $dir/n$k.sock peer $addr:$peer_port metrics $addr:$metrics_port"
  done
  up_running=""
  trap - EXIT
  print_lines
}

# ---- probe: one TCP flow from n0's rail0 to n1's rail0 for S seconds ----
do_probe() {
  healthy || die 1 "no fabric up in $dir (scripts/fabric.sh up ...)"
  local p src dst
  p=$(recorded params | sed 's/.*prefix=\([^ ]*\).*/\1/')
  src=${p}n0 dst=${p}n1
  ip netns exec "$dst" timeout $((seconds + 10)) /usr/bin/python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.77.0.2", 5201)); s.listen(1); s.settimeout(5); c, _ = s.accept()
while c.recv(1 << 20): pass' &
  local server=$!
  sleep 0.3
  ip netns exec "$src" timeout $((seconds + 10)) /usr/bin/python3 -c '
import socket, sys, time
secs = float(sys.argv[1]); buf = b"\0" * (1 << 20)
c = socket.create_connection(("10.77.0.2", 5201), timeout=5)
t0 = time.time(); n = 0
while time.time() - t0 < secs: n += c.send(buf)
c.shutdown(socket.SHUT_WR); c.recv(1); t = time.time() - t0
print(f"probe: one TCP flow n0 -> n1 on rail0: {n * 8 / t / 1e6:.1f} Mbit/s of payload over {t:.1f} s")
' "$seconds"
  wait "$server" || true
}

case $cmd in
  up) do_up ;;
  down) do_down ;;
  status)
    if healthy; then print_lines; else
      echo "fabric: not up in $dir" >&2
      exit 1
    fi
    ;;
  probe) do_probe ;;
  -h | --help | help) usage ;;
  *) die 2 "unknown command '$cmd' (up, down, status, probe)" ;;
esac
