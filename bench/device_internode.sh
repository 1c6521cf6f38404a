#!/usr/bin/env bash
# Cross-node AllReduce on GPU memory: two railyardd on loopback (UCX tcp between them, as two
# nodes), both on device 0 of this machine, RPD ranks each (railyard-perf --device 0). A
# collective on device buffers across nodes is staged through host memory (docs/gpu.md); this
# compares, in interleaved launches:
#   host       the same collective on host buffers (no staging): the transport's own speed
#   pipelined  device buffers, copies in and out pipelined with the transfers (the default)
#   whole      device buffers, --staging_pipeline=false: the whole copy in before the collective
#              starts, the whole copy back after it ends
# and prints, per size, the median out-of-place time over the launches of each, and pipelined /
# whole. Needs a GPU (FAKE=1: fake device memory, --fake_gpus, to try the script without one;
# then the data check runs too, -c 1). Not a test: the values are not checked on a GPU
# (railyard-perf -c 0 there; tests/cuda checks device results).
#
#   bench/device_internode.sh [BUILD_DIR] [LAUNCHES] [RPD] [MAX_BYTES]
#       defaults: build-gpu, 3, 1, 128M (sizes 1M, 4M, 16M, ... up to MAX_BYTES)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${1:-build-gpu} launches=${2:-3} rpd=${3:-1} max=${4:-128M}
# shellcheck source=scripts/lib/device-bins.sh
. scripts/lib/device-bins.sh
if [ "${FAKE:-0}" = 1 ]; then
  # Fake devices are served by the test builds only (railyardd-testing, railyard-perf-testing).
  railyard_binaries "$build" railyardd-testing railyard-perf-testing || exit 1
  daemon_bin=$build/tests/support/railyardd-testing
  perf_bin=$build/tests/support/railyard-perf-testing
else
  railyard_binaries "$build" railyardd railyard-perf || exit 1
fi
out=$(mktemp -d /tmp/ry-devnode-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT

# launch MODE I: one railyard-perf run on fresh daemons; its table goes to $out/MODE.I.
launch() {
  local mode=$1 i=$2 flags=() dev=(--device 0 -c 0) n socks=()
  if [ "${FAKE:-0}" = 1 ]; then flags=(--fake_gpus=1) dev=(--device 0 --fake_device -c 1); fi
  case $mode in
    host) dev=(-c 1) ;;
    whole) flags+=(--staging_pipeline=false) ;;
  esac
  pids=()
  for n in 0 1; do
    echo "{\"node\": \"gnode$n\", \"rails\": [{\"name\": \"rail0\", \"device\": \"lo\"}]}" >"$out/d$n.json"
    rm -f "$out/d$n.sock"
    "$daemon_bin" --socket="$out/d$n.sock" --insecure_first_session_token --node_name="gnode$n" \
      --peer_listen=127.0.0.1:0 --peer_insecure --topology="$out/d$n.json" --log_level=warning \
      "${flags[@]}" >"$out/d$n.$mode.$i.log" 2>&1 &
    pids+=($!)
    socks+=("$out/d$n.sock")
  done
  for n in 0 1; do
    for _ in $(seq 100); do [ -S "$out/d$n.sock" ] && break; sleep 0.1; done
  done
  timeout 120 "$perf_bin" --op allreduce -b 1M -e "$max" -f 4 -n 10 -w 2 \
    --daemons "${socks[0]},${socks[1]}" --ranks-per-daemon "$rpd" "${dev[@]}" \
    >"$out/$mode.$i" 2>&1 ||
    { failed=$((failed + 1)); echo "railyard-perf failed ($mode, launch $i):"; tail -5 "$out/$mode.$i"; }
  cleanup
  pids=()
}

failed=0
echo "# 2 railyardd x $rpd rank(s) on loopback, AllReduce float32 sum, device 0: $(nvidia-smi \
  --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); $launches launches, interleaved"
for i in $(seq "$launches"); do
  for mode in host pipelined whole; do launch "$mode" "$i"; done
done
/usr/bin/env python3 - "$out" "$launches" <<'EOF' || failed=$((failed + 1))
import statistics, sys
out, launches = sys.argv[1], int(sys.argv[2])
modes = ("host", "pipelined", "whole")
times = {m: {} for m in modes}
wrong = 0
for m in modes:
    for i in range(1, launches + 1):
        try:
            lines = open(f"{out}/{m}.{i}").read().splitlines()
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) >= 9 and f[0].isdigit():
                times[m].setdefault(int(f[0]), []).append(float(f[5]))
                wrong += int(f[8]) if f[8].isdigit() else 0
print(f"{'bytes':>11} {'host us':>10} {'pipelined us':>13} {'whole us':>10} {'pipelined/whole':>16}")
for size in sorted(times["pipelined"]):
    med = {m: statistics.median(times[m][size]) if times[m].get(size) else float("nan")
           for m in modes}
    print(f"{size:>11} {med['host']:>10.1f} {med['pipelined']:>13.1f} {med['whole']:>10.1f} "
          f"{med['pipelined'] / med['whole']:>16.3f}")
print(f"# wrong values where checked (host buffers; all with FAKE=1): {wrong}")
sys.exit(1 if wrong else 0)
EOF
if [ "$failed" -gt 0 ]; then
  echo "device_internode: $failed launch(es) failed"
  exit 1
fi
