#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, RAILYARD_FUZZ=ON, clang, ASan + UBSan) in build-fuzz/
# (or $RAILYARD_FUZZ_BUILD_DIR) and runs each for SECONDS over a temporary copy of its seed corpus
# (tests/fuzz/corpus/<target>/; nothing is written into the repository), then prints
#   target  executions  exec/s  corpus  (from libFuzzer's final stats)
# Any crash, sanitizer report, leak, timeout or out-of-memory fails the script and leaves the input
# that caused it under the artifacts directory it prints (reproduce: build-fuzz/tests/fuzz/<target>
# <input>). docs/development.md, "Fuzzing".
#   scripts/fuzz.sh [SECONDS]      seconds per target: default $RAILYARD_FUZZ_SECONDS or 30
#   RAILYARD_FUZZ_JOBS=N           targets run at once (default: the number of CPUs)
#   RAILYARD_FUZZ_TARGETS="a b"    only these targets (names as in tests/fuzz/<name>.cc)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/ccache.sh
start=$(date +%s)
seconds=${1:-${RAILYARD_FUZZ_SECONDS:-30}}
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "fuzz.sh: SECONDS must be a positive integer, got '$seconds'" >&2
  exit 2
fi
build_dir=${RAILYARD_FUZZ_BUILD_DIR:-build-fuzz}
if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ not found (scripts/install-deps.sh installs clang and libclang-rt-14-dev)" >&2
  exit 2
fi

if [ -n "${RAILYARD_FUZZ_TARGETS:-}" ]; then
  read -r -a targets <<<"$RAILYARD_FUZZ_TARGETS"
else
  targets=()
  for src in tests/fuzz/*_fuzz.cc; do targets+=("$(basename "$src" .cc)"); done
fi
parallel=${RAILYARD_FUZZ_JOBS:-$(nproc)}
if [ "$parallel" -gt ${#targets[@]} ]; then parallel=${#targets[@]}; fi
if [ "$parallel" -lt 1 ]; then parallel=1; fi

echo "== fuzz build ($build_dir: clang, address,undefined, libFuzzer)"
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DRAILYARD_FUZZ=ON -DRAILYARD_WERROR=ON -DRAILYARD_WITH_CUDA=OFF >/dev/null
ninja -C "$build_dir" -j "$(nproc)" "${targets[@]}"
built=$(date +%s)

work=$(mktemp -d "${TMPDIR:-/tmp}/railyard-fuzz.XXXXXX")
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

run_target() {
  local t=$1
  local corpus=$work/corpus/$t
  mkdir -p "$corpus" "$work/artifacts"
  if [ -d "tests/fuzz/corpus/$t" ]; then cp -r "tests/fuzz/corpus/$t/." "$corpus/"; fi
  # Slow inputs (a regression seed that expands a million CPUs) get mutated less: without the
  # scaling they took most of the time of their target (topology_file_fuzz: 200 vs 6000 exec/s).
  local args=(-max_total_time="$seconds" -print_final_stats=1 -timeout=30
              -entropic_scale_per_exec_time=1 -artifact_prefix="$work/artifacts/$t-")
  if [ -f "tests/fuzz/$t.dict" ]; then args+=(-dict="tests/fuzz/$t.dict"); fi
  local rc=0
  "$build_dir/tests/fuzz/$t" "${args[@]}" "$corpus" >"$work/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t.rc"
}

echo "== fuzzing ${#targets[@]} targets, ${seconds} s each, $parallel at a time (work dir $work)"
running=0
for t in "${targets[@]}"; do
  if [ ! -x "$build_dir/tests/fuzz/$t" ]; then
    echo "fuzz.sh: no fuzz target $t in $build_dir/tests/fuzz" >&2
    exit 2
  fi
  run_target "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

final_stat() {  # final_stat NAME LOG: the last value libFuzzer printed for stat::NAME, or -
  local v
  v=$(grep -E "^stat::$1:" "$2" | tail -1 | awk '{print $2}')
  echo "${v:--}"
}

failed=()
printf '%-22s %12s %9s %7s %8s  %s\n' target executions exec/s corpus rss_mb result
for t in "${targets[@]}"; do
  log=$work/$t.log
  rc=$(cat "$work/$t.rc")
  result=ok
  if [ "$rc" != 0 ]; then
    result="FAILED (exit $rc)"
    failed+=("$t")
  fi
  corpus_files=$(find "$work/corpus/$t" -type f | wc -l)
  printf '%-22s %12s %9s %7s %8s  %s\n' "$t" "$(final_stat number_of_executed_units "$log")" \
    "$(final_stat average_exec_per_sec "$log")" "$corpus_files" "$(final_stat peak_rss_mb "$log")" "$result"
done
end=$(date +%s)
echo "== fuzz: build $((built - start)) s, run $((end - built)) s, total $((end - start)) s"

if [ ${#failed[@]} -gt 0 ]; then
  for t in "${failed[@]}"; do
    echo
    echo "== $t failed; the end of its log ($work/$t.log):"
    grep -v '^#[0-9]' "$work/$t.log" | tail -40
    for input in "$work/artifacts/$t-"*; do
      [ -e "$input" ] || continue
      echo "-- input: $input"
      echo "   reproduce: $build_dir/tests/fuzz/$t $input"
    done
  done
  echo
  echo "fuzz.sh: ${#failed[@]} target(s) failed: ${failed[*]} (inputs kept under $work/artifacts)" >&2
  exit 1
fi
rm -rf "$work"
