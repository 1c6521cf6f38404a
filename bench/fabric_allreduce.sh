#!/usr/bin/env bash
# railyard vs OpenMPI on an emulated rail-optimised fabric (issue 14): AllReduce float32 sum.
# Brings up scripts/fabric.sh with K=4 nodes, R=2 rails of 1 Gbit/s each (tbf both ways),
# G=2 ranks per node, in its own directory and namespace prefix (torn down at exit), then per
# launch runs
#   railyard-perf --daemons n0..n3 --ranks-per-daemon 2, RAILYARD_ALGO = hier, ring, rhd and
#     unset (the tuner's choice); the ranks run in the host namespace and reach their daemon
#     over its socket; the daemons' traffic crosses the shaped veths;
#   OpenMPI (bench/mpi_allreduce.c, pml ob1, btl tcp,self), flat, 8 ranks: node k's rank j runs
#     inside node k's namespace with btl_tcp_if_include=rail<j> (one rank per rail address);
#     mpirun and its PMIx server run in n0, reachable on the rail0 subnet;
# sizes 64 KiB to 64 MiB (x4), and prints per size the median out-of-place busbw (GB/s, the
# nccl-tests 2(n-1)/n convention on both sides) of each, hier / OpenMPI, and the cost model's
# prediction for hier (railctl model allreduce --topology DIR/fabric.json --algo hier) with
# hier's share of it; also the model's own choice.
#   bench/fabric_allreduce.sh [REPS=3]
# Environment: RAILYARD_BUILD_DIR (default build); FABRIC_RATE (default 1gbit); FABRIC_PACE
# (scripts/fabric.sh --pace; default its 88% of the rate); MPIRUN (default mpirun.openmpi),
# MPICC (default mpicc.openmpi). Launches interleave: each repetition runs the four railyard
# launches and then one OpenMPI launch. Each launch is two sweeps: 64K-1M (-n 10 -w 2) and
# 4M-64M (-n 5 -w 1; 64 MiB at 1 Gbit/s is 0.3-1 s per op). About 70 s per repetition here.
# Not a test: numbers depend on the machine and its load (2 cores carry 8 ranks, 4 daemons and
# every veth's packets here).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/netns.sh
. scripts/lib/netns.sh
reps=${1:-3}
build=${RAILYARD_BUILD_DIR:-build}
rate=${FABRIC_RATE:-1gbit}
mpirun=${MPIRUN:-mpirun.openmpi}
mpicc=${MPICC:-mpicc.openmpi}
tunables="glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"
nodes=4 rails=2 rpn=2
algos=(hier ring rhd tuner)
if why=$(netns_unavailable); then
  echo "fabric_allreduce: cannot run: $why" >&2
  exit 2
fi
for b in daemon/railyardd tools/railyard-perf tools/railctl; do
  [ -x "$build/$b" ] || { echo "fabric_allreduce: no $build/$b (scripts/build.sh)" >&2; exit 2; }
done
out=$(mktemp -d /tmp/railyard-fabric-bench.XXXXXX)
chmod 755 "$out"
fdir=$out/fabric
prefix=rb$(($$ % 100000))-
cleanup() {
  scripts/fabric.sh down --dir "$fdir" >/dev/null 2>&1 || true
  rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$mpicc" -O2 -o "$out/ar_openmpi" bench/mpi_allreduce.c
scripts/fabric.sh up --nodes "$nodes" --rails "$rails" --ranks-per-node "$rpn" --rate "$rate" \
  ${FABRIC_PACE:+--pace "$FABRIC_PACE"} --dir "$fdir" --prefix "$prefix" >"$out/nodes.txt"
socks=$(awk '{print $6}' "$out/nodes.txt" | paste -sd,)
probe=$(scripts/fabric.sh probe --dir "$fdir" --seconds 2 2>&1 || true)

sweeps=("64K 1M 4 10 2" "4M 64M 4 5 1")  # min max factor iters warmup

run_railyard() {  # algo file
  local algo=$1 f=$2 sw env=()
  [ "$algo" != tuner ] && env=(RAILYARD_ALGO="$algo")
  : >"$f"
  for sw in "${sweeps[@]}"; do
    read -r lo hi fac it wu <<<"$sw"
    env "${env[@]}" timeout 300 "$build/tools/railyard-perf" --op allreduce -d float -b "$lo" -e "$hi" \
      -f "$fac" -n "$it" -w "$wu" -c 0 --daemons "$socks" --ranks-per-daemon "$rpn" \
      >>"$f" 2>"$out/perf.err" ||
      { cat "$out/perf.err" >&2; tail -5 "$fdir"/n*.log >&2; echo "fabric_allreduce: railyard-perf failed ($algo)" >&2; exit 1; }
  done
}

run_openmpi() {  # file
  local f=$1 sw k j app
  : >"$f"
  for sw in "${sweeps[@]}"; do
    read -r lo hi fac it wu <<<"$sw"
    app=()
    for ((k = 0; k < nodes; k++)); do
      for ((j = 0; j < rpn; j++)); do
        [ ${#app[@]} -gt 0 ] && app+=(:)
        app+=(-np 1 ip netns exec "${prefix}n$k" env "OMPI_MCA_btl_tcp_if_include=rail$((j % rails))"
          "$out/ar_openmpi" "$lo" "$hi" "$fac" "$it" "$wu")
      done
    done
    # The ranks of other namespaces reach mpirun's PMIx server and ORTE over TCP on the rail0
    # subnet (start-up and finalize only); MPI traffic is btl tcp on each rank's rail.
    ip netns exec "${prefix}n0" env GLIBC_TUNABLES="$tunables" PMIX_MCA_ptl_tcp_remote_connections=1 \
      PMIX_MCA_ptl_tcp_if_include=10.77.0.0/24 timeout 300 "$mpirun" --allow-run-as-root \
      --oversubscribe --bind-to none --mca pml ob1 --mca btl tcp,self \
      --mca oob_tcp_if_include 10.77.0.0/24 -x GLIBC_TUNABLES "${app[@]}" >>"$f" 2>"$out/mpi.err" ||
      { cat "$out/mpi.err" >&2; echo "fabric_allreduce: OpenMPI failed" >&2; exit 1; }
  done
}

echo "# railyard vs OpenMPI $("$mpirun" --version 2>/dev/null | head -1 | awk '{print $NF}') on scripts/fabric.sh: $nodes nodes x $rails rails of $rate (tbf), $rpn ranks per node; AllReduce float32 sum, out-of-place busbw (GB/s), medians of $reps interleaved launches"
echo "# host $(hostname), $(nproc) CPUs, $(uname -r); railyard $(git describe --always --dirty 2>/dev/null) ($build)"
echo "# rail pace: $(grep -o '"pace": "[^"]*"' "$fdir/n0.json" | head -1 || echo none); $probe"
echo "# OpenMPI: pml ob1, btl tcp,self, one rank per rail address (btl_tcp_if_include=rail<j>), --oversubscribe --bind-to none, GLIBC_TUNABLES=$tunables"
echo "# sweeps per launch: 64K-1M -n 10 -w 2; 4M-64M -n 5 -w 1 (railyard-perf -c 0)"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
for ((r = 1; r <= reps; r++)); do
  for a in "${algos[@]}"; do run_railyard "$a" "$out/ry-$a-$r.txt"; done
  run_openmpi "$out/om-$r.txt"
  echo "# launch $r done ($(($(date +%s) - start)) s)"
done

busbw() {  # file column size: busbw (GB/s) of SIZE from the time in us in FILE's column (railyard-perf
  # prints busbw with 2 decimals only, so both sides compute it from the time: 6 railyard, 2 mpi)
  awk -v c="$2" -v s="$3" -v n="$n" '$1 == s { printf "%.4f\n", s / $c / 1e3 * 2 * (n - 1) / n; exit }' "$1"
}
model() {  # size [algo]: "time_s chosen" from the cost model
  "$build/tools/railctl" model allreduce --size "$1" --topology "$fdir/fabric.json" \
    ${2:+--algo "$2"} --json | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
print(d["algorithms"][0]["time_s"], d["chosen"])'
}
n=$((nodes * rpn))
echo
printf '%9s %8s %8s %8s %8s %8s %10s %9s %9s %-8s\n' size hier ring rhd tuner OpenMPI hier/MPI model_hier hier/model model_pick
s=65536
while [ "$s" -le $((64 << 20)) ]; do
  cells=()
  for a in "${algos[@]}"; do
    vals=()
    for ((r = 1; r <= reps; r++)); do vals+=("$(busbw "$out/ry-$a-$r.txt" 6 "$s")"); done
    cells+=("$(median "${vals[@]}")")
  done
  vals=()
  for ((r = 1; r <= reps; r++)); do vals+=("$(busbw "$out/om-$r.txt" 2 "$s")"); done
  om=$(median "${vals[@]}")
  read -r t_hier _ <<<"$(model "$s" hier)"
  read -r _ pick <<<"$(model "$s")"
  mb=$(awk -v s="$s" -v t="$t_hier" -v n="$n" 'BEGIN { printf "%.3f", s / t / 1e9 * 2 * (n - 1) / n }')
  printf '%9s %8s %8s %8s %8s %8s %10s %9s %9s %-8s\n' "$(awk -v s="$s" 'BEGIN { if (s >= 1048576) printf "%dM", s / 1048576; else printf "%dK", s / 1024 }')" \
    "${cells[@]}" "$om" "$(awk -v a="${cells[0]}" -v b="$om" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')" \
    "$mb" "$(awk -v a="${cells[0]}" -v b="$mb" 'BEGIN { printf "%.0f%%", 100 * a / b }')" "$pick"
  s=$((s * 4))
done
echo
echo "busbw in GB/s = size / time x 2(n-1)/n, n = $n ranks, out-of-place, median over launches."
echo "model_hier: busbw the cost model predicts for hier on DIR/fabric.json (inter = the pace rate);"
echo "hier/model: measured hier as a share of it; model_pick: the model's choice (the daemon's tuner"
echo "decides with the daemons' own view; 'tuner' is what ran with RAILYARD_ALGO unset)."
echo "# total $(($(date +%s) - start)) s; load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
