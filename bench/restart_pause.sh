#!/usr/bin/env bash
# The pause a daemon restart causes a running job (issue 57): one railyardd, 2 ranks of
# railyard-test-rank doing out-of-place float32 AllReduces back to back (latency mode: each
# operation's start and latency traced), and 3 s in either
#   handover  railyardd --takeover with the same flags (the old one hands over and exits), or
#   crash     SIGKILL, and a fresh railyardd started at once on the same socket.
# Per launch: the operations' p50/p99 before the event (baseline) and in the 2 s around it, the
# longest operation (the pause: the one that spans the restart), failures and wrong results.
# Sizes 8 B and 16 MiB; launches interleave (handover, crash) per size and repetition; prints the
# medians over the repetitions. Target: pause <= 1 s per handover.
#   bench/restart_pause.sh [REPS=3]
# Environment: RAILYARD_BUILD_DIR (build).
# Not a test: numbers depend on the machine and its load.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
build=${RAILYARD_BUILD_DIR:-build}
rank="$build/tests/integration/railyard-test-rank"
if [ ! -x "$build/daemon/railyardd" ] || [ ! -x "$rank" ]; then
  echo "restart_pause: no railyardd / railyard-test-rank under $build (scripts/build.sh)" >&2
  exit 2
fi
. scripts/lib/daemons.sh
dir=$(mktemp -d /tmp/railyard-restart.XXXXXX)
pids=()
ranks=()
cleanup() {
  for p in "${ranks[@]}"; do kill "$p" 2>/dev/null || true; done
  stop_daemons
  rm -rf "$dir"
}
trap cleanup EXIT

start_daemon() {  # NAME [FLAGS...] -> appends the pid to pids
  local name=$1
  shift
  "$build/daemon/railyardd" --socket="$dir/r.sock" --admin_socket="$dir/a.sock" \
    --state_dir="$dir" --insecure_first_session_token "$@" >"$dir/$name.log" 2>&1 &
  pids+=($!)
  local _
  for _ in $(seq 400); do grep -q "msg=serving" "$dir/$name.log" && return 0; sleep 0.025; done
  cat "$dir/$name.log" >&2
  echo "restart_pause: railyardd $name did not start" >&2
  exit 1
}

launch() {  # KIND SIZE -> prints one row: kind size base_p50 base_p99 near_p50 near_p99 pause failed ops
  local kind=$1 size=$2 r
  rm -f "$dir"/r.sock* "$dir"/t*.txt
  start_daemon d0
  local comm
  comm="ry1-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')@local:$(sed -n 's/.*msg=serving .*node=\([^ ]*\).*/\1/p' "$dir/d0.log")"
  ranks=()
  for r in 0 1; do
    "$rank" --mode=latency --socket="$dir/r.sock" --comm_id="$comm" --rank=$r --nranks=2 \
      --bytes="$size" --duration_s=8 --trace="$dir/t$r.txt" --job=pause >"$dir/rank$r.out" 2>&1 &
    ranks+=($!)
  done
  sleep 3
  local event old=${pids[-1]}
  event=$(date +%s%6N)
  if [ "$kind" = handover ]; then
    start_daemon d1 --takeover
    wait "$old" 2>/dev/null || true
  else
    kill -KILL "$old"
    wait "$old" 2>/dev/null || true
    start_daemon d1
  fi
  for p in "${ranks[@]}"; do wait "$p" || true; done
  ranks=()
  stop_daemons
  grep -h LATENCY "$dir"/rank*.out >&2 || true
  /usr/bin/python3 - "$kind" "$size" "$event" "$dir/t0.txt" "$dir/t1.txt" <<'EOF'
import sys
kind, size, event = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ops = []
for path in sys.argv[4:]:
    for line in open(path):
        t, lat, code = map(int, line.split())
        ops.append((t, lat, code))
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")
base = [lat for t, lat, c in ops if t < event - 500_000]
near = [lat for t, lat, c in ops if event - 1_000_000 <= t + lat and t <= event + 1_000_000]
pause = max((lat for t, lat, c in ops if t <= event + 2_000_000 and t + lat >= event), default=0)
failed = sum(1 for t, lat, c in ops if c != 0)
codes = sorted({c for t, lat, c in ops if c != 0})
if codes:
    print(f"failed codes {codes} at", [round((t - event) / 1e6, 3) for t, lat, c in ops if c != 0],
          file=sys.stderr)
print(f"{kind} {size} {pct(base, .5)} {pct(base, .99)} {pct(near, .5)} {pct(near, .99)} {pause} {failed} {len(ops)}")
EOF
}

echo "# one railyardd x 2 ranks, out-of-place float32 AllReduce; latencies in us"
echo "# kind      size      base_p50 base_p99 near_p50 near_p99 pause   failed ops"
for ((r = 1; r <= reps; r++)); do
  for size in 8 16777216; do
    for kind in handover crash; do
      launch "$kind" "$size" >>"$dir/rows"
      tail -n 1 "$dir/rows" | awk '{ printf "  %-9s %-9s %-8s %-8s %-8s %-8s %-7s %-6s %s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
    done
  done
done
/usr/bin/python3 -c '
import statistics, sys
by = {}
for line in sys.stdin:
    f = line.split()
    by.setdefault((f[0], int(f[1])), []).append([float(x) for x in f[2:]])
print("# medians over the repetitions")
for (kind, size), v in sorted(by.items()):
    med = [statistics.median(x[i] for x in v) for i in range(7)]
    print(f"{kind:9s} {size:>9d} B: base p50 {med[0]:.0f} us p99 {med[1]:.0f} us; around it p50 "
          f"{med[2]:.0f} us p99 {med[3]:.0f} us; pause {med[4] / 1000:.1f} ms; failed {med[5]:.0f} "
          f"of {med[6]:.0f}")
' <"$dir/rows"
