#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (an H200 here): builds Railyard with CUDA for
# sm_90, runs the GPU tests (kernels against the CPU kernels for every dtype x op, device memory
# exported by clients and imported by railyardd, collectives on device buffers through a real
# daemon with 2 and 4 ranks sharing one GPU; the Python client's legacy IPC registration and
# stream ordering on a real CUDA stream, tests/python/test_cuda_python.py), then prints
#   - cuda-bench: device memcpy bandwidth and the reduce kernels' at 1 MiB-256 MiB, and
#   - railyard-perf AllReduce on device buffers, 2 and 4 ranks on one daemon, 8 B-256 MiB,
# with the two targets of issue 16 computed from them: reduce kernel / memcpy at >= 64 MiB
# (>= 0.9), and 2-rank 64 MiB AllReduce against the bound 2*M / memcpy bandwidth (>= 0.7).
# Runs start to finish without edits in under 10 minutes (each step has its own timeout).
#
#   scripts/device-check.sh [BUILD_DIR [STEP...]]    default: build-gpu, every step
#
# STEPs, run in the order given (default: gtest bench perf python torch internode nccl): gtest (the
# GPU test binaries), bench (cuda-bench), perf (railyard-perf), python (the client on CUDA
# memory), torch (the torch backend on cuda tensors), internode (bench/device_internode.sh: an
# AllReduce across two daemons on device 0, staged through host memory, 1-64 MiB), nccl (NCCL
# programs on railyard's libnccl.so.2: tests/nccl/nccl_ranks.cc's device part, 4 ranks on 2
# daemons all on device 0, cudaMalloc'd and ncclMemAlloc'd memory on a CUDA stream; then torch's
# ProcessGroupNCCL through LD_PRELOAD, tests/nccl/torch_nccl_ddp.py, DDP steps against gloo on
# CPU). LOG_DIR, when set, keeps each step's full output there.
#
# Builds when the machine can (what scripts/install-deps.sh installs, and nvcc on PATH or in
# /usr/local/cuda/bin). A machine without gRPC and UCX development files, such as the CUDA image
# of the device machines lent here, which has no network to install them, runs the bundle that
# scripts/device-bundle.sh BUILD_DIR made elsewhere (BUILD_DIR/bundle, carried along); set
# RAILYARD_PREBUILT=1 to use the bundle even where a build would work. PYTHON names the
# interpreter (default: the first of python3 and /usr/bin/python3 that imports grpc and numpy).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${1:-build-gpu}
shift $(($# > 0 ? 1 : 0))
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(gtest bench perf python torch internode nccl)
start=$SECONDS
failures=()
step() { printf '\n== %s (at %ds)\n' "$*" $((SECONDS - start)); }
fail() { failures+=("$1"); echo "device-check: FAILED: $1"; }
# keep NAME: stdin to $LOG_DIR/NAME when LOG_DIR is set.
keep() { if [ -n "${LOG_DIR:-}" ]; then mkdir -p "$LOG_DIR" && cat >"$LOG_DIR/$1"; else cat >/dev/null; fi; }

step "machine"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
  echo "nvidia-smi: not found"
nvcc --version | tail -2 | head -1
echo "cores: $(nproc)"

# shellcheck source=scripts/lib/device-bins.sh
. scripts/lib/device-bins.sh
step "binaries"
railyard_binaries "$build" railyardd railyard-perf cuda-bench cuda_device_test cuda_daemon_test \
  device_runtime_test railyard_python railyard_nccl nccl-test-ranks ||
  { echo "device-check: no binaries to run"; exit 1; }
echo "ready at $((SECONDS - start)) s"
export RAILYARDD=$daemon_bin  # the daemon the GPU tests start
if [ -z "${PYTHON:-}" ]; then
  for p in python3 /usr/bin/python3; do
    if "$p" -c 'import grpc, google.protobuf, numpy' 2>/dev/null; then PYTHON=$p; break; fi
  done
fi
echo "python: ${PYTHON:-none that imports grpc, protobuf and numpy}"

check_gtest() {
  step "GPU tests: kernels, import, device memory through railyardd (tests/cuda)"
  local t out rc
  for t in cuda_device_test cuda_daemon_test; do
    out=$(timeout 150 "$cuda_tests/$t" 2>&1)
    rc=$?
    keep "$t.log" <<<"$out"
    grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|Skipped|Failure|Expected|Which is|error' <<<"$out"
    [ $rc -eq 0 ] || fail "$t (exit $rc)"
    # Nothing may be skipped for want of a device on a GPU machine (the tests of what happens
    # without a driver skip where there is one).
    if grep '^\[  SKIPPED \]' <<<"$out" | grep -vq 'WithoutAUsableDriver\|listed below'; then
      fail "$t skipped tests: no usable GPU here"
    fi
  done
  step "the device-runtime contract on the fake (CI runs the fake-device integration tests)"
  timeout 60 "$unit_tests/device_runtime_test" --gtest_brief=1 || fail device_runtime_test
}

# pytest_gpu FILE SECONDS: one Python test file against the CUDA build; its output is kept in $out.
pytest_gpu() {
  if [ -z "${PYTHON:-}" ]; then out="skipped: no Python with grpc"; fail "$1 (no Python)"; return; fi
  local path=$pkg
  if ! PYTHONPATH=$path "$PYTHON" -c 'import railyard.v1.local_pb2' 2>/dev/null &&
    [ -d "${bundle:-}/python-protobuf" ]; then
    echo "this Python's protobuf cannot load the bundle's stubs: using the bundle's pure-Python one"
    path=$pkg:$bundle/python-protobuf
    export PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python
  fi
  out=$(PYTHONPATH="$path" PYTHONUNBUFFERED=1 timeout "$2" \
    "$PYTHON" -m pytest -q -rs -p no:cacheprovider "tests/python/$1" 2>&1)
  local rc=$?
  keep "$1.log" <<<"$out"
  tail -25 <<<"$out"
  [ $rc -eq 0 ] || fail "$1 (exit $rc)"
}

check_python() {
  step "the Python client on the GPU: legacy IPC memory, a collective on a CUDA stream"
  pytest_gpu test_cuda_python.py 120
  if grep -q ' skipped' <<<"$out"; then fail "test_cuda_python.py skipped: no usable GPU here"; fi
}

check_torch() {
  step "torch on cuda tensors through the railyard backend (needs a CUDA build of torch)"
  "${PYTHON:-python3}" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  pytest_gpu test_torch_cuda.py 150
  # A torch without CUDA skips it and says so above; that is this machine's torch, not a failure.
}

copy64=
check_bench() {
  step "cuda-bench: device memcpy and reduce-kernel bandwidth"
  local bench_out
  bench_out=$(timeout 120 "$bench_bin" --iters=20 --max_mib=256 2>&1) || fail cuda-bench
  echo "$bench_out"
  copy64=$(awk '$1 == "memcpy_GBps_64MiB" {print $2}' <<<"$bench_out")
  awk '$1 ~ /^[0-9]+$/ && $1 >= 67108864 {
         printf "target: reduce kernel >= 0.9 of memcpy at %d bytes: 2 inputs %.3f, 4 inputs %.3f %s\n",
                $1, $4, $6, ($4 >= 0.9 && $6 >= 0.9) ? "(met)" : "(NOT met)" }' <<<"$bench_out"
}

check_perf() {
  local dir daemon n out
  dir=$(mktemp -d /tmp/ry-devcheck-XXXXXX)
  step "railyard-perf: AllReduce on device buffers, one daemon (daemon log: $dir/railyardd.log)"
  "$daemon_bin" --socket="$dir/ry.sock" --node_name=devcheck \
    --insecure_first_session_token >"$dir/railyardd.log" 2>&1 &
  daemon=$!
  for _ in $(seq 100); do [ -S "$dir/ry.sock" ] && break; sleep 0.1; done
  grep -m1 'devices' "$dir/railyardd.log" | head -1
  for n in 2 4; do
    echo "-- $n ranks on device 0"
    out=$(timeout 120 "$perf_bin" --daemons "$dir/ry.sock" --ranks-per-daemon "$n" \
      --device 0 -c 0 -b 8 -e 256M -f 2 -w 3 -n 20 2>&1) || fail "railyard-perf $n ranks"
    echo "$out"
    if [ "$n" = 2 ] && [ -n "$copy64" ]; then
      # The 64 MiB AllReduce must read both inputs and write both outputs: 2*M at the copy rate
      # (memcpy moves M bytes in M / (copy64 / 2) seconds: copy64 counts reads and writes).
      awk -v bw="$copy64" '$1 == 67108864 {
            bound_us = 2 * $1 / (bw / 2 * 1e9) * 1e6;
            printf "target: 64 MiB AllReduce, 2 ranks: %.1f us against the bound %.1f us (2*M / memcpy %.1f GB/s): %.2f of the bound %s\n",
                   $6, bound_us, bw / 2, bound_us / $6, (bound_us / $6 >= 0.7) ? "(met)" : "(NOT met)" }' <<<"$out"
    fi
  done
  kill "$daemon" 2>/dev/null
  wait "$daemon" 2>/dev/null
  keep railyardd-perf.log <"$dir/railyardd.log"
  rm -rf "$dir"
}

check_internode() {
  step "across two daemons on device 0: staged through host memory, pipelined or whole first"
  local out
  out=$(timeout 150 bench/device_internode.sh "$build" 3 1 64M 2>&1) || fail "device_internode"
  keep device-internode.log <<<"$out"
  sed -n '/^# 2 railyardd/,$p' <<<"$out"
}

check_nccl() {
  local dir a r out rc pids=()
  dir=$(mktemp -d /tmp/ry-devnccl-XXXXXX)
  step "NCCL programs on railyard's libnccl.so.2, device memory on a stream (logs: $dir)"
  for node in a b; do
    # Two virtual nodes on loopback, one rail on lo each (as tests/integration/virtual_nodes.py).
    printf '{"node": "node%s", "rails": [{"name": "rail0", "device": "lo"}]}\n' "$node" \
      >"$dir/$node.json"
    "$daemon_bin" --socket="$dir/$node.sock" --topology="$dir/$node.json" \
      --peer_listen=127.0.0.1:0 --peer_insecure --cuda_ipc --insecure_first_session_token \
      >"$dir/$node.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 100); do [ -S "$dir/a.sock" ] && [ -S "$dir/b.sock" ] && break; sleep 0.1; done
  for r in 0 1 2 3; do
    [ $r -lt 2 ] && a=$dir/a.sock || a=$dir/b.sock
    NCCL_TEST_RANK=$r NCCL_TEST_NRANKS=4 NCCL_TEST_DIR=$dir NCCL_TEST_PARTS=device \
      RAILYARD_SOCKET=$a RAILYARD_JOB=devnccl LD_LIBRARY_PATH=$nccl_dir:${LD_LIBRARY_PATH:-} \
      timeout 180 "$nccl_ranks_bin" >"$dir/rank$r.out" 2>&1 &
    pids+=($!)
  done
  rc=0
  for p in "${pids[@]:2}"; do wait "$p" || rc=1; done
  cat "$dir"/rank*.out
  [ $rc -eq 0 ] || fail "nccl device part"
  step "torch's ProcessGroupNCCL on railyard's libnccl.so.2 (LD_PRELOAD), DDP against gloo"
  out=$(LD_PRELOAD=$nccl_dir/libnccl.so.2 RAILYARD_SOCKET=$dir/a.sock RAILYARD_JOB=devtorch \
    timeout 300 "${PYTHON:-python3}" tests/nccl/torch_nccl_ddp.py --nproc 2 2>&1)
  rc=$?
  keep torch-nccl.log <<<"$out"
  tail -25 <<<"$out"
  # 3: this machine's torch has no CUDA (said above): not a failure of railyard.
  [ $rc -eq 0 ] || [ $rc -eq 3 ] || fail "torch ProcessGroupNCCL on railyard (exit $rc)"
  kill "${pids[0]}" "${pids[1]}" 2>/dev/null
  wait "${pids[0]}" "${pids[1]}" 2>/dev/null
  keep nccl-daemons.log < <(cat "$dir"/a.log "$dir"/b.log)
  rm -rf "$dir"
}

# The most telling checks first, so that a run cut short still reports them.
for s in "${steps[@]}"; do
  case $s in
    gtest | bench | perf | python | torch | internode | nccl) "check_$s" ;;
    *) fail "unknown step $s (gtest, bench, perf, python, torch, internode, nccl)" ;;
  esac
done

step "done in $((SECONDS - start)) s"
if [ ${#failures[@]} -gt 0 ]; then
  printf 'device-check: %d failed: %s\n' ${#failures[@]} "${failures[*]}"
  exit 1
fi
echo "device-check: all passed"
