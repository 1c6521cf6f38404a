#!/usr/bin/env bash
# What the data plane's frame costs: AllReduce float32 between two railyardd on loopback (one
# rank each, one rail on lo), --integrity=none vs --integrity=crc32c, and, given a second build
# dir, that build (e.g. main before the frame existed) with its defaults; "copy" is this build with
# --integrity=none and --test_frame_split_min_bytes=0 (every payload from 64 KiB copied next to
# its trailer and sent as one message, the design before split frames). Launches interleaved:
# for each trial every configuration gets fresh daemons in turn. Prints every sample and the
# median per size of out-of-place busbw, and the ratios.
#   bench/integrity_cost.sh [TRIALS=3] [OTHER_BUILD_DIR]
# OTHER_INTEGRITY (environment): --integrity of the other build's daemons (default: not passed).
# COPY=0 (environment): leave out the "copy" configuration.
# A build dir holds daemon/railyardd and tools/railyard-perf (or railyardd and railyard-perf).
# Sizes: 8 B (latency; -n 200) and 64, 256 KiB, 1, 4, 16, 64 MiB (-n 10 -w 3). Inter-node messages
# are chunks of at most --chunk_bytes (default 256 KiB), so the large sizes differ in count.
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-3}
other=${2:-}
build=${RAILYARD_BUILD_DIR:-build}
out=$(mktemp -d /tmp/railyard-integrity.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$out"
}
trap cleanup EXIT
bin() {  # build_dir name
  if [ -x "$1/daemon/$2" ]; then echo "$1/daemon/$2"; elif [ -x "$1/tools/$2" ]; then
    echo "$1/tools/$2"; else echo "$1/$2"; fi
}
run() {  # label build_dir integrity trial [daemon flags...]
  local label=$1 dir=$2 integrity=$3 t=$4 socks=() flags=("${@:5}")
  [ -n "$integrity" ] && flags+=(--integrity="$integrity")
  # Plaintext peer plane (what is measured is the data plane): builds with mutual TLS must be told.
  local help
  help=$("$(bin "$dir" railyardd)" --helpfull 2>&1 || true)
  if [[ $help == *--peer_insecure* ]]; then flags+=(--peer_insecure); fi
  pids=()
  for n in 0 1; do
    echo "{\"node\": \"vnode$n\", \"rails\": [{\"name\": \"rail0\", \"device\": \"lo\"}]}" >"$out/n$n.json"
    rm -f "$out/n$n.sock"
    "$(bin "$dir" railyardd)" --socket="$out/n$n.sock" --insecure_first_session_token \
      --peer_listen=127.0.0.1:0 --topology="$out/n$n.json" "${flags[@]}" >"$out/n$n.log" 2>&1 &
    pids+=($!)
    socks+=("$out/n$n.sock")
  done
  for s in "${socks[@]}"; do for _ in $(seq 200); do [ -S "$s" ] && break; sleep 0.05; done; done
  local daemons
  daemons=$(IFS=,; echo "${socks[*]}")
  local perf
  perf=$(bin "$dir" railyard-perf)
  "$perf" --op allreduce -b 8 -e 8 -n 200 -w 20 -c 0 --daemons "$daemons" \
    --ranks-per-daemon 1 >"$out/$label-$t-small.txt"
  "$perf" --op allreduce -b 64K -e 64M -f 4 -n 10 -w 3 -c 0 --daemons "$daemons" \
    --ranks-per-daemon 1 >"$out/$label-$t-large.txt"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
labels=(none crc32c)
copy=${COPY:-1}
[ "$copy" = 1 ] && labels+=(copy)
[ -n "$other" ] && labels+=(other)
for ((t = 0; t < trials; t++)); do
  run none "$build" none "$t"
  run crc32c "$build" crc32c "$t"
  [ "$copy" = 1 ] && run copy "$build" none "$t" --test_frame_split_min_bytes=0
  [ -n "$other" ] && run other "$other" "${OTHER_INTEGRITY:-}" "$t"
done
/usr/bin/python3 - "$out" "$trials" "${labels[@]}" <<'PY'
import statistics, sys
out, trials, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def parse(label, t):
    rows = {}
    for part in ("small", "large"):
        for line in open(f"{out}/{label}-{t}-{part}.txt"):
            f = line.split()
            if len(f) >= 8 and f[0].isdigit():
                rows[int(f[0])] = (float(f[5]), float(f[7]))  # out-of-place time (us), busbw
    return rows
runs = {l: [parse(l, t) for t in range(trials)] for l in labels}
sizes = sorted(runs[labels[0]][0])
print(f"## AllReduce float32, 2 daemons x 1 rank on loopback, out-of-place; {trials} interleaved launches")
print("| bytes | " + " | ".join(f"{l} busbw GB/s (samples)" for l in labels) + " | "
      + " | ".join(f"{l} us (median)" for l in labels) + " | busbw crc32c/none |"
      + (" busbw none/copy |" if "copy" in labels else "")
      + (" busbw none/other |" if "other" in labels else ""))
print("|---" * (1 + 2 * len(labels) + 1 + ("copy" in labels) + ("other" in labels)) + "|")
for size in sizes:
    med_bw = {l: statistics.median(r[size][1] for r in runs[l]) for l in labels}
    med_us = {l: statistics.median(r[size][0] for r in runs[l]) for l in labels}
    cells = [f"{med_bw[l]:.3f} ({', '.join(f'{r[size][1]:.3f}' for r in runs[l])})" for l in labels]
    us = [f"{med_us[l]:.1f}" for l in labels]
    # busbw ratio from the times (busbw is printed with 2 decimals only): b's time / a's.
    ratio = lambda a, b: f"{med_us[b] / med_us[a]:.3f}"
    row = f"| {size} | " + " | ".join(cells) + " | " + " | ".join(us) + f" | {ratio('crc32c', 'none')} |"
    if "copy" in labels:
        row += f" {ratio('none', 'copy')} |"
    if "other" in labels:
        row += f" {ratio('none', 'other')} |"
    print(row)
PY
