#!/usr/bin/env bash
# The pause an on_failure="shrink" communicator's survivors see when a rank or a node dies
# (bench/auto_shrink.py; issue 58):   bench/auto_shrink.sh [NODES=4] [RANKS=2] [ROUNDS=6]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${RAILYARD_BUILD_DIR:-build}
[ -x "$build/daemon/railyardd" ] || ninja -C "$build" railyardd railyard_python
exec /usr/bin/python3 bench/auto_shrink.py --nodes "${1:-4}" --ranks "${2:-2}" --rounds "${3:-6}" \
  --build "$build"
