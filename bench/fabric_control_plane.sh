#!/usr/bin/env bash
# The control plane under a saturated data plane on an emulated fabric (issue 55's case):
# scripts/fabric.sh with 4 nodes x 2 rails of 1 Gbit/s (4 daemons on this machine's cores), two
# jobs of one rank per node running back-to-back 16 MiB AllReduces with deep queues
# (railyard-perf -n 100000), for SECONDS; Admin.Status is polled on every daemon every 0.5 s.
# Per --data_plane_nice value (launches interleaved, REPS times) it prints the slowest Status,
# how many jobs were aborted, and the daemons' "has not answered" / keepalive aborts.
#   bench/fabric_control_plane.sh [REPS=2] [SECONDS=30] [NICE_VALUES="0 5"]
# Not a test: numbers depend on the machine and its load. Needs root (network namespaces).
# Measured on the 2-vCPU VM (2026-12-07, 1 rep, 25 s): nice 0: slowest Status 3913 ms, both jobs
# aborted (8 peer-silence aborts logged); nice 5: 5002 ms, both aborted (7). Each daemon's two
# ry-rings threads spun at ~90% of a core each (8 spinning threads on 2 cores, plus the veths'
# packets): priority alone does not keep the control plane answering here; the rings' polling
# must stop costing a core while the network works (the frugal-progress issue).
# After that issue's fixes (clients no longer poke a ring thread per 50 us while they wait for
# ring room; rails moderate their events), same machine, 1 rep, 25 s: nice 0: slowest Status
# 3 ms, 0 of 2 jobs aborted, 0 peer-silence aborts; nice 5: 3 ms, 0, 0.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-2}
seconds=${2:-30}
values=${3:-"0 5"}
build=${RAILYARD_BUILD_DIR:-build}
dir=$(mktemp -d /tmp/ry-fabric-cp.XXXXXX)
trap 'scripts/fabric.sh down --dir "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for rep in $(seq "$reps"); do
  for nice in $values; do
    RAILYARD_DATA_PLANE_NICE=$nice scripts/fabric.sh up --nodes 4 --rails 2 --rate 1gbit \
      --dir "$dir" --prefix ryc- >/dev/null
    socks="$dir/n0.sock,$dir/n1.sock,$dir/n2.sock,$dir/n3.sock"
    pids=()
    for j in 0 1; do
      "$build/tools/railyard-perf" --daemons "$socks" -b 16M -e 16M -n 100000 -w 0 -c 0 \
        --job "cp$j" --token t --deadline_s $((seconds + 60)) >"$dir/job$j.log" 2>&1 &
      pids+=($!)
    done
    PYTHONPATH="$build/python" /usr/bin/python3 - "$dir" "$seconds" "$nice" <<'PY'
import sys, time, grpc
from railyard.v1 import admin_pb2, admin_pb2_grpc
d, seconds, nice = sys.argv[1], float(sys.argv[2]), sys.argv[3]
stubs = [admin_pb2_grpc.AdminStub(grpc.insecure_channel(f"unix:{d}/n{k}.sock.admin"))
         for k in range(4)]
time.sleep(3)
worst, failures, calls = 0.0, 0, 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    for s in stubs:
        t0 = time.monotonic()
        try:
            s.Status(admin_pb2.StatusRequest(), timeout=5)
        except grpc.RpcError:
            failures += 1
        worst = max(worst, time.monotonic() - t0)
        calls += 1
    time.sleep(0.5)
print(f"nice {nice}: {calls} Status calls, slowest {worst * 1e3:.0f} ms, {failures} failed",
      end="")
PY
    aborted=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || aborted=$((aborted + 1)); done
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
    stalls=$(cat "$dir"/n*.log 2>/dev/null | grep -c -E "has not answered|keepalive" || true)
    echo "; jobs aborted: $aborted of 2; peer-silence aborts logged: $stalls"
    scripts/fabric.sh down --dir "$dir" >/dev/null
  done
done
