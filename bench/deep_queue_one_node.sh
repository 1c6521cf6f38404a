#!/usr/bin/env bash
# Deep queues on one node (issue 56, item 2): one railyardd, 2 ranks of railyard-perf,
# AllReduce float32 sum, out-of-place, at 4 KiB and 1 MiB: busbw with -n 10 (shallow) against
# -n 1000 (every operation submitted at once, up to the rings' 1023 in flight). A fresh daemon
# per launch; launches interleave (shallow, deep) per size and repetition; prints each launch
# and the medians' deep/shallow ratio (target >= 0.90). bench/deep_queue.sh does the same across
# nodes, on an emulated fabric.
#   bench/deep_queue_one_node.sh [REPS=3]
# Environment: RAILYARD_BUILD_DIR (build).
# Not a test: numbers depend on the machine and its load.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
build=${RAILYARD_BUILD_DIR:-build}
if [ ! -x "$build/daemon/railyardd" ] || [ ! -x "$build/tools/railyard-perf" ]; then
  echo "deep_queue_one_node: no railyardd / railyard-perf under $build (scripts/build.sh)" >&2
  exit 2
fi
dir=$(mktemp -d /tmp/railyard-deep1.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
busbw() {  # SIZE ITERS -> the tool's out-of-place busbw (GB/s)
  rm -f "$dir/s.sock"
  "$build/daemon/railyardd" --socket="$dir/s.sock" --insecure_first_session_token >"$dir/d.log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
  [ -S "$dir/s.sock" ] || { cat "$dir/d.log" >&2; echo "deep_queue_one_node: railyardd did not start" >&2; exit 1; }
  timeout 300 "$build/tools/railyard-perf" --op allreduce -b "$1" -e "$1" -n "$2" -w 1 -c 0 \
    --daemons "$dir/s.sock" --ranks-per-daemon 2 | awk '$1 ~ /^[0-9]+$/ { print $8; exit }'
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
}
echo "# one railyardd x 2 ranks, AllReduce float32 sum; busbw GB/s, shallow = -n 10, deep = -n 1000"
echo "rep  size      shallow  deep"
rows=()
for ((r = 1; r <= reps; r++)); do
  for size in 4096 1048576; do
    s=$(busbw "$size" 10)
    d=$(busbw "$size" 1000)
    printf '%-4s %-9s %-8s %s\n' "$r" "$size" "$s" "$d"
    rows+=("$size $s $d")
  done
done
printf '%s\n' "${rows[@]}" | /usr/bin/python3 -c '
import statistics, sys
by = {}
for line in sys.stdin:
    size, s, d = line.split()
    by.setdefault(int(size), []).append((float(s), float(d)))
for size, v in sorted(by.items()):
    s = statistics.median(x[0] for x in v)
    d = statistics.median(x[1] for x in v)
    print(f"size {size}: medians shallow {s:.2f} GB/s, deep {d:.2f} GB/s, deep/shallow {d / s:.2f} (target >= 0.90)")
'
