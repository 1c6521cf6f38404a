#!/usr/bin/env bash
# Inter-node AllReduce bandwidth (float32 sum): railyard, 2 railyardd x 1 rank (UCX tcp), vs
# OpenMPI np2 over its tcp BTL (MPI_Allreduce, bench/mpi_allreduce.c), on loopback and between
# two network namespaces joined by an unshaped veth pair (one daemon and one OpenMPI rank per
# namespace). Launches are interleaved: each trial runs railyard then OpenMPI, fresh processes
# every time. Prints every sample and, per size, the median busbw of each and the ratio.
#   bench/internode_bw.sh [TRIALS=3] [WHERE=both|lo|veth]
# Environment:
#   MINBYTES (256K), MAXBYTES (32M), FACTOR (2), ITERS (20), WARMUP (5): the sweep.
#   RY_FLAGS, RY_ENV: extra railyardd flags (e.g. "--chunk_bytes=1048576") and environment
#     (e.g. "UCX_TCP_SNDBUF=4M"); RY_FLAGS_B, RY_ENV_B: when either is set, a second railyard
#     configuration measured in the same trials ("ry_b"), for A/B comparisons.
#   PERF_FLAGS, PERF_FLAGS_B: extra railyard-perf flags for ry and ry_b (setting PERF_FLAGS_B
#     also turns ry_b on). E.g. device buffers without a GPU, staged across nodes:
#     RY_FLAGS=--fake_gpus=1 RY_FLAGS_B=--fake_gpus=1 PERF_FLAGS_B="--device 0 --fake_device"
#     TESTING=1 (the test builds, which alone serve those flags)
#   TESTING=1: run railyardd-testing and railyard-perf-testing (build/tests/support/) instead of
#     the installed binaries.
#   MPI=0: leave OpenMPI out.
# Needs root for the namespaces (ip netns); they, the veth pair and every process started here are
# removed on exit. OpenMPI across namespaces: mpirun runs in the first namespace and the second
# rank is started through `ip netns exec`, so that rank reaches mpirun's PMIx server over the
# veth (PMIX_MCA_ptl_tcp_if_include, remote connections allowed); the BTL is pinned to the veth.
# OpenMPI gets GLIBC_TUNABLES that keep its large buffers out of mmap/munmap churn (fair at large
# sizes: railyard-perf allocates its buffers once too).
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-3}
where=${2:-both}
minb=${MINBYTES:-256K}
maxb=${MAXBYTES:-32M}
factor=${FACTOR:-2}
iters=${ITERS:-20}
warmup=${WARMUP:-5}
mpi=${MPI:-1}
build=${RAILYARD_BUILD_DIR:-build}
[ -x "$build/tools/railyard-perf" ] || scripts/build.sh
daemon_bin=$build/daemon/railyardd perf_bin=$build/tools/railyard-perf
if [ "${TESTING:-0}" = 1 ]; then
  daemon_bin=$build/tests/support/railyardd-testing perf_bin=$build/tests/support/railyard-perf-testing
fi
read -r -a ry_flags <<<"${RY_FLAGS:-}"
read -r -a ry_flags_b <<<"${RY_FLAGS_B:-}"
# shellcheck disable=SC2034  # read through the nameref in run_railyard
read -r -a perf_flags <<<"${PERF_FLAGS:-}"
# shellcheck disable=SC2034
read -r -a perf_flags_b <<<"${PERF_FLAGS_B:-}"
# shellcheck disable=SC2034  # read through the nameref in run_railyard
read -r -a ry_env <<<"${RY_ENV:-}"
# shellcheck disable=SC2034
read -r -a ry_env_b <<<"${RY_ENV_B:-}"
ab=0
[ -n "${RY_FLAGS_B+x}${RY_ENV_B+x}${PERF_FLAGS_B+x}" ] && ab=1

out=$(mktemp -d /tmp/railyard-internode.XXXXXX)
ns=(ry-bw-a-$$ ry-bw-b-$$)
veth=(rybwa$$ rybwb$$)
addr=(10.252.0.1 10.252.0.2)
pids=()
netns_up=0
# shellcheck source=scripts/lib/daemons.sh
. scripts/lib/daemons.sh
cleanup() {
  stop_daemons
  if [ "$netns_up" = 1 ]; then
    ip netns del "${ns[0]}" 2>/dev/null || true
    ip netns del "${ns[1]}" 2>/dev/null || true
  fi
  rm -rf "$out"
}
trap cleanup EXIT

mpicc.openmpi -O2 -o "$out/ar_openmpi" bench/mpi_allreduce.c

setup_netns() {
  ip netns add "${ns[0]}"
  ip netns add "${ns[1]}"
  netns_up=1
  ip link add "${veth[0]}" type veth peer name "${veth[1]}"
  for i in 0 1; do
    ip link set "${veth[i]}" netns "${ns[i]}"
    ip -n "${ns[i]}" addr add "${addr[i]}/24" dev "${veth[i]}"
    ip -n "${ns[i]}" link set "${veth[i]}" up
    ip -n "${ns[i]}" link set lo up
  done
}

# run_railyard LABEL WHERE TRIAL ENV_ARRAY_NAME PERF_FLAGS_ARRAY_NAME [daemon flags...]
run_railyard() {
  local label=$1 w=$2 t=$3 socks=() flags=("${@:6}")
  local -n envs=$4
  local -n pflags=$5
  for n in 0 1; do
    local device=lo listen=127.0.0.1:0 prefix=()
    if [ "$w" = veth ]; then
      device=${veth[n]}
      listen=${addr[n]}:0
      prefix=(ip netns exec "${ns[n]}")
    fi
    echo "{\"node\": \"vnode$n\", \"rails\": [{\"name\": \"rail0\", \"device\": \"$device\"}]}" \
      >"$out/n$n.json"
    rm -f "$out/n$n.sock"
    "${prefix[@]}" env "${envs[@]}" "$daemon_bin" --socket="$out/n$n.sock" \
      --insecure_first_session_token --peer_insecure --node_name="vnode$n" \
      --peer_listen="$listen" --topology="$out/n$n.json" "${flags[@]}" >"$out/n$n.log" 2>&1 &
    pids+=($!)
    socks+=("$out/n$n.sock")
  done
  for s in "${socks[@]}"; do for _ in $(seq 200); do [ -S "$s" ] && break; sleep 0.05; done; done
  "$perf_bin" --op allreduce -b "$minb" -e "$maxb" -f "$factor" -n "$iters" \
    -w "$warmup" -c 0 --daemons "${socks[0]},${socks[1]}" --ranks-per-daemon 1 "${pflags[@]}" \
    >"$out/$label-$w-$t.txt"
  stop_daemons
}

run_openmpi() {  # WHERE TRIAL
  local w=$1 t=$2 args=("$minb" "$maxb" "$factor" "$iters" "$warmup")
  local tun=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296
  if [ "$w" = lo ]; then
    GLIBC_TUNABLES=$tun mpirun.openmpi --allow-run-as-root -np 2 -x GLIBC_TUNABLES \
      --mca btl tcp,self --mca btl_tcp_if_include lo "$out/ar_openmpi" "${args[@]}" \
      >"$out/ompi-$w-$t.txt"
  else
    GLIBC_TUNABLES=$tun PMIX_MCA_ptl_tcp_if_include=${veth[0]} \
      PMIX_MCA_ptl_tcp_remote_connections=1 ip netns exec "${ns[0]}" mpirun.openmpi \
      --allow-run-as-root -x GLIBC_TUNABLES --mca btl tcp,self \
      --mca btl_tcp_if_include 10.252.0.0/24 --mca oob_tcp_if_include "${veth[0]}" \
      -np 1 "$out/ar_openmpi" "${args[@]}" : \
      -np 1 ip netns exec "${ns[1]}" "$out/ar_openmpi" "${args[@]}" >"$out/ompi-$w-$t.txt"
  fi
}

places=()
case "$where" in
  both) places=(lo veth) ;;
  lo | veth) places=("$where") ;;
  *) echo "WHERE must be both, lo or veth" >&2; exit 2 ;;
esac
labels=(ry)
[ "$ab" = 1 ] && labels+=(ry_b)
[ "$mpi" = 1 ] && labels+=(ompi)
for w in "${places[@]}"; do
  [ "$w" = veth ] && [ "$netns_up" = 0 ] && setup_netns
  for ((t = 0; t < trials; t++)); do
    run_railyard ry "$w" "$t" ry_env perf_flags "${ry_flags[@]}"
    [ "$ab" = 1 ] && run_railyard ry_b "$w" "$t" ry_env_b perf_flags_b "${ry_flags_b[@]}"
    [ "$mpi" = 1 ] && run_openmpi "$w" "$t"
  done
done

/usr/bin/python3 - "$out" "$trials" "${#places[@]}" "${places[@]}" "${labels[@]}" <<'PY'
import statistics, sys
out, trials, nplaces = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
places, labels = sys.argv[4:4 + nplaces], sys.argv[4 + nplaces:]
def parse(label, w, t):
    rows = {}
    for line in open(f"{out}/{label}-{w}-{t}.txt"):
        f = line.split()
        if not f or line.startswith('#') or not f[0].isdigit():
            continue
        if label == 'ompi':
            rows[int(f[0])] = float(f[3])  # size time_us algbw busbw
        elif len(f) >= 8:
            rows[int(f[0])] = float(f[7])  # out-of-place busbw
    return rows
for w in places:
    runs = {l: [parse(l, w, t) for t in range(trials)] for l in labels}
    sizes = sorted(runs[labels[0]][0])
    where = "loopback" if w == "lo" else "two netns over a veth pair"
    print(f"## AllReduce float32 busbw GB/s, 2 ranks, {where}; median of {trials} interleaved launches")
    head = f"{'bytes':>10} " + " ".join(f"{l + ' (samples)':>30}" for l in labels)
    others = [l for l in labels if l != 'ompi']
    if 'ompi' in labels:
        head += " " + " ".join(f"{l + '/ompi':>9}" for l in others)
    if 'ry_b' in labels:
        head += f" {'ry_b/ry':>8}"
    print(head)
    for size in sizes:
        med = {}
        cells = []
        for l in labels:
            samples = [r.get(size, 0.0) for r in runs[l]]
            med[l] = statistics.median(samples)
            cells.append(f"{med[l]:.3f} ({', '.join(f'{s:.2f}' for s in samples)})")
        row = f"{size:>10} " + " ".join(f"{c:>30}" for c in cells)
        ratio = lambda a, b: f"{med[a] / med[b]:.2f}" if med[b] > 0 else "-"
        if 'ompi' in labels:
            row += " " + " ".join(f"{ratio(l, 'ompi'):>9}" for l in others)
        if 'ry_b' in labels:
            row += f" {ratio('ry_b', 'ry'):>8}"
        print(row)
    print()
PY
