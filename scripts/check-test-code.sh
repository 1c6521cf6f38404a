#!/usr/bin/env bash
# The installed binaries carry no test code: no symbol of the fake device runtime
# (FakeDeviceRuntime) or of the bit flips (BitFlipEndpoint) is linked into railyardd or
# railyard-perf, and they refuse the test-only flags with exit code 2 and a message naming the
# test build. The test builds (railyardd-testing, railyard-perf-testing) must have them: that is
# what shows this check can see them.
#   scripts/check-test-code.sh RAILYARDD RAILYARD_PERF RAILYARDD_TESTING RAILYARD_PERF_TESTING
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 railyardd railyard-perf railyardd-testing railyard-perf-testing"; exit 2; }
daemon=$1 perf=$2 daemon_testing=$3 perf_testing=$4
fail=0
test_symbols() { nm -C "$1" | grep -cE 'FakeDeviceRuntime|BitFlipEndpoint' || true; }

for bin in "$daemon" "$perf"; do
  n=$(test_symbols "$bin")
  if [ "$n" != 0 ]; then
    echo "FAIL: $bin has $n test-only symbols:"; nm -C "$bin" | grep -E 'FakeDeviceRuntime|BitFlipEndpoint' | head -5
    fail=1
  else
    echo "ok: $bin has no FakeDeviceRuntime or BitFlipEndpoint symbol"
  fi
done
n=$(nm -C "$daemon_testing" | grep -c 'FakeDeviceRuntime::' || true)
m=$(nm -C "$daemon_testing" | grep -c 'BitFlipEndpoint::' || true)
p=$(nm -C "$perf_testing" | grep -c 'FakeDeviceRuntime::' || true)
if [ "$n" = 0 ] || [ "$m" = 0 ] || [ "$p" = 0 ]; then
  echo "FAIL: the test builds lack the hooks ($n fake device, $m bit flip symbols in $daemon_testing; $p in $perf_testing)"
  fail=1
else
  echo "ok: the test builds have them ($n + $m symbols in railyardd-testing, $p in railyard-perf-testing)"
fi

refused() {  # refused WHAT EXPECTED-TEXT CMD...
  local what=$1 want=$2; shift 2
  set +e; out=$(timeout 20 "$@" 2>&1); rc=$?; set -e
  if [ "$rc" != 2 ] || ! grep -q -- "$want" <<<"$out"; then
    echo "FAIL: $what: exit $rc, wanted 2 and \"$want\"; said: $out"; fail=1
  else
    echo "ok: $what: exit 2: $out"
  fi
}
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
refused "railyardd --fake_gpus=1" "railyardd-testing" "$daemon" --socket="$dir/a.sock" --fake_gpus=1
refused "railyardd --test_flip_bit_every=3" "railyardd-testing" "$daemon" --socket="$dir/b.sock" --test_flip_bit_every=3
refused "railyard-perf --fake_device" "railyard-perf-testing" "$perf" --daemons "$dir/c.sock" --device 0 --fake_device -b 8 -e 8
[ -e "$dir/a.sock" ] && { echo "FAIL: railyardd created its socket before refusing"; fail=1; }
exit $fail
