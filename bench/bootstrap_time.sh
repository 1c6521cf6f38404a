#!/usr/bin/env bash
# Communicator bootstrap time with the peer plane on mutual TLS vs plaintext (--peer_insecure):
# NODES railyardd on loopback (1 rail on lo, 1 rank each), InitComm of a NODES-rank communicator
# timed by bench/bootstrap_time. Launches alternate TLS and insecure; each launch is fresh
# daemons, so its first bootstrap ("cold") includes connecting the peer channels (TLS
# handshakes); "warm" is the median of the next WARM bootstraps on the same daemons.
#   bench/bootstrap_time.sh [NODES=8] [LAUNCHES=3 per mode] [WARM=5]
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${1:-8}
launches=${2:-3}
warm=${3:-5}
build=${RAILYARD_BUILD_DIR:-build}
[ -x "$build/bench/bootstrap_time" ] || ninja -C "$build" bootstrap_time railyardd
out=$(mktemp -d /tmp/railyard-boot.XXXXXX)
pids=()
# shellcheck source=scripts/lib/daemons.sh
. scripts/lib/daemons.sh
trap 'stop_daemons; rm -rf "$out"' EXIT

names=()
for ((n = 0; n < nodes; n++)); do names+=("vnode$n"); done
scripts/peer-certs.sh "$out/certs" "${names[@]}"

# launch MODE RUN: NODES fresh daemons, one bootstrap_time run; appends "cold warm" to $out/MODE.
launch() {
  local mode=$1 run=$2 socks=() n
  for ((n = 0; n < nodes; n++)); do
    local dir="$out/$mode$run" security
    mkdir -p "$dir"
    echo "{\"node\": \"vnode$n\", \"rails\": [{\"device\": \"lo\"}]}" >"$dir/n$n.json"
    if [ "$mode" = tls ]; then
      security="--peer_tls_cert=$out/certs/vnode$n.pem --peer_tls_key=$out/certs/vnode$n-key.pem"
      security="$security --peer_tls_ca=$out/certs/ca.pem"
    else
      security=--peer_insecure
    fi
    # shellcheck disable=SC2086 # security is a list of flags
    "$build/daemon/railyardd" --socket="$dir/n$n.sock" --insecure_first_session_token \
      --peer_listen=127.0.0.1:0 $security --topology="$dir/n$n.json" --worker_threads=1 \
      >"$dir/n$n.log" 2>&1 &
    pids+=($!)
    socks+=("$dir/n$n.sock")
  done
  for s in "${socks[@]}"; do
    for _ in $(seq 200); do [ -S "$s" ] && break; sleep 0.05; done
    [ -S "$s" ] || { cat "$out/$mode$run"/*.log >&2; echo "a daemon did not start" >&2; exit 1; }
  done
  local joined
  joined=$(IFS=,; echo "${socks[*]}")
  "$build/bench/bootstrap_time" --daemons="$joined" --repeats=$((1 + warm)) >"$out/$mode$run.txt"
  stop_daemons
  local cold w
  cold=$(sed -n 's/^bootstrap 0 .* ms=//p' "$out/$mode$run.txt")
  w=$(sed -n '2,$s/^bootstrap .* ms=//p' "$out/$mode$run.txt" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  echo "$cold $w" >>"$out/$mode"
  echo "$mode launch $run: cold ${cold} ms, warm median ${w} ms (warm: $(sed -n '2,$s/^bootstrap .* ms=//p' "$out/$mode$run.txt" | tr '\n' ' '))"
}

for ((run = 1; run <= launches; run++)); do
  launch tls "$run"
  launch insecure "$run"
done

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "# $nodes daemons, $nodes ranks, $launches launches per mode (medians; all samples in ms)"
for mode in tls insecure; do
  printf '%-9s cold %8s ms [%s]  warm %8s ms [%s]\n' "$mode" \
    "$(cut -d' ' -f1 "$out/$mode" | median)" "$(cut -d' ' -f1 "$out/$mode" | tr '\n' ' ' | sed 's/ $//')" \
    "$(cut -d' ' -f2 "$out/$mode" | median)" "$(cut -d' ' -f2 "$out/$mode" | tr '\n' ' ' | sed 's/ $//')"
done
