#!/usr/bin/env bash
# Configures and builds Railyard into build/ (or $RAILYARD_BUILD_DIR). Extra arguments go to cmake.
#   RAILYARD_TARGETS="a b"  builds only those targets (and what they need), not everything: the
#                           demo builds the four it runs, not the suite's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/ccache.sh
build_dir=${RAILYARD_BUILD_DIR:-build}
jobs=${RAILYARD_JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DRAILYARD_WERROR=ON "$@" >/dev/null
# shellcheck disable=SC2086  # a list of target names
ninja -C "$build_dir" -j "$jobs" ${RAILYARD_TARGETS:-}
