#!/usr/bin/env bash
# The whole test suite, as CI runs it: dependencies, format check, a -Werror build with every
# unit and integration test, then the same suite again under AddressSanitizer and
# UndefinedBehaviorSanitizer in a separate build, then every libFuzzer target for a bounded time
# (scripts/fuzz.sh, clang, build-fuzz/).
#   RAILYARD_SKIP_SANITIZERS=1  skips the sanitizer pass (local iteration only; CI runs it).
#   RAILYARD_SKIP_FUZZ=1        skips the fuzz pass (local iteration only; CI runs it);
#                               RAILYARD_FUZZ_SECONDS sets its seconds per target (default 30).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/install-deps.sh
scripts/check-format.sh

# Buffers are memfds passed by descriptor: nothing named railyard* may ever appear in /dev/shm
# while the suite runs. Polled every 0.2 s in the background; any sighting fails the run.
shm_seen=$(mktemp)
( while :; do
    find /dev/shm -maxdepth 1 -name 'railyard*' 2>/dev/null >>"$shm_seen"
    sleep 0.2
  done ) &
shm_watch=$!
check_dev_shm() {
  kill "$shm_watch" 2>/dev/null || true
  wait "$shm_watch" 2>/dev/null || true
  if [ -s "$shm_seen" ]; then
    echo "FAIL: railyard objects appeared in /dev/shm during the tests:"
    sort -u "$shm_seen"
    exit 1
  fi
  echo "== /dev/shm: nothing named railyard* appeared during the tests"
}
trap 'kill "$shm_watch" 2>/dev/null || true; rm -f "$shm_seen"' EXIT

echo "== build (release, -Werror)"
scripts/build.sh
echo "== tests"
ctest --test-dir build --output-on-failure -j 2 --timeout 600

if [ "${RAILYARD_SKIP_SANITIZERS:-0}" != "1" ]; then
  echo "== build (address,undefined sanitizers)"
  RAILYARD_BUILD_DIR=build-asan scripts/build.sh -DCMAKE_BUILD_TYPE=Debug \
    -DRAILYARD_SANITIZE=address,undefined -DRAILYARD_WITH_CUDA=OFF
  echo "== tests under sanitizers"
  # gRPC keeps some process-lifetime singletons that LeakSanitizer reports at exit.
  # The per-algorithm multi-node matrix runs the same executor and transport code for every
  # algorithm; under sanitizers three of the six (default, ring, hier) keep the suite short, and
  # schedule_test still runs every generator under ASan.
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j 2 --timeout 900 \
    -E 'EveryCollectiveAcrossThreeDaemons/(tree|rhd|direct)' 
fi
check_dev_shm
if [ "${RAILYARD_SKIP_FUZZ:-0}" != "1" ]; then
  echo "== fuzz targets (libFuzzer, address,undefined)"
  scripts/fuzz.sh
fi
echo "== all tests passed in $(( $(date +%s) - start )) s"
