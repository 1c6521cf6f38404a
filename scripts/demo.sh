#!/usr/bin/env bash
# The main job on the embedded default: installs what is missing, builds, starts railyardd on a
# private Unix socket (a virtual node on this machine), runs an nccl-tests-style AllReduce sweep
# with 4 rank processes, shows the daemon's status, and stops the daemon.
#   DEMO_MAX=64M DEMO_RANKS=4 DEMO_OP=allreduce scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh

build=${RAILYARD_BUILD_DIR:-build}
max=${DEMO_MAX:-64M}
ranks=${DEMO_RANKS:-4}
op=${DEMO_OP:-allreduce}
dir=$(mktemp -d /tmp/railyard-demo.XXXXXX)
sock="$dir/railyard.sock"
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid"
    for _ in $(seq 50); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

"$build/daemon/railyardd" --socket="$sock" --node_name=demo-node-0 >"$dir/railyardd.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "demo: railyardd did not start:"; cat "$dir/railyardd.log"; exit 1; }
echo "demo: railyardd (pid $daemon_pid) serving $sock"
echo

"$build/tools/railyard-perf" --op "$op" -b 8 -e "$max" -f 4 -n 20 -w 5 -c 1 \
  --daemons "$sock" --ranks-per-daemon "$ranks"
echo
"$build/tools/railctl" status --socket "$sock"
echo
kill -TERM "$daemon_pid"
wait "$daemon_pid"
daemon_pid=""
echo "demo: daemon log:"
sed 's/^/  /' "$dir/railyardd.log"
