#!/usr/bin/env bash
# Configures and builds Railyard into build/ (or $RAILYARD_BUILD_DIR). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/ccache.sh
build_dir=${RAILYARD_BUILD_DIR:-build}
jobs=${RAILYARD_JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DRAILYARD_WERROR=ON "$@" >/dev/null
ninja -C "$build_dir" -j "$jobs"
