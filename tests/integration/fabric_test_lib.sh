# The preamble of the tests on scripts/fabric.sh, sourced (after `set -euo pipefail`) with TEST
# set to the test's name. Sets root, build (exported as RAILYARD_BUILD_DIR, default build/) and
# fabric (the script); defines skip REASON (exit 77, ctest's SKIP_RETURN_CODE) and fail MESSAGE
# (exit 1, after the tail of every daemon log and railyard-perf output in $dir, once the test
# has set dir). Skips when this machine cannot build a fabric (not root, no ip netns, no tc);
# fails when railyardd, railctl or railyard-perf is not built.
# shellcheck shell=bash
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=scripts/lib/netns.sh
. "$root/scripts/lib/netns.sh"
build=${RAILYARD_BUILD_DIR:-$root/build}
case $build in /*) ;; *) build=$root/$build ;; esac
export RAILYARD_BUILD_DIR=$build
# shellcheck disable=SC2034 # used by the tests that source this
fabric=$root/scripts/fabric.sh

skip() {
  echo "SKIP: $TEST: $1"
  exit 77
}
fail() {
  echo "FAIL: $TEST: $1" >&2
  if [ -n "${dir:-}" ]; then
    for f in "$dir"/n*.log "$dir"/perf*; do
      [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }
    done
  fi
  exit 1
}
if why=$(netns_unavailable); then skip "$why"; fi
command -v tc >/dev/null 2>&1 || skip "no tc command (iproute2's tc)"
for b in daemon/railyardd tools/railctl tools/railyard-perf; do
  [ -x "$build/$b" ] || fail "no $build/$b (build first)"
done
