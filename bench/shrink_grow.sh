#!/usr/bin/env bash
# Shrink and grow time at 2-16 railyardd on loopback (bench/shrink_grow.py; issue 58):
#   bench/shrink_grow.sh [NODES=2,4,8,16] [ROUNDS=5]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${RAILYARD_BUILD_DIR:-build}
[ -x "$build/daemon/railyardd" ] || ninja -C "$build" railyardd railyard_python
exec /usr/bin/python3 bench/shrink_grow.py --nodes "${1:-2,4,8,16}" --rounds "${2:-5}" --build "$build"
