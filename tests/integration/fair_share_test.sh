#!/usr/bin/env bash
# Fair share on a paced rail, end to end (issue 14): a 2-node fabric (scripts/fabric.sh, one
# 200 Mbit/s rail, paced to 14 MB/s: below what the link carries, so the backlog waits in the
# daemons' fair queues), daemons started with --job_weights (via RAILYARD_JOB_WEIGHTS) giving
# job A weight 3. Checks:
#   - railctl jobs shows A at 3 from the file, B at the default 1;
#   - A and B running 1 MiB AllReduces at once send 3:1 (+-20%) over a window where both run
#     (bytes each sent on the rail, from Admin.ListJobs, summed over both daemons);
#   - the weight is railyard_job_fair_share_weight on /metrics;
#   - SIGHUP reloads the file (B 2 from the file, the admin-set weight replaced), a broken file
#     on SIGHUP keeps the weights in use;
#   - set-weight refuses a weight out of range and a bad job id, with exit 1 and the reason.
# Exits 77 (ctest SKIP_RETURN_CODE) with the reason when not root or without ip netns / tc.
set -euo pipefail
TEST=fair_share_test
# shellcheck source=tests/integration/fabric_test_lib.sh
. "$(dirname "$0")/fabric_test_lib.sh"
ctl=$build/tools/railctl
perf=$build/tools/railyard-perf

dir=$(mktemp -d /tmp/railyard-fair-test.XXXXXX)
prefix=rq$(($$ % 100000))-
perf_pids=()
cleanup() {
  for p in "${perf_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  "$fabric" down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

weights=$dir/weights
printf '# job weight\nA 3\n' >"$weights"
RAILYARD_JOB_WEIGHTS=$weights "$fabric" up --nodes 2 --rails 1 --rate 200mbit --pace 14MB/s \
  --dir "$dir" --prefix "$prefix" >/dev/null || fail "fabric.sh up failed"
socks="$dir/n0.sock,$dir/n1.sock"

jobs_json() { for s in "$dir"/n0.sock "$dir"/n1.sock; do "$ctl" jobs --json --socket "$s"; done; }
weight_of() { # JOB: "weight source" on n0
  "$ctl" jobs --json --socket "$dir/n0.sock" | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
for j in d["jobs"]:
    if j["jobId"] == sys.argv[1]:
        print(j["weight"], j["weightSource"])' "$1"
}
[ "$(weight_of A)" = "3 file" ] || fail "A's weight from the file: got '$(weight_of A)'"

# Both jobs at once: A gets 3/4 of 14 MB/s (a 1 MiB op every ~0.1 s), B 1/4 (~0.3 s).
"$perf" --op allreduce -b 1M -e 1M -n 120 -w 1 -c 1 --daemons "$socks" --job A --deadline_s 120 \
  >"$dir/perf-A.log" 2>&1 &
perf_pids+=($!)
"$perf" --op allreduce -b 1M -e 1M -n 50 -w 1 -c 1 --daemons "$socks" --job B --deadline_s 120 \
  >"$dir/perf-B.log" 2>&1 &
perf_pids+=($!)
sleep 3
s0=$(jobs_json | /usr/bin/python3 "$root/bench/job_bytes.py")
sleep 5
s1=$(jobs_json | /usr/bin/python3 "$root/bench/job_bytes.py")
for p in "${perf_pids[@]}"; do wait "$p" || fail "a railyard-perf run failed"; done
perf_pids=()
for j in A B; do
  grep -q "Out of bounds values : 0 OK" "$dir/perf-$j.log" || fail "job $j's data check failed"
done
ratio=$(awk -v s0="$s0" -v s1="$s1" 'BEGIN {
  n = split(s0, a, /[ \n]/); for (i = 1; i < n; i += 2) b0[a[i]] = a[i + 1]
  n = split(s1, a, /[ \n]/); for (i = 1; i < n; i += 2) b1[a[i]] = a[i + 1]
  da = b1["A"] - b0["A"]; db = b1["B"] - b0["B"]
  if (db <= 0) { print "none"; exit }
  printf "%.3f", da / db }')
echo "bytes over the window: A/B = $ratio (weights 3:1); before: $(echo $s0) after: $(echo $s1)"
awk -v r="$ratio" 'BEGIN { exit !(r != "none" && r >= 2.4 && r <= 3.6) }' ||
  fail "A/B byte ratio $ratio is not 3 +- 20%"

m=$(ip netns exec "${prefix}n0" curl -sf --max-time 5 http://10.77.0.1:9090/metrics) || fail "no /metrics"
grep -q '^railyard_job_fair_share_weight{job="A"} 3$' <<<"$m" ||
  fail "railyard_job_fair_share_weight{job=\"A\"} is not 3: $(echo "$m" | grep fair_share)"
grep -q '^railyard_job_rail_bytes_total{job="A",rail="rail0"} [1-9]' <<<"$m" ||
  fail "no railyard_job_rail_bytes_total for A: $(echo "$m" | grep job_rail_bytes)"
grep -q '^railyard_job_queue_delay_seconds_count{job="B",rail="rail0"} [1-9]' <<<"$m" ||
  fail "no queueing delay histogram for B"

# Bad weights are refused with the reason; nothing changes.
out=$("$ctl" jobs set-weight A 0 --socket "$dir/n0.sock" 2>&1) && fail "weight 0 accepted"
echo "$out" | grep -q "INVALID_ARGUMENT.*not a number in \[0.01, 1000\]" || fail "weight 0: $out"
out=$("$ctl" jobs set-weight 'a/b' 2 --socket "$dir/n0.sock" 2>&1) && fail "job id a/b accepted"
echo "$out" | grep -q "INVALID_ARGUMENT.*not a job id" || fail "job a/b: $out"
[ "$(weight_of A)" = "3 file" ] || fail "a refused set-weight changed A: $(weight_of A)"
"$ctl" jobs set-weight C 5 --socket "$dir/n0.sock" | grep -q "job C: weight 5 (was 1)" ||
  fail "set-weight C 5 did not say so"
[ "$(weight_of C)" = "5 admin" ] || fail "C after set-weight: $(weight_of C)"

# SIGHUP: the file is reloaded (C's admin weight replaced by the file's view: C is gone).
pids=$(awk '$1 == "pid" { print $2 }' "$dir/fabric.state")
[ -n "$pids" ] || fail "no daemon pids in $dir/fabric.state"
printf 'A 1\nB 2\n' >"$weights"
kill -HUP $pids
for _ in $(seq 50); do [ "$(weight_of B)" = "2 file" ] && break; sleep 0.1; done
[ "$(weight_of B)" = "2 file" ] || fail "B after SIGHUP: $(weight_of B)"
[ "$(weight_of A)" = "1 file" ] || fail "A after SIGHUP: $(weight_of A)"
[ -z "$(weight_of C)" ] || fail "C's admin weight survived the reload: $(weight_of C)"
# A broken file on SIGHUP: logged, the weights in use stay.
printf 'A 1\nB two\n' >"$weights"
kill -HUP $pids
for _ in $(seq 50); do grep -q "job weights not reloaded" "$dir/n0.log" && break; sleep 0.1; done
grep -q "job weights not reloaded" "$dir/n0.log" || fail "no log line for the broken file"
[ "$(weight_of B)" = "2 file" ] || fail "a broken file changed B: $(weight_of B)"
for p in $pids; do kill -0 "$p" || fail "daemon $p died on SIGHUP"; done
echo "PASS: fair_share_test"
