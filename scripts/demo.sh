#!/usr/bin/env bash
# The main job on the embedded default: installs what is missing, builds, starts two virtual
# nodes on this machine (two railyardd on loopback, each with its own socket, peer port and a
# topology of two rails), runs an nccl-tests-style hierarchical rail-aligned AllReduce sweep with
# two rank processes per node, shows both daemons' status, and stops them.
#   DEMO_MAX=64M DEMO_RANKS=2 DEMO_ALGO=hier DEMO_OP=allreduce scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# Only what the demo runs: the daemon, railyard-perf, railctl (not the test suite's ~300 targets).
RAILYARD_TARGETS="railyardd railyard-perf railctl railyard_python" scripts/build.sh

build=${RAILYARD_BUILD_DIR:-build}
max=${DEMO_MAX:-64M}
ranks=${DEMO_RANKS:-2}
algo=${DEMO_ALGO:-hier}
op=${DEMO_OP:-allreduce}
dir=$(mktemp -d /tmp/railyard-demo.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  rm -rf "$dir"
}
trap cleanup EXIT

socks=()
for n in 0 1; do
  cat >"$dir/node$n.json" <<JSON
{"node": "demo-node-$n", "rails": [{"name": "rail0", "device": "lo"}, {"name": "rail1", "device": "lo"}]}
JSON
  # Loopback only: the peer plane may stay plaintext here (--peer_insecure); a cluster runs
  # mutual TLS (--peer_tls_cert/--peer_tls_key/--peer_tls_ca, scripts/peer-certs.sh to try it).
  "$build/daemon/railyardd" --socket="$dir/node$n.sock" --insecure_first_session_token --peer_listen=127.0.0.1:0 \
    --peer_insecure --topology="$dir/node$n.json" --metrics_listen=127.0.0.1:0 >"$dir/node$n.log" 2>&1 &
  pids+=($!)
  socks+=("$dir/node$n.sock")
done
for s in "${socks[@]}"; do
  for _ in $(seq 100); do [ -S "$s" ] && break; sleep 0.05; done
  [ -S "$s" ] || { echo "demo: railyardd did not start:"; cat "$dir"/node*.log; exit 1; }
done
echo "demo: two virtual nodes (railyardd pids ${pids[*]}), 2 rails each, $ranks ranks per node"
echo

RAILYARD_ALGO="$algo" "$build/tools/railyard-perf" --op "$op" -b 8 -e "$max" -f 4 -n 20 -w 5 \
  -c 1 --daemons "$(IFS=,; echo "${socks[*]}")" --ranks-per-daemon "$ranks"
echo
for s in "${socks[@]}"; do
  "$build/tools/railctl" status --socket "$s"
  echo
done
# Live figures from each daemon's Prometheus endpoint (railyard_link_bytes_total per peer/rail,
# collectives counted, p50 latency of the largest AllReduce bucket from the histogram).
for n in 0 1; do
  addr=$(grep -m1 -o 'metrics_address=[^ ]*' "$dir/node$n.log" | cut -d= -f2)
  [ -n "$addr" ] || continue
  echo "demo: demo-node-$n metrics at http://$addr/metrics"
  curl -sf --max-time 5 "http://$addr/metrics" | awk '
    /^railyard_link_bytes_total\{/ && /direction="tx"/ {
      match($0, /peer="[^"]*"/); peer = substr($0, RSTART + 6, RLENGTH - 7)
      match($0, /rail="[^"]*"/); rail = substr($0, RSTART + 6, RLENGTH - 7)
      printf "  link tx to %-12s %-6s %12.1f MiB\n", peer, rail, $NF / 1048576 }
    /^railyard_collective_ops_total\{/ { ops += $NF }
    /^railyard_collective_latency_seconds_bucket\{/ && /op="allreduce"/ {
      match($0, /size_bucket="[^"]*"/); b = substr($0, RSTART + 13, RLENGTH - 14) + 0
      match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5)
      if (b > maxb) { maxb = b; n = 0 }
      if (b == maxb) { les[n] = le; cum[n] = $NF; n++ } }
    END {
      printf "  collectives completed: %d\n", ops
      if (n > 0) {
        total = cum[n - 1]
        for (i = 0; i < n; i++) if (cum[i] >= total / 2) { p50 = les[i]; break }
        printf "  allreduce %d B bucket: %d ops, p50 latency <= %s s\n", maxb, total, p50 }
    }'
done
echo

for pid in "${pids[@]}"; do kill -TERM "$pid"; done
for pid in "${pids[@]}"; do wait "$pid"; done
pids=()
echo "demo: daemon logs:"
# awk, not `grep | head`: head exits after 20 lines, and under pipefail the SIGPIPE that a grep
# still writing then gets made the whole demo exit 141 once the logs were long enough.
awk '!/comp=session/ && shown++ < 20 { print "  " $0 }' "$dir"/node*.log
