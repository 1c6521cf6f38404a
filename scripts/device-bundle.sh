#!/usr/bin/env bash
# Builds what scripts/device-check.sh runs, with CUDA for sm_90, and packs it for a GPU machine
# that has a driver and Python but none of the C++ libraries Railyard links (gRPC, Abseil,
# protobuf, UCX, civetweb, OpenSSL) and no network to install them: the device machines lent here
# run a CUDA image of their own.
#
#   scripts/device-bundle.sh [BUILD_DIR]      default: build-gpu
#
# Leaves BUILD_DIR/bundle (stripped, ~40 MiB):
#   bin/       railyardd, railyard-perf, cuda-bench and the GPU test binaries
#   lib/       every shared library they load, except the C library, the C++ runtime and the
#              CUDA driver, which come from the machine they run on; lib/ucx holds UCX's modules
#   lib-cxx/   this machine's C++ runtime, used there only if the machine's own is older
#   python/    the Python client with its generated stubs
#   python-protobuf/  this machine's pure-Python protobuf runtime, used there only if the
#              machine's own protobuf cannot load the stubs generated here
# scripts/device-check.sh BUILD_DIR uses the bundle instead of building when it finds one and the
# machine cannot build (no gRPC or UCX development files).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "device-bundle: nvcc not found" >&2; exit 1; }
if [ -f scripts/lib/ccache.sh ]; then . scripts/lib/ccache.sh; fi

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRAILYARD_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DRAILYARD_WERROR=OFF >"$build.cmake.log" 2>&1 ||
  { tail -30 "$build.cmake.log"; exit 1; }
binaries=(daemon/railyardd tools/railyard-perf tools/cuda-bench/cuda-bench
  tests/cuda/cuda_device_test tests/cuda/cuda_daemon_test tests/unit/device_runtime_test
  tests/nccl/nccl-test-ranks)
targets=()
for b in "${binaries[@]}"; do targets+=("$(basename "$b")"); done
ninja -C "$build" -j "$(nproc)" "${targets[@]}" railyard_python railyard_nccl

out=$build/bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/ucx" "$out/lib-cxx"
for b in "${binaries[@]}"; do
  cp "$build/$b" "$out/bin/"
  strip --strip-unneeded "$out/bin/$(basename "$b")"
done
# libnccl.so.2 in a folder of its own: only what asks for it (LD_LIBRARY_PATH, LD_PRELOAD) loads
# it, never a torch that links NCCL.
mkdir -p "$out/nccl"
cp -P "$build"/nccl/libnccl.so* "$out/nccl/"
cp -r "$build/python" "$out/python"
find "$out/python" -name __pycache__ -prune -exec rm -rf {} +
pb=$(/usr/bin/python3 -c 'import google.protobuf, os; print(os.path.dirname(google.protobuf.__file__))' 2>/dev/null || true)
if [ -n "$pb" ]; then
  mkdir -p "$out/python-protobuf/google"
  cp -r "$pb" "$out/python-protobuf/google/"
  find "$out/python-protobuf" \( -name __pycache__ -o -name '*.so' \) -prune -exec rm -rf {} +
fi

# What the machine provides: glibc's libraries, the C++ runtime (kept aside in lib-cxx) and the
# driver. Everything else the binaries load travels.
provided='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libresolv|libcuda|libnvidia)[.-]'
cxx='^(libstdc\+\+|libgcc_s)[.]'
ldd "$out"/bin/* "$out"/nccl/libnccl.so.2 | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    if [[ $name =~ $provided ]]; then continue; fi
    if [[ $name =~ $cxx ]]; then cp -L "$path" "$out/lib-cxx/$name"; else cp -L "$path" "$out/lib/$name"; fi
  done
# UCX loads its transports as modules from the directory it was built with; device-check.sh
# points UCX_MODULE_DIR here.
ucs=$(ldd "$out/bin/railyardd" | awk '$1 ~ /^libucs[.]/ {print $3}')
if [ -n "$ucs" ] && [ -d "$(dirname "$ucs")/ucx" ]; then
  cp -L "$(dirname "$ucs")"/ucx/*.so* "$out/lib/ucx/" 2>/dev/null || true
fi
for f in "$out"/lib/*.so* "$out"/lib/ucx/*.so* "$out"/lib-cxx/*.so*; do
  [ -f "$f" ] && strip --strip-unneeded "$f" 2>/dev/null || true
done
{
  echo "built $(date -u +%FT%TZ) from $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')"
  echo "on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  nvcc --version | tail -2 | head -1
  echo "CUDA architectures: $(awk -F= '/^CMAKE_CUDA_ARCHITECTURES:/ {print $2}' "$build/CMakeCache.txt")"
} >"$out/MANIFEST"
cat "$out/MANIFEST"
du -sh "$out" "$out"/*
