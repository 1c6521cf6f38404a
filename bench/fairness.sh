#!/usr/bin/env bash
# Fair sharing of a paced fabric between jobs (issue 14). Brings up scripts/fabric.sh with K=4
# nodes, one 1 Gbit/s rail each (its own directory and namespace prefix, torn down at exit) and
# runs, per repetition:
#   solo       job S alone: 16 MiB AllReduces, 4 nodes x 1 rank;
#   equal      jobs A and B at once, weights 1:1, 16 MiB AllReduces on the same rail;
#   weighted   the same at weights 3:1 (railctl jobs set-weight on every daemon);
#   latency    job L (64 KiB AllReduces, one at a time, each timed: --latency_file) alone, then
#              beside bulk job B (16 MiB) at equal weights; twice: back to back (L then wants
#              more than its half of the rail, and queues behind it like a bulk job), and one
#              every FAIR_LAT_INTERVAL_US (default 5000: 64 KiB moves 96 KiB per node per op,
#              ~20 MB/s, well inside its share: a latency-sensitive job's duty cycle).
# Throughput is what each job sent on the rails over a window of WINDOW seconds in which both
# run (Admin.ListJobs per daemon, summed: bench/job_bytes.py), not the perf tool's averages,
# which include the time one job ran alone. Printed per repetition and as medians: Jain's index
# (equal), A/B ratio (weighted), aggregate / solo (equal), L's p99 beside B / alone (both ways).
#   bench/fairness.sh [REPS=3]
# Environment: RAILYARD_BUILD_DIR (default build); FAIR_RATE (1gbit); FAIR_PACE (fabric.sh
# --pace; default its 88% of the rate); FAIR_WINDOW (20 s); FAIR_LAT_INTERVAL_US (5000);
# RAILYARD_* daemon flags reach the daemons (e.g. RAILYARD_RAIL_IN_FLIGHT_BYTES).
# Not a test: on 2 shared cores the numbers move with load.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/netns.sh
. scripts/lib/netns.sh
reps=${1:-3}
build=${RAILYARD_BUILD_DIR:-build}
rate=${FAIR_RATE:-1gbit}
window=${FAIR_WINDOW:-20}
lat_interval=${FAIR_LAT_INTERVAL_US:-5000}
dir=/tmp/railyard-fairness
prefix=ryq-
if why=$(netns_unavailable); then
  echo "fairness: cannot run: $why" >&2
  exit 2
fi
pace_args=()
[ -n "${FAIR_PACE:-}" ] && pace_args=(--pace "$FAIR_PACE")
cleanup() { scripts/fabric.sh down --dir "$dir" >/dev/null 2>&1 || true; }
trap cleanup EXIT
scripts/fabric.sh up --nodes 4 --rails 1 --rate "$rate" --dir "$dir" --prefix "$prefix" \
  "${pace_args[@]}" >/dev/null
socks=$(ls "$dir"/n*.sock | paste -sd,)
ctl="$build/tools/railctl"
perf="$build/tools/railyard-perf"

snapshot() { # JOB BYTES lines, summed over the daemons
  for s in "$dir"/n*.sock; do "$ctl" jobs --json --socket "$s"; done | /usr/bin/python3 bench/job_bytes.py
}
bytes_of() { awk -v j="$1" '$1 == j { print $2 }' <<<"$2"; }
set_weight() { for s in "$dir"/n*.sock; do "$ctl" jobs set-weight "$1" "$2" --socket "$s" >/dev/null; done; }
run_perf() { # JOB SIZE ITERS [extra perf flags]: in the background; sets $!
  local job=$1 size=$2 iters=$3
  shift 3
  "$perf" --op allreduce -b "$size" -e "$size" -n "$iters" -w 1 -c 0 --daemons "$socks" \
    --job "$job" --deadline_s 600 "$@" >"$dir/perf-$job.log" 2>&1 &
}
# Bytes per second each of the named jobs sent over [3 s, 3 s + window] while its runs go on.
window_rates() {
  sleep 3
  local s0 s1 t0 t1
  s0=$(snapshot)
  t0=$(date +%s.%N)
  sleep "$window"
  s1=$(snapshot)
  t1=$(date +%s.%N)
  for job in "$@"; do
    awk -v a="$(bytes_of "$job" "$s0")" -v b="$(bytes_of "$job" "$s1")" -v t0="$t0" -v t1="$t1" \
      'BEGIN { printf "%.6g ", (b - a) / (t1 - t0) }'
  done
  echo
}
p99_file() { awk '{ print $2 }' "$1" | sort -g | awk '{ v[NR] = $1 } END { i = int(NR * 0.99 + 0.5); if (i < 1) i = 1; printf "%.6g\n", v[i] }'; }

# One 16 MiB op alone, to size the runs so that they outlast the window.
"$perf" --op allreduce -b 16M -e 16M -n 3 -w 1 -c 1 --daemons "$socks" --job probe >"$dir/probe.log" 2>&1
op_s=$(awk '$1 == 16777216 { print $6 / 1e6; exit }' "$dir/probe.log")
[ -n "$op_s" ] || { echo "fairness: the probe run failed:"; cat "$dir/probe.log"; exit 1; }
span=$((window + 8))
iters_for() { awk -v s="$span" -v t="$op_s" -v share="$1" 'BEGIN { printf "%d\n", s * share / t * 1.3 + 2 }'; }

jains=() ratios=() aggs=() lats=() duty=()
printf '%-4s %-10s %-10s %-10s %-8s %-10s %-10s %-8s %-9s %-9s %-17s %-9s %-7s\n' rep solo_MB/s A_MB/s B_MB/s jain A3_MB/s B1_MB/s ratio agg/solo p99_solo p99_bulk duty_p99_solo duty_p99_bulk
for rep in $(seq "$reps"); do
  set_weight A 1
  set_weight B 1
  run_perf S 16M "$(iters_for 1)"
  ps=$!
  read -r solo < <(window_rates S)
  wait "$ps"

  run_perf A 16M "$(iters_for 0.5)"
  pa=$!
  run_perf B 16M "$(iters_for 0.5)"
  pb=$!
  read -r xa xb < <(window_rates A B)
  wait "$pa" "$pb"

  set_weight A 3
  run_perf A 16M "$(iters_for 0.75)"
  pa=$!
  run_perf B 16M "$(iters_for 0.25)"
  pb=$!
  read -r wa wb < <(window_rates A B)
  wait "$pa" "$pb"
  set_weight A 1

  rm -f "$dir"/lat-*
  run_perf L 64K 1000 --latency_file "$dir/lat-solo"
  wait $!
  run_perf L 64K 1000 --latency_file "$dir/lat-duty-solo" --interval_us "$lat_interval"
  wait $!
  run_perf B 16M "$(iters_for 1)"
  pb=$!
  sleep 3
  run_perf L 64K 1000 --latency_file "$dir/lat-bulk"
  wait $!
  run_perf L 64K 1000 --latency_file "$dir/lat-duty-bulk" --interval_us "$lat_interval"
  wait $!
  kill -0 "$pb" 2>/dev/null || echo "fairness: warning: bulk job B ended before the latency runs did" >&2
  wait "$pb"
  l_solo=$(p99_file "$dir/lat-solo")
  l_bulk=$(p99_file "$dir/lat-bulk")
  d_solo=$(p99_file "$dir/lat-duty-solo")
  d_bulk=$(p99_file "$dir/lat-duty-bulk")

  j=$(awk -v a="$xa" -v b="$xb" 'BEGIN { printf "%.4f", (a + b) ^ 2 / (2 * (a * a + b * b)) }')
  r=$(awk -v a="$wa" -v b="$wb" 'BEGIN { printf "%.3f", a / b }')
  g=$(awk -v a="$xa" -v b="$xb" -v s="$solo" 'BEGIN { printf "%.3f", (a + b) / s }')
  lr=$(awk -v a="$l_bulk" -v b="$l_solo" 'BEGIN { printf "%.2f", a / b }')
  dr=$(awk -v a="$d_bulk" -v b="$d_solo" 'BEGIN { printf "%.2f", a / b }')
  jains+=("$j") ratios+=("$r") aggs+=("$g") lats+=("$lr") duty+=("$dr")
  printf '%-4s %-10.1f %-10.1f %-10.1f %-8s %-10.1f %-10.1f %-8s %-9s %-9.4g %-7.4g (x%-6s) %-13.4g %-7.4g (x%s)\n' "$rep" \
    "$(awk -v v="$solo" 'BEGIN{print v/1e6}')" "$(awk -v v="$xa" 'BEGIN{print v/1e6}')" \
    "$(awk -v v="$xb" 'BEGIN{print v/1e6}')" "$j" "$(awk -v v="$wa" 'BEGIN{print v/1e6}')" \
    "$(awk -v v="$wb" 'BEGIN{print v/1e6}')" "$r" "$g" "$l_solo" "$l_bulk" "$lr" "$d_solo" "$d_bulk" "$dr"
done
echo
echo "medians over $reps: Jain (1:1) $(median "${jains[@]}") (target >= 0.95); A/B at 3:1 $(median "${ratios[@]}") (3.0 +- 0.3); aggregate/solo $(median "${aggs[@]}") (>= 0.90); 64 KiB p99 beside bulk / alone $(median "${lats[@]}") back to back, $(median "${duty[@]}") one every ${lat_interval} us (<= 3)"
echo "(rates: bytes each job sent on the rails, summed over the 4 daemons, over a ${window} s window in which both ran; pace $(grep -o '"pace": *"[^"]*"' "$dir/n0.json" | head -1))"
