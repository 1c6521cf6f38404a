#!/usr/bin/env bash
# AllReduce busbw per algorithm on K virtual nodes (railyardd on loopback, 2 rails on lo each)
# x G ranks per node, same sizes, same run: ring vs tree vs rhd vs hier (RAILYARD_ALGO).
#   bench/compare_algorithms.sh [NODES=4] [RANKS_PER_NODE=2] [MAXBYTES=64M] [FACTOR=4]
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${1:-4}
g=${2:-2}
max=${3:-64M}
factor=${4:-4}
build=${RAILYARD_BUILD_DIR:-build}
[ -x "$build/tools/railyard-perf" ] || scripts/build.sh
out=$(mktemp -d /tmp/railyard-algos.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$out"
}
trap cleanup EXIT

# The peer plane as deployed: mutual TLS, one test CA, a certificate per virtual node.
certs=()
for ((n = 0; n < nodes; n++)); do certs+=("vnode$n"); done
scripts/peer-certs.sh "$out/certs" "${certs[@]}"
socks=()
for ((n = 0; n < nodes; n++)); do
  echo "{\"node\": \"vnode$n\", \"rails\": [{\"device\": \"lo\"}, {\"device\": \"lo\"}]}" >"$out/n$n.json"
  "$build/daemon/railyardd" --socket="$out/n$n.sock" --insecure_first_session_token --peer_listen=127.0.0.1:0 \
    --peer_tls_cert="$out/certs/vnode$n.pem" --peer_tls_key="$out/certs/vnode$n-key.pem" \
    --peer_tls_ca="$out/certs/ca.pem" --topology="$out/n$n.json" >"$out/n$n.log" 2>&1 &
  pids+=($!)
  socks+=("$out/n$n.sock")
done
for s in "${socks[@]}"; do for _ in $(seq 100); do [ -S "$s" ] && break; sleep 0.05; done; done
daemons=$(IFS=,; echo "${socks[*]}")

algos=(ring tree rhd hier)
for a in "${algos[@]}"; do
  echo "## RAILYARD_ALGO=$a ($nodes nodes x $g ranks, 2 rails each)"
  RAILYARD_ALGO=$a "$build/tools/railyard-perf" --op allreduce -b 8 -e "$max" -f "$factor" \
    -n 10 -w 3 -c 1 --daemons "$daemons" --ranks-per-daemon "$g" | tee "$out/$a.txt"
done
echo
echo "## out-of-place busbw (GB/s) by algorithm; time (us) in brackets"
/usr/bin/python3 - "$out" "${algos[@]}" <<'PY'
import os, sys
d, algos = sys.argv[1], sys.argv[2:]
rows = {}
for a in algos:
    for line in open(os.path.join(d, a + ".txt")):
        f = line.split()
        if f and not line.startswith("#"):
            rows.setdefault(int(f[0]), {})[a] = (float(f[5]), float(f[7]))
print(f"{'size':>10} " + " ".join(f"{a:>20}" for a in algos))
for size in sorted(rows):
    cells = [f"{rows[size][a][1]:8.3f} ({rows[size][a][0]:8.1f})" if a in rows[size] else " " * 20
             for a in algos]
    print(f"{size:>10} " + " ".join(cells))
PY
