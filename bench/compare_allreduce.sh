#!/usr/bin/env bash
# Side-by-side AllReduce (float sum) on this host: railyard-perf through one railyardd vs
# OpenMPI and MPICH (MPI_Allreduce over their shared-memory transports), same sizes, same ranks,
# same run. Prints each tool's table, then busbw ratios railyard/peer per size.
#   bench/compare_allreduce.sh [NRANKS=4] [MAXBYTES=64M] [FACTOR=2]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-4}
max=${2:-64M}
factor=${3:-2}
build=${RAILYARD_BUILD_DIR:-build}
[ -x "$build/tools/railyard-perf" ] || scripts/build.sh
out=$(mktemp -d /tmp/railyard-bench.XXXXXX)
daemon_pid=""
cleanup() {
  [ -n "$daemon_pid" ] && kill -TERM "$daemon_pid" 2>/dev/null && wait "$daemon_pid" || true
  rm -rf "$out"
}
trap cleanup EXIT

mpicc.openmpi -O2 -o "$out/ar_openmpi" bench/mpi_allreduce.c
mpicc.mpich -O2 -o "$out/ar_mpich" bench/mpi_allreduce.c

"$build/daemon/railyardd" --socket="$out/ry.sock" --insecure_first_session_token >"$out/d.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$out/ry.sock" ] && break; sleep 0.05; done

echo "## railyard ($n ranks, one railyardd)"
"$build/tools/railyard-perf" --op allreduce -b 8 -e "$max" -f "$factor" -n 20 -w 5 -c 0 \
  --daemons "$out/ry.sock" --ranks-per-daemon "$n" | tee "$out/ry.txt"
echo "## OpenMPI $(mpirun.openmpi --version 2>/dev/null | head -1 | awk '{print $NF}')"
mpirun.openmpi --allow-run-as-root --oversubscribe -np "$n" "$out/ar_openmpi" 8 "$max" "$factor" 20 5 \
  | tee "$out/ompi.txt"
echo "## MPICH $(mpichversion 2>/dev/null | awk '/MPICH Version/{print $3}')"
mpirun.mpich -np "$n" "$out/ar_mpich" 8 "$max" "$factor" 20 5 | tee "$out/mpich.txt"

echo
echo "## busbw (GB/s) side by side; ratio = railyard / peer"
/usr/bin/python3 - "$out/ry.txt" "$out/ompi.txt" "$out/mpich.txt" <<'PY'
import sys
def load_ry(p):
    rows = {}
    for line in open(p):
        f = line.split()
        if not f or line.startswith('#'):
            continue
        rows[int(f[0])] = (float(f[5]), float(f[7]))  # out-of-place time(us), busbw
    return rows
def load_mpi(p):
    rows = {}
    for line in open(p):
        f = line.split()
        if not f or line.startswith('#'):
            continue
        rows[int(f[0])] = (float(f[1]), float(f[3]))
    return rows
ry, om, mp = load_ry(sys.argv[1]), load_mpi(sys.argv[2]), load_mpi(sys.argv[3])
print(f"{'size':>10} {'railyard us':>12} {'openmpi us':>11} {'mpich us':>9} {'ry busbw':>9} {'ompi':>7} {'mpich':>7} {'ry/ompi':>8} {'ry/mpich':>9}")
for size in sorted(ry):
    r, o, m = ry[size], om.get(size, (0, 0)), mp.get(size, (0, 0))
    ratio = lambda a, b: f"{a / b:.2f}" if b > 0 else "-"
    print(f"{size:>10} {r[0]:>12.1f} {o[0]:>11.1f} {m[0]:>9.1f} {r[1]:>9.3f} {o[1]:>7.3f} {m[1]:>7.3f} {ratio(r[1], o[1]):>8} {ratio(r[1], m[1]):>9}")
PY
