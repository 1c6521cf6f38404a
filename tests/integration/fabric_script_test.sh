#!/usr/bin/env bash
# scripts/fabric.sh end to end: brings up a 2-node, 2-rail emulated fabric at 200 Mbit/s in its
# own directory and with its own namespace prefix (never a developer's running fabric), checks
# the node lines, that `up` again is idempotent, that each daemon answers railctl status and
# /metrics, runs a small railyard-perf AllReduce across both daemons with the data check, checks
# that the bytes crossed the shaped veths, then `down` (twice) and that everything is gone.
#   tests/integration/fabric_script_test.sh          # binaries from ${RAILYARD_BUILD_DIR:-build}
# Exits 77 (ctest SKIP_RETURN_CODE) with the reason when not root or without ip netns / tc.
set -euo pipefail
TEST=fabric_script_test
# shellcheck source=tests/integration/fabric_test_lib.sh
. "$(dirname "$0")/fabric_test_lib.sh"

dir=$(mktemp -d /tmp/railyard-fabric-test.XXXXXX)
prefix=rt$(($$ % 100000))-
cleanup() {
  "$fabric" down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

up=(--nodes 2 --rails 2 --rate 200mbit --dir "$dir" --prefix "$prefix")
out=$("$fabric" up "${up[@]}") || fail "fabric.sh up failed (exit $?)"
echo "$out"
[ "$(echo "$out" | wc -l)" = 2 ] || fail "expected 2 node lines, got: $out"
for k in 0 1; do
  want="node n$k netns ${prefix}n$k socket $dir/n$k.sock peer 10.77.0.$((k + 1)):7077 metrics 10.77.0.$((k + 1)):9090"
  [ "$(echo "$out" | sed -n "$((k + 1))p")" = "$want" ] || fail "line $k: want '$want', got: $out"
  [ -S "$dir/n$k.sock" ] || fail "no socket $dir/n$k.sock"
done
grep -q '"pace": "22MB/s"' "$dir/n0.json" || fail "n0.json lacks the default pace (88% of 200 Mbit/s): $(cat "$dir/n0.json")"
"$build/tools/railctl" topo --file "$dir/fabric.json" >/dev/null || fail "railctl cannot read fabric.json"
"$build/tools/railctl" model allreduce --size 1MiB --topology "$dir/fabric.json" >/dev/null ||
  fail "railctl model cannot use fabric.json"

again=$("$fabric" up "${up[@]}") || fail "second up failed"
[ "$again" = "$out" ] || fail "second up printed other lines: $again"
[ "$("$fabric" status --dir "$dir")" = "$out" ] || fail "status does not print the node lines"

for k in 0 1; do
  "$build/tools/railctl" status --socket "$dir/n$k.sock" >"$dir/status$k.txt" 2>&1 ||
    fail "railctl status on n$k: $(cat "$dir/status$k.txt")"
  # Paced at 22 MB/s: the chunk cap is the power of two at or below 2.5 ms of it (55 KB), which
  # railctl calibrate models multi-node schedules with.
  "$build/tools/railctl" status --socket "$dir/n$k.sock" --json >"$dir/status$k.json" 2>&1 ||
    fail "railctl status --json on n$k: $(cat "$dir/status$k.json")"
  grep -Eq '"pacedChunkBytes": ?"32768"' "$dir/status$k.json" ||
    fail "n$k's status does not announce a 32 KiB paced chunk: $(grep -i chunk "$dir/status$k.json")"
  # Read whole, then searched: under pipefail, `curl | grep -q` fails whenever grep exits on its
  # first match while curl is still writing (curl dies of the closed pipe).
  metrics=$(ip netns exec "${prefix}n$k" curl -sf --max-time 5 "http://10.77.0.$((k + 1)):9090/metrics") ||
    fail "cannot scrape /metrics of n$k"
  grep -q '^railyard_' <<<"$metrics" || fail "no railyard metrics from n$k"
done

tx() { ip netns exec "${prefix}n0" cat "/sys/class/net/rail$1/statistics/tx_bytes"; }
tx0=$(tx 0) tx1=$(tx 1)
timeout 120 "$build/tools/railyard-perf" --op allreduce -b 8 -e 64K -f 2 -n 5 -w 1 -c 1 \
  --daemons "$dir/n0.sock,$dir/n1.sock" --ranks-per-daemon 2 >"$dir/perf.txt" 2>&1 ||
  { cat "$dir/perf.txt" >&2; fail "railyard-perf failed"; }
cat "$dir/perf.txt"
grep -q '^# Out of bounds values : 0 OK' "$dir/perf.txt" || fail "railyard-perf's data check failed"
grep -q '^ *65536 ' "$dir/perf.txt" || fail "railyard-perf did not reach 64 KiB"
# (railyard-perf names its communicator on stderr, which perf.txt holds too.)
grep -q 'communicator ry1-[0-9a-f]*@10.77.0.1:7077' "$dir/perf.txt" ||
  fail "the communicator is not coordinated on n0's rail0"
d0=$(($(tx 0) - tx0)) d1=$(($(tx 1) - tx1))
echo "n0 sent $d0 bytes on rail0, $d1 on rail1"
# 5 + 1 iterations, out-of-place and in-place, up to 64 KiB: far more than 64 KiB must cross.
[ $((d0 + d1)) -ge 65536 ] || fail "only $((d0 + d1)) bytes left n0 on its rails"

"$fabric" down --dir "$dir" || fail "down failed"
"$fabric" down --dir "$dir" || fail "second down failed"
for ns in "${prefix}n0" "${prefix}n1" "${prefix}fabric"; do
  [ ! -e "/run/netns/$ns" ] || fail "namespace $ns is still there after down"
done
[ ! -e "$dir/n0.sock" ] || fail "down left $dir/n0.sock"
pgrep -f -- "--socket=$dir/n" >/dev/null && fail "a railyardd of this fabric still runs after down"
if "$fabric" up --nodes 1 --rails 1 --rate 1gbit --dir "$dir" --prefix "$prefix" 2>/dev/null; then
  fail "up --nodes 1 succeeded"
else
  rc=$?
  [ "$rc" = 2 ] || fail "up --nodes 1 exited $rc, want 2"
fi
echo "PASS: fabric_script_test"
