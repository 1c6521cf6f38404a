#!/usr/bin/env bash
# Compressed AllReduce on an emulated fabric where bandwidth is scarce (issue 17): railyard-perf
# AllReduce float32 sum across the daemons of scripts/fabric.sh (tbf-shaped veths), with
# RAILYARD_COMPRESSION = none, fp16, int8, topk:0.01 and auto, launches interleaved, sizes
# 4 KiB to 64 MiB (x4). Prints per size the median time (ms) of each, each codec's speed-up over
# none, and per codec the break-even size (the smallest from which it stays faster than none).
#   bench/compression.sh [REPS=3]
# Environment: RAILYARD_BUILD_DIR (default build); COMP_NODES (default 2), COMP_RAILS (1),
# COMP_RATE (1gbit per rail), FABRIC_PACE (scripts/fabric.sh --pace; default its 88% of the rate),
# COMP_DTYPE (railyard-perf -d: float by default, half or bfloat16 for 16-bit gradients),
# COMP_CODECS (default "none fp16 int8 topk:0.01 auto"; the first is the baseline of the ratios),
# COMP_SWEEPS (default "4K 1M 4 50 5;4M 64M 4 3 1": sweeps of min max factor iters warmup).
# railyard-perf runs -c 0: a lossy codec's results are checked by the tests
# (tests/integration/compression_test.cc), not here. Each launch is two sweeps: 4K-1M -n 50 -w 5
# and 4M-64M -n 3 -w 1. Not a test: numbers depend on the machine and its load.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/netns.sh
. scripts/lib/netns.sh
reps=${1:-3}
build=${RAILYARD_BUILD_DIR:-build}
nodes=${COMP_NODES:-2} rails=${COMP_RAILS:-1} rate=${COMP_RATE:-1gbit} dtype=${COMP_DTYPE:-float}
read -r -a codecs <<<"${COMP_CODECS:-none fp16 int8 topk:0.01 auto}"
if why=$(netns_unavailable); then
  echo "compression: cannot run: $why" >&2
  exit 2
fi
for b in daemon/railyardd tools/railyard-perf; do
  [ -x "$build/$b" ] || { echo "compression: no $build/$b (scripts/build.sh)" >&2; exit 2; }
done
out=$(mktemp -d /tmp/railyard-compression-bench.XXXXXX)
chmod 755 "$out"
fdir=$out/fabric
prefix=rz$(($$ % 100000))-
cleanup() {
  scripts/fabric.sh down --dir "$fdir" >/dev/null 2>&1 || true
  rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

scripts/fabric.sh up --nodes "$nodes" --rails "$rails" --ranks-per-node 1 --rate "$rate" \
  ${FABRIC_PACE:+--pace "$FABRIC_PACE"} --dir "$fdir" --prefix "$prefix" >"$out/nodes.txt"
socks=$(awk '{print $6}' "$out/nodes.txt" | paste -sd,)
# auto decides on the calibrated model (docs/cost-model.md): calibrate this fabric first, as an
# operator would; the daemons' built-in defaults assume 1 GB/s per rail.
"$build/tools/railctl" calibrate --daemons "$socks" --ranks-per-daemon 1 --algo ring -b 64K -e 16M \
  -f 4 -n 5 -w 1 --perf "$build/tools/railyard-perf" >"$out/calibrate.txt" 2>&1 ||
  { cat "$out/calibrate.txt" >&2; echo "compression: railctl calibrate failed" >&2; exit 1; }
IFS=';' read -r -a sweeps <<<"${COMP_SWEEPS:-4K 1M 4 50 5;4M 64M 4 3 1}"  # min max factor iters warmup

# What node 0 completed, by algorithm and size bucket (railyard_collective_ops_total), to record
# which path auto took: "compressed" or an exact algorithm.
ns0=$(awk 'NR == 1 { print $4 }' "$out/nodes.txt") metrics0=$(awk 'NR == 1 { print $10 }' "$out/nodes.txt")
ops_by_algo() {
  ip netns exec "$ns0" curl -s "http://$metrics0/metrics" |
    awk -F'[{}]' '/^railyard_collective_ops_total\{/ && /op="allreduce"/ {
      match($2, /algorithm="[^"]*"/); a = substr($2, RSTART + 11, RLENGTH - 12)
      match($2, /size_bucket="[^"]*"/); b = substr($2, RSTART + 13, RLENGTH - 14)
      split($3, v, " "); n[b " " a] += v[1] } END { for (k in n) print k, n[k] }'
}
: >"$out/auto-paths.txt"

run() {  # codec file
  local f=$2 sw
  : >"$f"
  for sw in "${sweeps[@]}"; do
    read -r lo hi fac it wu <<<"$sw"
    RAILYARD_COMPRESSION=$1 timeout 600 "$build/tools/railyard-perf" --op allreduce -d "$dtype" \
      -b "$lo" -e "$hi" -f "$fac" -n "$it" -w "$wu" -c 0 --daemons "$socks" \
      --ranks-per-daemon 1 >>"$f" 2>"$out/perf.err" ||
      { cat "$out/perf.err" >&2; tail -5 "$fdir"/n*.log >&2; echo "compression: railyard-perf failed ($1)" >&2; exit 1; }
  done
}

echo "# railyard compressed AllReduce on scripts/fabric.sh: $nodes nodes x $rails rail(s) of $rate (tbf), 1 rank per node; $dtype sum, out-of-place; medians of $reps interleaved launches"
echo "# host $(hostname), $(nproc) CPUs, $(uname -r); railyard $(git describe --always --dirty 2>/dev/null) ($build)"
echo "# rail pace: $(grep -o '"pace": "[^"]*"' "$fdir/n0.json" | head -1 || echo none)"
echo "# calibration: $(grep '^fit:' "$out/calibrate.txt")"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
for ((r = 1; r <= reps; r++)); do
  for c in "${codecs[@]}"; do
    [ "$c" != auto ] || ops_by_algo >"$out/before.txt"
    run "$c" "$out/$(tr -c 'a-z0-9\n' _ <<<"$c")-$r.txt"
    [ "$c" != auto ] || ops_by_algo | awk 'NR == FNR { b[$1 " " $2] = $3; next }
      { d = $3 - b[$1 " " $2]; if (d > 0) print $1, $2, d }' "$out/before.txt" - >>"$out/auto-paths.txt"
  done
  echo "# launch $r done ($(($(date +%s) - start)) s)"
done

ms() {  # file size: the out-of-place time (railyard-perf's column 6, us) of SIZE, in ms
  awk -v s="$2" '$1 == s { printf "%.3f\n", $6 / 1e3; exit }' "$1"
}
echo
header=$(printf '%9s' size)
for c in "${codecs[@]}"; do header+=$(printf ' %11s' "$c"); done
for c in "${codecs[@]:1}"; do header+=$(printf ' %11s' "x:$c"); done
echo "$header"
declare -A even
# The sizes measured: those of the first codec's first launch.
first="$out/$(tr -c 'a-z0-9\n' _ <<<"${codecs[0]}")-1.txt"
for s in $(awk '$1 ~ /^[0-9]+$/ { print $1 }' "$first" | sort -un); do
  cells=()
  for c in "${codecs[@]}"; do
    vals=()
    for ((r = 1; r <= reps; r++)); do vals+=("$(ms "$out/$(tr -c 'a-z0-9\n' _ <<<"$c")-$r.txt" "$s")"); done
    cells+=("$(median "${vals[@]}")")
  done
  line=$(printf '%9s' "$(awk -v s="$s" 'BEGIN { if (s >= 1048576) printf "%dM", s / 1048576; else printf "%dK", s / 1024 }')")
  for v in "${cells[@]}"; do line+=$(printf ' %11s' "$v"); done
  for ((i = 1; i < ${#codecs[@]}; i++)); do
    x=$(awk -v a="${cells[0]}" -v b="${cells[$i]}" 'BEGIN { printf "%.2f", a / b }')
    line+=$(printf ' %11s' "$x")
    c=${codecs[$i]}
    if awk -v x="$x" 'BEGIN { exit !(x > 1) }'; then
      [ -n "${even[$c]:-}" ] || even[$c]=$s
    else
      even[$c]=""
    fi
  done
  echo "$line"
done
echo
for c in "${codecs[@]:1}"; do
  if [ -n "${even[$c]:-}" ]; then
    echo "break-even $c: faster than ${codecs[0]} from $((${even[$c]} / 1024)) KiB up"
  else
    echo "break-even $c: not faster than ${codecs[0]} at the largest size"
  fi
done
if [ -s "$out/auto-paths.txt" ]; then
  echo "auto ran, on node 0 (size bucket: the power of 4 at or below the size; algorithm: operations):"
  awk '{ n[$1 " " $2] += $3 } END { for (k in n) print k, n[k] }' "$out/auto-paths.txt" |
    sort -n | awk '{ printf "  %s B: %s %d\n", $1, $2, $3 }'
fi
echo "x:CODEC = time(${codecs[0]}) / time(CODEC); auto: the tuner compresses where its model says it pays."
echo "# total $(($(date +%s) - start)) s; load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
