#!/usr/bin/env bash
# How railyard's per-operation cost grows with the number of nodes (issue 56): N railyardd x 1
# rank each, AllReduce float32 sum, out-of-place, against OpenMPI np N (pml ob1, btl tcp) in the
# same run; optionally against another railyard build (BEFORE_BUILD) in the same run too. Where
# (SCALE_WHERE, default "lo"; "lo fabric" for both):
#   lo      N daemons on loopback (UCX tcp on lo, peer plane mutual TLS), OpenMPI btl tcp on lo;
#   fabric  scripts/fabric.sh with N node namespaces x 1 rail (SCALE_FABRIC_RATE, default 10gbit,
#           unpaced), brought up afresh for each launch; OpenMPI's rank i runs in node i's
#           namespace (mpirun in node 0's, its PMIx server on the rail subnet, btl tcp on it).
# Per repetition, for each N, launches interleave: railyard (this build), railyard (BEFORE_BUILD,
# when set), OpenMPI; fresh daemons / fresh mpirun every launch. Each launch runs 8 B (-n ITERS)
# and 64 KiB (-n ITERS/4). A cell is the median over the launches of the time per operation.
#   bench/scale.sh [REPS=3]
# Environment: RAILYARD_BUILD_DIR (build); BEFORE_BUILD (unset: none), a build dir of another
# commit; SCALE_NODES (default "2 4 8 16"); ITERS (default 400); MPIRUN (mpirun.openmpi),
# MPICC (mpicc.openmpi). OpenMPI runs with --oversubscribe --bind-to none and
# GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296, as
# bench/sidebyside.sh.
# On the fabric the daemons of a launch start together with the fabric (scripts/fabric.sh up),
# so each launch there also pays that start; the table has one block per place.
# Not a test: with N daemons and N ranks (and N OpenMPI ranks) on this machine's cores, both tools
# are oversubscribed from N = 2 on a 2-core host; what it shows is how each grows with N.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/netns.sh
. scripts/lib/netns.sh
reps=${1:-3}
build=${RAILYARD_BUILD_DIR:-build}
before=${BEFORE_BUILD:-}
nodes_list=${SCALE_NODES:-2 4 8 16}
where_list=${SCALE_WHERE:-lo}
fabric_rate=${SCALE_FABRIC_RATE:-10gbit}
fabric_dir=/tmp/railyard-scale-fabric
fabric_prefix=rys-
iters=${ITERS:-400}
mpirun=${MPIRUN:-mpirun.openmpi}
mpicc=${MPICC:-mpicc.openmpi}
tunables="glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"
for b in "$build" ${before:+"$before"}; do
  if [ ! -x "$b/daemon/railyardd" ] || [ ! -x "$b/tools/railyard-perf" ]; then
    echo "scale: no railyardd / railyard-perf under $b (scripts/build.sh builds them)" >&2
    exit 2
  fi
done
command -v "$mpirun" >/dev/null || { echo "scale: $mpirun not found (openmpi-bin)" >&2; exit 2; }
out=$(mktemp -d /tmp/railyard-scale.XXXXXX)
pids=()
# shellcheck source=scripts/lib/daemons.sh
. scripts/lib/daemons.sh
cleanup() {
  stop_daemons
  [[ " $where_list " == *" fabric "* ]] && scripts/fabric.sh down --dir "$fabric_dir" >/dev/null 2>&1
  rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$mpicc" -O2 -o "$out/ar_openmpi" bench/mpi_allreduce.c
max_nodes=0
for n in $nodes_list; do [ "$n" -gt "$max_nodes" ] && max_nodes=$n; done
names=()
for ((i = 0; i < max_nodes; i++)); do names+=("vnode$i"); done
scripts/peer-certs.sh "$out/certs" "${names[@]}" >/dev/null

# run_railyard BUILD N FILE: N fresh daemons of BUILD, one rank each; both sweeps into FILE.
run_railyard() {
  local b=$1 n=$2 f=$3 socks=() i
  rm -f "$out"/d*.sock
  for ((i = 0; i < n; i++)); do
    echo "{\"node\": \"vnode$i\", \"rails\": [{\"name\": \"rail0\", \"device\": \"lo\"}]}" >"$out/d$i.json"
    "$b/daemon/railyardd" --socket="$out/d$i.sock" --insecure_first_session_token \
      --peer_listen=127.0.0.1:0 --peer_tls_cert="$out/certs/vnode$i.pem" \
      --peer_tls_key="$out/certs/vnode$i-key.pem" --peer_tls_ca="$out/certs/ca.pem" \
      --topology="$out/d$i.json" >"$out/d$i.log" 2>&1 &
    pids+=($!)
    socks+=("$out/d$i.sock")
  done
  for s in "${socks[@]}"; do
    for _ in $(seq 400); do [ -S "$s" ] && break; sleep 0.05; done
    [ -S "$s" ] || { cat "$out"/d*.log >&2; echo "scale: a railyardd did not start ($s)" >&2; exit 1; }
  done
  local daemons
  daemons=$(IFS=,; echo "${socks[*]}")
  : >"$f"
  local sweep
  for sweep in "8 $iters $((iters / 10))" "64K $((iters / 4)) $((iters / 40))"; do
    read -r size it wu <<<"$sweep"
    timeout 600 "$b/tools/railyard-perf" --op allreduce -b "$size" -e "$size" -n "$it" -w "$wu" \
      -c 0 --daemons "$daemons" --ranks-per-daemon 1 >>"$f" 2>"$out/perf.err" ||
      { cat "$out/perf.err" "$out"/d*.log >&2; echo "scale: railyard-perf failed ($b, $n nodes)" >&2; exit 1; }
  done
  stop_daemons
}

run_openmpi() {  # N FILE
  local n=$1 f=$2 sweep
  : >"$f"
  for sweep in "8 $iters $((iters / 10))" "65536 $((iters / 4)) $((iters / 40))"; do
    read -r size it wu <<<"$sweep"
    GLIBC_TUNABLES=$tunables timeout 600 "$mpirun" --allow-run-as-root --oversubscribe \
      --bind-to none -x "GLIBC_TUNABLES=$tunables" --mca pml ob1 --mca btl tcp,self \
      --mca btl_tcp_if_include lo -np "$n" "$out/ar_openmpi" "$size" "$size" 2 "$it" "$wu" \
      >>"$f" 2>"$out/mpi.err" || { cat "$out/mpi.err" >&2; echo "scale: OpenMPI failed ($n ranks)" >&2; exit 1; }
  done
}

fabric_up() {  # BUILD N
  scripts/fabric.sh down --dir "$fabric_dir" >/dev/null 2>&1 || true
  RAILYARD_BUILD_DIR=$1 scripts/fabric.sh up --nodes "$2" --rails 1 --rate "$fabric_rate" \
    --pace none --dir "$fabric_dir" --prefix "$fabric_prefix" >"$out/fabric.log" 2>&1 ||
    { cat "$out/fabric.log" >&2; echo "scale: scripts/fabric.sh up failed ($2 nodes)" >&2; exit 1; }
}

# run_railyard_fabric BUILD N FILE: a fresh fabric of BUILD's daemons; both sweeps into FILE.
# Leaves the fabric up (OpenMPI runs in its namespaces next).
run_railyard_fabric() {
  local b=$1 n=$2 f=$3 socks=() i sweep
  fabric_up "$b" "$n"
  for ((i = 0; i < n; i++)); do socks+=("$fabric_dir/n$i.sock"); done
  local daemons
  daemons=$(IFS=,; echo "${socks[*]}")
  : >"$f"
  for sweep in "8 $iters $((iters / 10))" "64K $((iters / 4)) $((iters / 40))"; do
    read -r size it wu <<<"$sweep"
    timeout 600 "$b/tools/railyard-perf" --op allreduce -b "$size" -e "$size" -n "$it" -w "$wu" \
      -c 0 --daemons "$daemons" --ranks-per-daemon 1 >>"$f" 2>"$out/perf.err" ||
      { cat "$out/perf.err" >&2; echo "scale: railyard-perf failed on the fabric ($b, $n nodes)" >&2; exit 1; }
  done
}

run_openmpi_fabric() {  # N FILE, on the fabric that is up
  local n=$1 f=$2 sweep i net=10.77.0.0/24
  : >"$f"
  for sweep in "8 $iters $((iters / 10))" "65536 $((iters / 4)) $((iters / 40))"; do
    read -r size it wu <<<"$sweep"
    local apps=()
    for ((i = 0; i < n; i++)); do
      [ "$i" -gt 0 ] && apps+=(:)
      apps+=(-np 1 ip netns exec "${fabric_prefix}n$i" "$out/ar_openmpi" "$size" "$size" 2 "$it" "$wu")
    done
    # mpirun in node 0's namespace; the ranks reach its PMIx server over the rail subnet.
    ip netns exec "${fabric_prefix}n0" env GLIBC_TUNABLES="$tunables" \
      PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include="$net" \
      timeout 600 "$mpirun" --allow-run-as-root --oversubscribe --bind-to none \
      -x "GLIBC_TUNABLES=$tunables" --mca pml ob1 --mca btl tcp,self \
      --mca btl_tcp_if_include "$net" "${apps[@]}" >>"$f" 2>"$out/mpi.err" ||
      { cat "$out/mpi.err" >&2; echo "scale: OpenMPI failed on the fabric ($n ranks)" >&2; exit 1; }
  done
}

if [[ " $where_list " == *" fabric "* ]] && why=$(netns_unavailable); then
  echo "scale: cannot run on the fabric: $why" >&2
  exit 2
fi

echo "# railyard vs OpenMPI $("$mpirun" --version 2>/dev/null | head -1 | awk '{print $NF}') by node count: N railyardd x 1 rank on lo vs OpenMPI np N btl tcp on lo; AllReduce float32 sum, out-of-place"
echo "# host $(hostname), $(nproc) CPUs; railyard $(git describe --always --dirty 2>/dev/null) ($build)${before:+; before: $before}"
echo "# $reps interleaved launches per tool and N; 8 B -n $iters, 64 KiB -n $((iters / 4)); medians of the per-launch time per op"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
for ((r = 1; r <= reps; r++)); do
  for w in $where_list; do
    for n in $nodes_list; do
      if [ "$w" = lo ]; then
        run_railyard "$build" "$n" "$out/lo-ry-$n-$r.txt"
        [ -n "$before" ] && run_railyard "$before" "$n" "$out/lo-bf-$n-$r.txt"
        run_openmpi "$n" "$out/lo-om-$n-$r.txt"
      else
        run_railyard_fabric "$build" "$n" "$out/fabric-ry-$n-$r.txt"
        run_openmpi_fabric "$n" "$out/fabric-om-$n-$r.txt"
        [ -n "$before" ] && run_railyard_fabric "$before" "$n" "$out/fabric-bf-$n-$r.txt"
        scripts/fabric.sh down --dir "$fabric_dir" >/dev/null 2>&1
      fi
      echo "# launch $r, $w, $n nodes done ($(($(date +%s) - start)) s)"
    done
  done
done

# shellcheck disable=SC2086 # nodes_list is a list
/usr/bin/python3 - "$out" "$reps" "${before:+1}" "$where_list" $nodes_list <<'PY'
import statistics, sys
sys.path.insert(0, "bench")
import perf_rows
out, reps, has_before = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
wheres, nodes = sys.argv[4].split(), sys.argv[5:]
load = perf_rows.time_per_op
def med(where, tool, n, size):
    return statistics.median(load(f"{out}/{where}-{tool}-{n}-{r}.txt", tool != "om")[size]
                             for r in range(1, reps + 1))
print()
head = "where   nodes  size    railyard_us" + ("  before_us  after/before" if has_before else "") + \
    "  openmpi_us  ry/ompi" + ("  before/ompi" if has_before else "")
print(head)
for where in wheres:
  for size, label in ((8, "8 B"), (65536, "64 KiB")):
    for n in nodes:
        ry, om = med(where, "ry", n, size), med(where, "om", n, size)
        line = f"{where:<7} {n:<6} {label:<7} {ry:<11.1f}"
        if has_before:
            bf = med(where, "bf", n, size)
            line += f"  {bf:<9.1f}  {ry / bf:<12.3f}"
        line += f"  {om:<10.1f}  {ry / om:<7.2f}"
        if has_before:
            line += f"  {bf / om:.2f}"
        print(line)
PY
