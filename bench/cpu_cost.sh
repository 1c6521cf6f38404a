#!/usr/bin/env bash
# What the daemons' progress costs in CPU while the network works (issue 56): scripts/fabric.sh
# with 2 nodes x 1 rail, one job of one rank per node running back-to-back 16 MiB AllReduces
# (railyard-perf -n 100000: up to 1023 in flight), at each RATE (default 200mbit, 1gbit and
# 100gbit with --pace none: a veth that tbf does not hold back, the "unshaped" case). Over a
# WINDOW-second window (after 3 s) it reads each daemon's CPU time (/proc/PID/stat, all threads)
# and how many operations completed (Admin.Status), and prints per rate: MB/s each node sent
# (a 2-node ring AllReduce sends M per node per operation), each daemon's CPU in % of one core,
# and CPU seconds per GB sent; REPS repetitions, rates interleaved, medians at the end.
#   bench/cpu_cost.sh [REPS=3] [WINDOW=10] [RATES="200mbit 1gbit 100gbit"]
# Environment: RAILYARD_BUILD_DIR (default build). Needs root (network namespaces).
# Not a test: the ranks, the daemons and the veths' packets share this machine's cores.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/netns.sh
. scripts/lib/netns.sh
reps=${1:-3}
window=${2:-10}
rates=${3:-"200mbit 1gbit 100gbit"}
build=${RAILYARD_BUILD_DIR:-build}
dir=/tmp/railyard-cpu-cost
if why=$(netns_unavailable); then
  echo "cpu_cost: cannot run: $why" >&2
  exit 2
fi
perf_pid=
cleanup() {
  [ -n "$perf_pid" ] && kill "$perf_pid" 2>/dev/null || true
  scripts/fabric.sh down --dir "$dir" >/dev/null 2>&1 || true
}
trap cleanup EXIT
ticks=$(getconf CLK_TCK)
cpu_of() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
ops_of() { # admin socket -> operations completed
  PYTHONPATH="$build/python" /usr/bin/python3 -c '
import sys, grpc
from railyard.v1 import admin_pb2, admin_pb2_grpc
s = admin_pb2_grpc.AdminStub(grpc.insecure_channel("unix:" + sys.argv[1]))
print(s.Status(admin_pb2.StatusRequest(), timeout=10).ops_completed)' "$1"
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
declare -A mbs cpus costs
printf '%-4s %-8s %-10s %-22s %-10s\n' rep rate MB/s/node daemon_cpu_%_of_a_core cpu_s/GB
for rep in $(seq "$reps"); do
  for rate in $rates; do
    pace=()
    [ "$rate" = 100gbit ] && pace=(--pace none)
    scripts/fabric.sh up --nodes 2 --rails 1 --rate "$rate" "${pace[@]}" --dir "$dir" \
      --prefix ryc- >/dev/null
    pids=$(awk '/^pid/ { print $2 }' "$dir/fabric.state" 2>/dev/null || true)
    [ -n "$pids" ] || pids=$(pgrep -f "railyardd .*--socket=$dir/n" | paste -sd' ')
    "$build/tools/railyard-perf" --daemons "$dir/n0.sock,$dir/n1.sock" -b 16M -e 16M -n 100000 \
      -w 0 -c 0 --job cpu --deadline_s $((window + 60)) >"$dir/perf.log" 2>&1 &
    perf_pid=$!
    sleep 3
    c0=0
    for p in $pids; do c0=$((c0 + $(cpu_of "$p"))); done
    o0=$(ops_of "$dir/n0.sock.admin")
    t0=$(date +%s.%N)
    sleep "$window"
    c1=0
    for p in $pids; do c1=$((c1 + $(cpu_of "$p"))); done
    o1=$(ops_of "$dir/n0.sock.admin")
    t1=$(date +%s.%N)
    kill "$perf_pid" 2>/dev/null || true
    wait "$perf_pid" 2>/dev/null || true
    perf_pid=
    scripts/fabric.sh down --dir "$dir" >/dev/null
    read -r mb cpu cost < <(awk -v c="$((c1 - c0))" -v hz="$ticks" -v o="$((o1 - o0))" \
      -v t0="$t0" -v t1="$t1" -v nd="$(wc -w <<<"$pids")" 'BEGIN {
        s = t1 - t0; bytes = o * 16777216; cs = c / hz
        printf "%.1f %.1f %.3f\n", bytes / s / 1e6, 100 * cs / s / nd, (bytes > 0 ? cs / nd / (bytes / 1e9) : 0) }')
    mbs[$rate]+="$mb " cpus[$rate]+="$cpu " costs[$rate]+="$cost "
    printf '%-4s %-8s %-10s %-22s %-10s\n' "$rep" "$rate" "$mb" "$cpu" "$cost"
  done
done
echo
for rate in $rates; do
  # shellcheck disable=SC2086
  echo "$rate: medians of $reps: $(median ${mbs[$rate]}) MB/s per node, daemon CPU $(median ${cpus[$rate]}) % of a core each, $(median ${costs[$rate]}) CPU s per GB sent"
done
echo "(2 nodes x 1 rail, one job, 16 MiB AllReduce back to back with up to 1023 in flight; 100gbit: tbf at 100 Gbit/s, unpaced: the veth's own speed)"
