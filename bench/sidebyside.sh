#!/usr/bin/env bash
# railyard vs OpenMPI, AllReduce float32 sum, out-of-place, in one run and one table (issue #13).
# Cases (railyard-perf through railyardd vs bench/mpi_allreduce.c under OpenMPI's ob1 PML):
#   1  one railyardd, 2 ranks          vs OpenMPI --mca btl vader,self, np 2 (shared memory)
#   2  one railyardd, 4 ranks          vs OpenMPI --mca btl vader,self, np 4
#   3  2 railyardd x 1 rank, UCX tcp on lo (peer plane mutual TLS on 127.0.0.1)
#                                      vs OpenMPI --mca btl tcp,self on lo, np 2, and vs
#                                      OpenMPI --mca pml ucx over UCX_TLS=tcp (railyard's transport);
#                                      and the floor of that transport: build/tools/ucx-pingpong's
#                                      --exchange (two processes send each other the size at once
#                                      over railyardd's UcxTransport, nothing else: the traffic any
#                                      two-node AllReduce needs), best of 1, 2, 4 and 8 messages
#   4  2 railyardd x 1 rank in two network namespaces joined by an unshaped veth pair (one
#      daemon and one OpenMPI rank per namespace, data over the veth; peer plane mutual TLS on
#      the veth addresses) vs OpenMPI --mca btl tcp,self on the veth subnet, np 2 across the
#      same namespaces. Needs root and `ip netns`; skipped with the reason otherwise.
# Launches interleave: for each repetition, each case launches railyard then OpenMPI (fresh
# daemons / fresh mpirun every launch). Each launch is three sweeps: 8 B (-n 5000), 128 KiB and
# 512 KiB (-n 500), 2 MiB to 32 MiB (-n 40). A cell is the ratio of the medians over the launches.
#   bench/sidebyside.sh [REPS=3]
# Environment: RAILYARD_BUILD_DIR (default build); CASES (default "1 2 3 4"); RAILYARD_* is
# passed through to railyard-perf's ranks (the clients) untouched; MPIRUN (default
# mpirun.openmpi), MPICC (default mpicc.openmpi); OMPI_YIELD (default unset: OpenMPI's own choice, which busy-polls unless oversubscribed): OpenMPI's
# mpi_yield_when_idle. Its ranks busy-poll by default, and on a host whose cores other work
# shares (2 cores, load 4-7 where this was written) a spinning rank whose peer is descheduled
# turns a 0.3 us 8 B AllReduce into milliseconds in some launches and not others (seen: 0.3 ->
# 2200 us, 512 KiB 0.1 -> 8.8 ms); yielding while idle keeps its medians stable, at about 1-3 us
# of 8 B latency. OMPI_YIELD=0 gives OpenMPI's own default. Other OMPI_MCA_* reach mpirun as usual.
# VETH_TCP_CC (default unset: the host's default, net.ipv4.tcp_congestion_control): the TCP
# congestion control of case 4's two namespaces, for both tools (one of
# net.ipv4.tcp_allowed_congestion_control). On a host defaulting to bbr, BBR's bandwidth estimate
# over the veth's microsecond RTT swings with scheduling noise (docs/data-plane.md, "BBR on a
# microsecond path"); reno or cubic show what the transport does without it.
# PIN_DAEMONS=1 (default unset: the scheduler's choice): cases 3 and 4 pin each railyardd to a
# CPU of its own (--cpus: daemon n on CPU n mod nproc), as two hosts would not share cores; the
# ranks and OpenMPI stay unpinned. Over the veth under BBR, pinned daemons kept railyard's
# 512 KiB out of BBR's slow mode in every launch measured (docs/data-plane.md, "BBR's slow
# mode, and what is not its cause").
# VETH_RPS (default unset: none): an RPS CPU mask (hex, e.g. 3) for both veth ends' receive
# queue. Without RPS a veth delivers each packet on the CPU that sent it, so a connection whose
# segments leave from two CPUs can arrive out of order; with it, each flow is received on one
# CPU. Case 4 prints, per launch, what TCP did in namespace A (segments retransmitted,
# reorderings seen, segments queued out of order) either way.
# Not a test: numbers depend on the machine and its load (medians of interleaved launches).
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
cases=${CASES:-1 2 3 4}
build=${RAILYARD_BUILD_DIR:-build}
mpirun=${MPIRUN:-mpirun.openmpi}
mpicc=${MPICC:-mpicc.openmpi}
# OpenMPI's temporary reduction buffers stay faulted in: no mmap for large mallocs, no trimming.
tunables="glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"
yield=${OMPI_YIELD:-}
veth_cc=${VETH_TCP_CC:-}
veth_rps=${VETH_RPS:-}
pin_daemons=${PIN_DAEMONS:-}
if [ -n "$veth_rps" ] && ! [[ $veth_rps =~ ^[0-9a-fA-F,]+$ ]]; then
  echo "sidebyside: VETH_RPS must be a hex CPU mask such as 3, not '$veth_rps'" >&2
  exit 2
fi
if [ ! -x "$build/daemon/railyardd" ] || [ ! -x "$build/tools/railyard-perf" ] ||
  [ ! -x "$build/tools/ucx-pingpong/ucx-pingpong" ]; then scripts/build.sh; fi
daemon_bin=$build/daemon/railyardd
perf_bin=$build/tools/railyard-perf
pingpong_bin=$build/tools/ucx-pingpong/ucx-pingpong
out=$(mktemp -d /tmp/railyard-sidebyside.XXXXXX)
chmod 755 "$out"  # ranks in other namespaces run as root too, but keep the dir traversable
pids=()
ns_a="" ns_b=""
# shellcheck source=scripts/lib/daemons.sh
. scripts/lib/daemons.sh
cleanup() {
  stop_daemons
  [ -n "$ns_a" ] && ip netns del "$ns_a" 2>/dev/null
  [ -n "$ns_b" ] && ip netns del "$ns_b" 2>/dev/null
  rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$mpicc" -O2 -o "$out/ar_openmpi" bench/mpi_allreduce.c

# Sweeps: name, then railyard-perf and mpi_allreduce arguments (min max factor iters warmup).
sweeps=(lat mid big)
sweep_args() {  # name -> "min max factor iters warmup"
  case $1 in
    lat) echo "8 8 2 5000 500" ;;
    mid) echo "128K 512K 4 500 50" ;;
    big) echo "2M 32M 4 40 5" ;;
  esac
}

# ---- case 4's namespaces (made once; skipped with a reason when impossible) ----
veth_net=10.253.77
skip4=""
setup_netns() {
  if [ "$(id -u)" != 0 ]; then skip4="not root (ip netns needs CAP_SYS_ADMIN)"; return; fi
  command -v ip >/dev/null || { skip4="no ip command (iproute2)"; return; }
  local a=sbsA$$ b=sbsB$$
  if ! ip netns add "$a" 2>"$out/netns.err"; then
    skip4="ip netns add failed: $(head -1 "$out/netns.err")"
    return
  fi
  ns_a=$a
  ip netns add "$b" && ns_b=$b
  ip link add "va$$" netns "$ns_a" type veth peer name "vb$$" netns "$ns_b" 2>"$out/netns.err" ||
    { skip4="cannot make a veth pair: $(head -1 "$out/netns.err")"; return; }
  ip -n "$ns_a" addr add "$veth_net.1/24" dev "va$$"
  ip -n "$ns_b" addr add "$veth_net.2/24" dev "vb$$"
  for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
  if [ -n "$veth_cc" ]; then
    for ns in "$ns_a" "$ns_b"; do
      ip netns exec "$ns" sysctl -qw "net.ipv4.tcp_congestion_control=$veth_cc" 2>"$out/netns.err" ||
        { skip4="VETH_TCP_CC=$veth_cc refused: $(head -1 "$out/netns.err")"; return; }
    done
  fi
  if [ -n "$veth_rps" ]; then
    if ! { ip netns exec "$ns_a" sh -c "echo $veth_rps >/sys/class/net/va$$/queues/rx-0/rps_cpus" &&
      ip netns exec "$ns_b" sh -c "echo $veth_rps >/sys/class/net/vb$$/queues/rx-0/rps_cpus"; } 2>"$out/netns.err"; then
      skip4="VETH_RPS=$veth_rps refused: $(head -1 "$out/netns.err")"
      return
    fi
  fi
  ip -n "$ns_a" link set "va$$" up
  ip -n "$ns_b" link set "vb$$" up
  # UCX offers only devices that are up with a carrier.
  for _ in $(seq 300); do
    ip -n "$ns_a" link show dev "va$$" | grep -q 'state UP' &&
      ip -n "$ns_b" link show dev "vb$$" | grep -q 'state UP' && return
    sleep 0.01
  done
  skip4="the veth pair did not come up"
}
[[ " $cases " == *" 4 "* ]] && setup_netns

scripts/peer-certs.sh "$out/certs" vnode0 vnode1 "nsnode0=$veth_net.1" "nsnode1=$veth_net.2"
tls() {  # node -> mutual TLS flags
  echo "--peer_tls_cert=$out/certs/$1.pem --peer_tls_key=$out/certs/$1-key.pem --peer_tls_ca=$out/certs/ca.pem"
}

wait_sockets() {
  for s in "$@"; do
    for _ in $(seq 300); do [ -S "$s" ] && break; sleep 0.05; done
    [ -S "$s" ] || { cat "$out"/*.log >&2; echo "sidebyside: a railyardd did not start ($s)" >&2; exit 1; }
  done
}

# start_daemons CASE: fresh railyardd for the case; sets $daemons and $rpd.
start_daemons() {
  local c=$1 socks=() n
  rm -f "$out"/d*.sock
  case $c in
    1 | 2)
      "$daemon_bin" --socket="$out/d0.sock" --insecure_first_session_token >"$out/d0.log" 2>&1 &
      pids+=($!)
      socks=("$out/d0.sock")
      rpd=$((c == 1 ? 2 : 4))
      ;;
    3 | 4)
      for n in 0 1; do
        local ns=() pin=() node=vnode$n dev=lo listen=127.0.0.1:0
        [ -n "$pin_daemons" ] && pin=(--cpus=$((n % $(nproc))))
        if [ "$c" = 4 ]; then
          node=nsnode$n listen=$veth_net.$((n + 1)):0
          if [ "$n" = 0 ]; then ns=(ip netns exec "$ns_a") dev=va$$; else ns=(ip netns exec "$ns_b") dev=vb$$; fi
        fi
        echo "{\"node\": \"$node\", \"rails\": [{\"name\": \"rail0\", \"device\": \"$dev\"}]}" >"$out/d$n.json"
        # shellcheck disable=SC2046 # tls prints a list of flags
        "${ns[@]}" "$daemon_bin" "${pin[@]}" --socket="$out/d$n.sock" --insecure_first_session_token \
          --peer_listen="$listen" $(tls "$node") --topology="$out/d$n.json" >"$out/d$n.log" 2>&1 &
        pids+=($!)
        socks+=("$out/d$n.sock")
      done
      rpd=1
      ;;
  esac
  wait_sockets "${socks[@]}"
  daemons=$(IFS=,; echo "${socks[*]}")
}

# The ranks of railyard-perf run in this (root) namespace in every case: they reach their daemon
# over its Unix socket and shared memory, which namespaces do not separate; what crosses the
# veth in case 4 is daemon-to-daemon traffic (peer plane and UCX), as between two hosts.
run_railyard() {  # case file
  local c=$1 f=$2 s
  start_daemons "$c"
  : >"$f"
  for s in "${sweeps[@]}"; do
    read -r lo hi fac it wu <<<"$(sweep_args "$s")"
    timeout 300 "$perf_bin" --op allreduce -b "$lo" -e "$hi" -f "$fac" -n "$it" -w "$wu" -c 0 \
      --daemons "$daemons" --ranks-per-daemon "$rpd" >>"$f" 2>"$out/perf.err" ||
      { cat "$out/perf.err" "$out"/d*.log >&2; echo "sidebyside: railyard-perf failed (case $c)" >&2; exit 1; }
  done
  # The communicator's coordinator is the first daemon's peer address: proof of the path taken.
  local want=""
  [ "$c" = 3 ] && want="@127.0.0.1:"
  [ "$c" = 4 ] && want="@$veth_net.1:"
  if [ -n "$want" ] && ! grep -q "$want" "$f"; then
    echo "sidebyside: case $c's communicator is not coordinated at $want:" >&2
    grep '# *Comm' "$f" >&2
    exit 1
  fi
  stop_daemons
}

# The transport's floor (case 3): each size exchanged both ways, medians over 100 exchanges,
# the best of 1, 2, 4 and 8 messages per exchange (a schedule may cut the traffic into pieces,
# so the fastest cut is the floor; 2 was often best at 512 KiB-2 MiB); the rail polls 200 us
# after traffic as a session's ring thread polls the rails (--poll_us) while an operation is in
# flight.
run_floor() {  # file
  local f=$1 p
  : >"$f.raw"
  for p in 1 2 4 8; do
    timeout 300 "$pingpong_bin" --iters=200 --bw_bytes=1048576 --bw_iters=1 --busy_poll=200us \
      --exchange=8,128K,512K,2M,8M,32M --exchange_iters=100 --exchange_pieces=$p \
      >>"$f.raw" 2>"$out/floor.err" ||
      { cat "$out/floor.err" >&2; echo "sidebyside: ucx-pingpong failed" >&2; exit 1; }
  done
  # "exchange BYTES B each way in P message(s): median US us ..." -> the lower median per size
  awk '$1 == "exchange" { if (!($2 in best) || $10 < best[$2]) best[$2] = $10 }
       END { for (b in best) print b, best[b] }' "$f.raw" | sort -n >"$f"
}

ompi_common=(--allow-run-as-root --oversubscribe --bind-to none -x "GLIBC_TUNABLES=$tunables"
  ${yield:+--mca mpi_yield_when_idle "$yield"})
# OpenMPI over UCX's tcp transport, the one railyardd's rails use, with the segment sizes
# railyardd sets (transport::SetUcxTcpDefaults): pml_ucx_tls/devices "any" let the UCX PML run
# without an RDMA device; UCX_NET_DEVICES is each rank's own (per namespace in case 4).
# shellcheck disable=SC2054 # the comma is UCX_TLS's list
ucx_vars=(UCX_TLS=tcp,self UCX_TCP_RX_SEG_SIZE=512K UCX_TCP_TX_SEG_SIZE=512K)
ucx_pml=(--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any --mca btl self)
for v in "${ucx_vars[@]}"; do ucx_pml+=(-x "$v"); done
run_openmpi() {  # case file [pml: ob1 (default) or ucx]
  local c=$1 f=$2 pml=${3:-ob1} s
  : >"$f"
  for s in "${sweeps[@]}"; do
    read -r lo hi fac it wu <<<"$(sweep_args "$s")"
    local args=("$lo" "$hi" "$fac" "$it" "$wu")
    local ok=0
    case $c$pml in
      1ob1 | 2ob1)
        GLIBC_TUNABLES=$tunables timeout 300 "$mpirun" "${ompi_common[@]}" --mca pml ob1 \
          --mca btl vader,self -np $((c == 1 ? 2 : 4)) "$out/ar_openmpi" "${args[@]}" \
          >>"$f" 2>"$out/mpi.err" || ok=$?
        ;;
      3ob1)
        GLIBC_TUNABLES=$tunables timeout 300 "$mpirun" "${ompi_common[@]}" --mca pml ob1 \
          --mca btl tcp,self --mca btl_tcp_if_include lo -np 2 "$out/ar_openmpi" "${args[@]}" \
          >>"$f" 2>"$out/mpi.err" || ok=$?
        ;;
      3ucx)
        GLIBC_TUNABLES=$tunables timeout 300 "$mpirun" "${ompi_common[@]}" "${ucx_pml[@]}" \
          -x UCX_NET_DEVICES=lo -np 2 "$out/ar_openmpi" "${args[@]}" >>"$f" 2>"$out/mpi.err" || ok=$?
        ;;
      4ob1 | 4ucx)
        # mpirun runs in namespace A with rank 0; rank 1 is exec'd into namespace B. The ranks
        # reach mpirun's PMIx server over TCP, by default on 127.0.0.1 -- rank 1's loopback is
        # another namespace's, so the server listens on the veth (remote connections) instead.
        # Only start-up and MPI_Finalize use that channel; MPI traffic is tcp on the veth.
        # shellcheck disable=SC2054 # a list of BTLs
        local via=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$veth_net.0/24")
        local dev_a=() dev_b=()
        if [ "$pml" = ucx ]; then
          via=("${ucx_pml[@]}")
          # Set on each rank's own command line too: the -x copies did not reach the rank that
          # `ip netns exec` starts (UCX aborted on a 512K segment its 64K receive side refused).
          dev_a=(env "${ucx_vars[@]}" "UCX_NET_DEVICES=va$$")
          dev_b=(env "${ucx_vars[@]}" "UCX_NET_DEVICES=vb$$")
        fi
        ip netns exec "$ns_a" env GLIBC_TUNABLES="$tunables" PMIX_MCA_ptl_tcp_remote_connections=1 \
          PMIX_MCA_ptl_tcp_if_include="$veth_net.0/24" timeout 300 "$mpirun" "${ompi_common[@]}" \
          "${via[@]}" -np 1 "${dev_a[@]}" "$out/ar_openmpi" "${args[@]}" : \
          -np 1 ip netns exec "$ns_b" "${dev_b[@]}" "$out/ar_openmpi" "${args[@]}" \
          >>"$f" 2>"$out/mpi.err" || ok=$?
        ;;
    esac
    [ "$ok" = 0 ] || { cat "$out/mpi.err" >&2; echo "sidebyside: OpenMPI ($pml) failed (case $c, rc $ok)" >&2; exit 1; }
  done
}

# TCP's counters in a namespace: segments retransmitted, reorderings detected by SACK, segments
# queued out of order (/proc/net/snmp and /proc/net/netstat: a header line, then a values line).
tcp_counters() {  # namespace
  # shellcheck disable=SC2016 # awk's own $fields
  ip netns exec "$1" awk '
    $1 == "Tcp:" || $1 == "TcpExt:" {
      if (!($1 in head)) { head[$1] = $0; next }
      n = split(head[$1], h)
      for (i = 2; i <= n; i++) v[$1 h[i]] = $i
    }
    END { print v["Tcp:RetransSegs"] + 0, v["TcpExt:TCPSACKReorder"] + 0, v["TcpExt:TCPOFOQueue"] + 0 }
  ' /proc/net/snmp /proc/net/netstat
}
# counted LABEL COMMAND...: runs the command; in case 4 also prints what TCP did meanwhile.
counted() {
  local label=$1 b1 b2 b3 a1 a2 a3
  shift
  if [ "$c" != 4 ]; then "$@"; return; fi
  read -r b1 b2 b3 <<<"$(tcp_counters "$ns_a")"
  "$@"
  read -r a1 a2 a3 <<<"$(tcp_counters "$ns_a")"
  echo "# case 4 launch $r $label, TCP in namespace A: $((a1 - b1)) segments retransmitted, $((a2 - b2)) reorderings detected, $((a3 - b3)) segments queued out of order"
}

echo "# railyard vs OpenMPI $("$mpirun" --version 2>/dev/null | head -1 | awk '{print $NF}'): AllReduce float32 sum, out-of-place; $reps interleaved launches per tool and case, medians"
echo "# host $(hostname), $(nproc) CPUs, $(uname -r); railyard $(git describe --always --dirty 2>/dev/null) ($build)"
ry_env=$(env | grep '^RAILYARD_' | grep -v '^RAILYARD_BUILD_DIR=' | sort | tr '\n' ' ' || true)
echo "# railyard env (passed to railyard-perf's ranks): ${ry_env:-(none)}"
echo "# OpenMPI: pml ob1, --bind-to none, mpi_yield_when_idle ${yield:-"OpenMPI's default (yields when oversubscribed)"}, GLIBC_TUNABLES=$tunables (its temporary buffers stay faulted in)"
echo "# cases 3 and 4 also launch OpenMPI over UCX's tcp transport (pml ucx, UCX_TLS=tcp,self, 512K tcp segments), the transport railyardd's rails use"
echo "# TCP congestion control: $(sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null || echo unknown) (host default); case 4's namespaces: ${veth_cc:-the same}; case 4's veth RPS mask: ${veth_rps:-none}"
pinned="the scheduler's choice"
[ -n "$pin_daemons" ] && pinned="one each (--cpus: daemon n on CPU n mod $(nproc))"
echo "# railyardd CPUs in cases 3 and 4: $pinned"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# sweeps per launch: 8 B -n 5000 -w 500; 128K, 512K -n 500 -w 50; 2M..32M -n 40 -w 5 (railyard-perf -c 0)"
start=$(date +%s)
for ((r = 1; r <= reps; r++)); do
  for c in $cases; do
    if [ "$c" = 4 ] && [ -n "$skip4" ]; then continue; fi
    counted railyard run_railyard "$c" "$out/c$c-ry-$r.txt"
    counted "OpenMPI btl tcp" run_openmpi "$c" "$out/c$c-om-$r.txt"
    if [ "$c" = 3 ] || [ "$c" = 4 ]; then counted "OpenMPI pml ucx" run_openmpi "$c" "$out/c$c-ux-$r.txt" ucx; fi
    if [ "$c" = 3 ]; then run_floor "$out/c$c-fl-$r.txt"; fi
    echo "# launch $r case $c done ($(($(date +%s) - start)) s)"
  done
done

# shellcheck disable=SC2086 # cases is a list
/usr/bin/python3 - "$out" "$reps" "$skip4" $cases <<'PY'
import statistics, sys
sys.path.insert(0, "bench")
import perf_rows
out, reps, skip4, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
names = {
    "1": "1 daemon, 2 ranks vs vader np2",
    "2": "1 daemon, 4 ranks vs vader np4",
    "3": "2 daemons x 1 rank, tcp on lo vs btl tcp np2",
    "4": "2 daemons x 1 rank, netns + veth vs btl tcp np2",
}
load = perf_rows.time_per_op
sizes = [8, 128 << 10, 512 << 10, 2 << 20, 8 << 20, 32 << 20]
us = lambda t: f"{t:.2f}" if t < 10 else f"{t:.1f}"
def samples(c, tool):
    return [load(f"{out}/c{c}-{tool}-{r}.txt", tool == "ry") for r in range(1, reps + 1)]
print()
print("# each launch, time per op in us (railyard | OpenMPI) at 8 B, 128K, 512K, 2M, 8M, 32M:")
for c in cases:
    if c == "4" and skip4:
        continue
    ux = samples(c, "ux") if c in ("3", "4") else [None] * reps
    fl = samples(c, "fl") if c == "3" else [None] * reps
    for r, (ry, om, u, x) in enumerate(zip(samples(c, "ry"), samples(c, "om"), ux, fl), 1):
        print(f"#   case {c} launch {r}: " + " ".join(us(ry[s]) for s in sizes) + " | "
              + " ".join(us(om[s]) for s in sizes)
              + ("" if u is None else " | over UCX: " + " ".join(us(u[s]) for s in sizes))
              + ("" if x is None else " | floor: " + " ".join(us(x[s]) for s in sizes)))
print()
print("| case | 8 B railyard / OpenMPI (µs) | 128 KiB busbw ratio | 512 KiB | 2 MiB | 8 MiB | 32 MiB |")
print("|---|---|---|---|---|---|---|")
for c in cases:
    if c == "4" and skip4:
        print(f"| {names[c]} | skipped: {skip4} | | | | | |")
        continue
    ry, om = samples(c, "ry"), samples(c, "om")
    med = lambda runs, s: statistics.median(run[s] for run in runs)
    # Same bytes and ranks on both sides, so the busbw ratio is OpenMPI's time / railyard's.
    cells = [f"{us(med(ry, 8))} / {us(med(om, 8))}"]
    cells += [f"{med(om, s) / med(ry, s):.2f}" for s in sizes[1:]]
    print(f"| {names[c]} | " + " | ".join(cells) + " |")
    if c in ("3", "4"):
        # The same railyard launches against OpenMPI on railyard's own transport (UCX tcp).
        ux = samples(c, "ux")
        cells = [f"{us(med(ry, 8))} / {us(med(ux, 8))}"]
        cells += [f"{med(ux, s) / med(ry, s):.2f}" for s in sizes[1:]]
        print(f"| {names[c].replace('btl tcp', 'pml ucx (UCX tcp)')} | " + " | ".join(cells) + " |")
        cells = ["(OpenMPI: ucx / ob1)"]
        cells += [f"{med(om, s) / med(ux, s):.2f}" for s in sizes[1:]]
        print("| same, OpenMPI over UCX tcp against its own btl tcp | " + " | ".join(cells) + " |")
    if c == "3":
        # The traffic alone on railyardd's transport: a ratio below 1 is a size at which no
        # AllReduce through that transport can match OpenMPI's whole operation.
        fl = samples(c, "fl")
        cells = [f"{us(med(fl, 8))} / {us(med(om, 8))}"]
        cells += [f"{med(om, s) / med(fl, s):.2f}" for s in sizes[1:]]
        print("| floor: UCX exchange alone (ucx-pingpong) vs btl tcp np2 | " + " | ".join(cells) + " |")
        cells = [f"{us(med(ry, 8))} / {us(med(fl, 8))}"]
        cells += [f"{med(fl, s) / med(ry, s):.2f}" for s in sizes[1:]]
        print("| railyard vs that floor (1.0: all of the transport's speed) | " + " | ".join(cells) + " |")
print()
print("busbw ratio = railyard / OpenMPI (>1: railyard faster), from the median times of the launches.")
print("The pml ucx rows compare with OpenMPI on the transport railyardd's rails use (UCX tcp); the last")
print("row of a case is what that transport itself reaches against OpenMPI's own tcp BTL.")
if "3" in cases:
    print("floor (case 3): the size sent both ways at once over railyardd's UcxTransport and nothing")
    print("else (no client, no reduction); its ratio is OpenMPI's whole AllReduce time / the exchange's.")
PY
echo "# total $(($(date +%s) - start)) s; load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
