# shellcheck shell=bash
# railyard_binaries BUILD_DIR [TARGET...]: sets daemon_bin, perf_bin, bench_bin, cuda_tests,
# unit_tests, nccl_dir (libnccl.so.2's folder), nccl_ranks_bin and pkg (the Python package) for scripts/device-check.sh and bench/device_*.sh, from
# the prebuilt bundle BUILD_DIR/bundle (scripts/device-bundle.sh) when there is one and this
# machine cannot build (no gRPC or UCX development files) or RAILYARD_PREBUILT=1, else by building
# TARGETs in BUILD_DIR with CUDA for sm_90. Source from the repository root; returns non-zero,
# saying why, when neither works. Uses step() when the caller defines it.
railyard_binaries() {
  local build=$1
  shift
  bundle=$build/bundle
  if [ -x "$bundle/bin/railyardd" ] &&
    { [ "${RAILYARD_PREBUILT:-0}" = 1 ] || ! pkg-config --exists grpc++ ucx 2>/dev/null; }; then
    echo "== prebuilt bundle ($bundle)"
    cat "$bundle/MANIFEST"
    local bin=$bundle/bin why
    export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export UCX_MODULE_DIR=$bundle/lib/ucx
    # The C++ runtime comes from this machine unless it is older than the one the bundle needs.
    if ! why=$("$bin/railyardd" --version 2>&1 >/dev/null) && grep -q 'GLIBCXX\|CXXABI' <<<"$why"; then
      echo "this machine's C++ runtime is too old for the bundle: using the bundle's (lib-cxx)"
      export LD_LIBRARY_PATH=$bundle/lib-cxx:$LD_LIBRARY_PATH
    fi
    if ! "$bin/railyardd" --version >/dev/null 2>&1; then
      "$bin/railyardd" --version 2>&1 | head -5
      echo "the bundle's railyardd does not start here"
      return 1
    fi
    pkg=$bundle/python
    daemon_bin=$bin/railyardd perf_bin=$bin/railyard-perf bench_bin=$bin/cuda-bench
    nccl_dir=$bundle/nccl nccl_ranks_bin=$bin/nccl-test-ranks
    cuda_tests=$bin unit_tests=$bin
    return 0
  fi
  bundle=
  echo "== build with CUDA (sm_90) in $build"
  if ! pkg-config --exists grpc++ ucx 2>/dev/null; then
    echo "gRPC or UCX development files are missing: running scripts/install-deps.sh"
    timeout 300 scripts/install-deps.sh >"$build.deps.log" 2>&1 ||
      { tail -20 "$build.deps.log"; echo "install-deps failed"; return 1; }
  fi
  if [ -f scripts/lib/ccache.sh ]; then . scripts/lib/ccache.sh; fi
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRAILYARD_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DRAILYARD_WERROR=OFF >"$build.cmake.log" 2>&1 ||
    { tail -30 "$build.cmake.log"; echo "cmake failed"; return 1; }
  timeout 420 ninja -C "$build" -j "$(nproc)" "$@" >"$build.ninja.log" 2>&1 ||
    { tail -40 "$build.ninja.log"; echo "build failed"; return 1; }
  pkg=$build/python
  daemon_bin=$build/daemon/railyardd perf_bin=$build/tools/railyard-perf
  bench_bin=$build/tools/cuda-bench/cuda-bench
  nccl_dir=$build/nccl nccl_ranks_bin=$build/tests/nccl/nccl-test-ranks
  cuda_tests=$build/tests/cuda unit_tests=$build/tests/unit
}
