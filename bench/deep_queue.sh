#!/usr/bin/env bash
# Deep queues on an emulated fabric (issue 56): scripts/fabric.sh with 4 nodes x 2 rails of
# 1 Gbit/s, one rank per node, 16 MiB AllReduce. Per repetition (launches interleaved):
#   shallow   railyard-perf -n 10: busbw as the tool reports it (10 operations in flight);
#   deep      railyard-perf -n DEEP (default 200: every operation submitted at once, up to the
#             rings' 1024): busbw as reported;
#   solo      one job with -n 100000 (1023 in flight) alone: bytes it sent on the rails over a
#             WINDOW-second window (Admin.ListJobs summed over the daemons, bench/job_bytes.py);
#   weighted  jobs A and B, weights 3:1, both -n 100000: bytes over the same window, A/B ratio,
#             (A+B)/solo, and whether both were still running at the end (not aborted).
# Prints per repetition and medians: deep/shallow (target >= 0.90), A/B (3.0 +- 0.3),
# (A+B)/solo (>= 0.90), aborted jobs (0).
#   bench/deep_queue.sh [REPS=3]
# Environment: RAILYARD_BUILD_DIR (build), DEEP_WINDOW (20 s), DEEP_N (200).
# Not a test: 4 daemons, 4 ranks and every veth's packets share this machine's cores.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/netns.sh
. scripts/lib/netns.sh
reps=${1:-3}
build=${RAILYARD_BUILD_DIR:-build}
window=${DEEP_WINDOW:-20}
deep_n=${DEEP_N:-200}
dir=/tmp/railyard-deep-queue
if why=$(netns_unavailable); then
  echo "deep_queue: cannot run: $why" >&2
  exit 2
fi
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  scripts/fabric.sh down --dir "$dir" >/dev/null 2>&1 || true
}
trap cleanup EXIT
scripts/fabric.sh up --nodes 4 --rails 2 --rate 1gbit --dir "$dir" --prefix ryq- >/dev/null
socks=$(ls "$dir"/n*.sock | paste -sd,)
ctl="$build/tools/railctl"
perf="$build/tools/railyard-perf"
snapshot() {
  for s in "$dir"/n*.sock; do "$ctl" jobs --json --socket "$s"; done | /usr/bin/python3 bench/job_bytes.py
}
bytes_of() { awk -v j="$1" '$1 == j { print $2 }' <<<"$2"; }
set_weight() { for s in "$dir"/n*.sock; do "$ctl" jobs set-weight "$1" "$2" --socket "$s" >/dev/null; done; }
busbw() { # ITERS -> the tool's out-of-place busbw (GB/s)
  "$perf" --op allreduce -b 16M -e 16M -n "$1" -w 1 -c 0 --daemons "$socks" --job shallow \
    --deadline_s 300 | awk '$1 == 16777216 { print $8; exit }'
}
# Starts JOB with -n 100000 in the background (its pid appended to pids).
start_bulk() {
  "$perf" --op allreduce -b 16M -e 16M -n 100000 -w 0 -c 0 --daemons "$socks" --job "$1" \
    --deadline_s $((window + 60)) >"$dir/perf-$1.log" 2>&1 &
  pids+=($!)
}
# Bytes per second of each named job over the window (after 3 s); then "alive" per job.
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
stop_bulk() { # sets $ended: how many of the started bulk jobs had ended (aborted) before now
  ended=0
  for p in "${pids[@]}"; do
    if ! kill -0 "$p" 2>/dev/null; then
      ended=$((ended + 1))
      echo "deep_queue: a bulk job ended early; its log:" >&2
      for f in "$dir"/perf-*.log; do echo "== $f" >&2; tail -n 5 "$f" >&2; done
    fi
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  pids=()
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

depth=() ratios=() aggs=() aborted=()
printf '%-4s %-12s %-12s %-11s %-9s %-8s %-8s %-7s %-8s %-7s\n' rep shallow_GB/s deep_GB/s deep/shal \
  solo_MB/s A_MB/s B_MB/s A/B agg/solo aborted
for rep in $(seq "$reps"); do
  shallow=$(busbw 10)
  deep=$(busbw "$deep_n")
  set_weight A 1
  start_bulk S
  read -r solo < <(window_rates S)
  stop_bulk
  a0=$ended
  set_weight A 3
  set_weight B 1
  start_bulk A
  start_bulk B
  read -r wa wb < <(window_rates A B)
  stop_bulk
  a1=$ended
  d=$(awk -v a="$deep" -v b="$shallow" 'BEGIN { printf "%.3f", a / b }')
  r=$(awk -v a="$wa" -v b="$wb" 'BEGIN { printf "%.3f", a / b }')
  g=$(awk -v a="$wa" -v b="$wb" -v s="$solo" 'BEGIN { printf "%.3f", (a + b) / s }')
  depth+=("$d") ratios+=("$r") aggs+=("$g") aborted+=("$((a0 + a1))")
  printf '%-4s %-12s %-12s %-11s %-9.1f %-8.1f %-8.1f %-7s %-8s %-7s\n' "$rep" "$shallow" "$deep" "$d" \
    "$(awk -v v="$solo" 'BEGIN{print v/1e6}')" "$(awk -v v="$wa" 'BEGIN{print v/1e6}')" \
    "$(awk -v v="$wb" 'BEGIN{print v/1e6}')" "$r" "$g" "$((a0 + a1))"
done
echo
echo "medians over $reps: deep/shallow busbw $(median "${depth[@]}") (target >= 0.90); A/B at 3:1 $(median "${ratios[@]}") (3.0 +- 0.3); (A+B)/solo $(median "${aggs[@]}") (>= 0.90); aborted $(median "${aborted[@]}") (0)"
echo "(bytes each job sent on the rails, summed over the 4 daemons, over a ${window} s window; deep = -n $deep_n, all in flight)"
