#!/usr/bin/env bash
# Intra-node AllReduce of two railyardd builds on one daemon (e.g. before/after a change), same
# run, launches interleaved: for each rank count and trial, build A then build B, each with a
# fresh daemon; prints the median over trials of the out-of-place time and busbw per size and
# the ratio B/A of busbw.
#   bench/compare_builds_intra.sh DIR_A DIR_B [RANKS="2 4"] [TRIALS=3] [MAX=64M] [FACTOR=4]
# DIR_X holds railyardd and railyard-perf (each build's own client).
set -euo pipefail
a=$1
b=$2
ranks=${3:-"2 4"}
trials=${4:-3}
max=${5:-64M}
factor=${6:-4}
out=$(mktemp -d /tmp/railyard-cmp.XXXXXX)
pid=""
cleanup() {
  [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$out"
}
trap cleanup EXIT
# Builds from before the flag existed trust the first session of a job anyway.
insecure_flag() {
  local help
  help=$("$1/railyardd" --helpfull 2>&1 || true)
  case "$help" in *insecure_first_session_token*) echo --insecure_first_session_token ;; esac
}
run() {  # build_dir ranks trial
  local dir=$1 g=$2 t=$3 sock="$out/s.sock"
  rm -f "$sock"
  "$dir/railyardd" --socket="$sock" $(insecure_flag "$dir") >"$out/daemon.log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
  "$dir/railyard-perf" --op allreduce -b 8 -e "$max" -f "$factor" -n 20 -w 5 -c 0 --daemons "$sock" \
    --ranks-per-daemon "$g" >"$out/$(basename "$dir")-$g-$t.txt"
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
}
for g in $ranks; do
  for ((t = 0; t < trials; t++)); do
    run "$a" "$g" "$t"
    run "$b" "$g" "$t"
  done
done
/usr/bin/python3 - "$out" "$(basename "$a")" "$(basename "$b")" "$ranks" "$trials" <<'PY'
import statistics, sys
out, a, b, ranks, trials = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), int(sys.argv[5])
def parse(path):
    rows = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 8 and f[0].isdigit():
            rows[int(f[0])] = (float(f[5]), float(f[7]))  # out-of-place time (us), busbw
    return rows
for g in ranks:
    runs = {k: [parse(f"{out}/{k}-{g}-{t}.txt") for t in range(trials)] for k in (a, b)}
    print(f"## {g} ranks, one daemon: median of {trials} interleaved launches (out-of-place)")
    print(f"| bytes | {a} us | {b} us | {a} busbw GB/s | {b} busbw GB/s | busbw {b}/{a} |")
    print("|---|---|---|---|---|---|")
    for size in sorted(runs[a][0]):
        med = {k: (statistics.median(r[size][0] for r in runs[k]),
                   statistics.median(r[size][1] for r in runs[k])) for k in (a, b)}
        ratio = med[b][1] / med[a][1] if med[a][1] > 0 else float("nan")
        print(f"| {size} | {med[a][0]:.1f} | {med[b][0]:.1f} | {med[a][1]:.2f} | {med[b][1]:.2f} "
              f"| {ratio:.2f} |")
PY
