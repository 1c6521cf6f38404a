#!/usr/bin/python3
"""All-reduce of numpy arrays over 4 processes on two virtual nodes.

    railyardd --socket /tmp/ry.sock --insecure_first_session_token &
    RAILYARD_SOCKET=/tmp/ry.sock /usr/bin/python3 examples/python/allreduce.py

The script launches itself 4 times (ranks 0-3; ranks 0-1 form virtual node 0, ranks 2-3 node 1)
with ``railyard.launch``, which hands each process RANK, WORLD_SIZE, LOCAL_RANK and a fresh
RAILYARD_COMM_ID. Each rank joins the communicator with ``railyard.init_from_env()``, sums a
shared-memory array (zero copy) and a plain numpy array (copied in and out), and checks the
result.

By default both virtual nodes use ONE daemon ($RAILYARD_SOCKET, or --daemons with a single
socket). ``--daemons a.sock,b.sock`` puts node 0 on daemon a and node 1 on daemon b, which must
run with ``--peer_listen`` (see docs/topology.md for two virtual nodes on one machine).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import railyard
import railyard.launch


def worker(count: int, iters: int) -> None:
    comm = railyard.init_from_env(timeout=60)
    rank, n = comm.rank, comm.nranks
    node = int(os.environ.get("GROUP_RANK", "0"))

    # Zero copy: the array lives in shared memory that the daemon maps.
    x = comm.client.empty(count, np.float32)
    x[:] = rank + 1
    comm.all_reduce(x)
    expected = n * (n + 1) / 2
    assert np.all(x == expected), (x[:4], expected)

    # Any numpy array works too (copied into shared memory and back: slower).
    y = np.arange(8, dtype=np.int64) * (rank + 1)
    comm.all_reduce(y, op="max")
    assert np.array_equal(y, np.arange(8) * n), y

    # Asynchronous: submit, do something else, then wait.
    work = comm.all_reduce(x, op=railyard.ReduceOp.AVG, async_op=True)
    work.wait(timeout=60)

    comm.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        comm.all_reduce(x)
    seconds = (time.perf_counter() - start) / max(iters, 1)
    line = (f"rank {rank}/{n} (node {node}, local rank {comm.local_rank}, daemon "
            f"{comm.client.node_name}): sum ok = {expected:g}, {count * 4 / 1e6:.3g} MB "
            f"all_reduce {seconds * 1e6:.0f} us\n")
    os.write(sys.stdout.fileno(), line.encode())  # one write: ranks' lines do not interleave
    comm.barrier()
    comm.close()
    comm.client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=2, help="virtual nodes")
    parser.add_argument("--daemons", default=os.environ.get("RAILYARD_SOCKET", ""),
                        help="comma-separated daemon sockets, one per node (default: "
                             "$RAILYARD_SOCKET for all nodes)")
    parser.add_argument("--count", type=int, default=1 << 20, help="float32 elements")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    if os.environ.get("RAILYARD_COMM_ID") and os.environ.get("RANK"):
        worker(args.count, args.iters)
        return 0
    daemons = [d for d in args.daemons.split(",") if d] or None
    command = [sys.executable, os.path.abspath(__file__), "--count", str(args.count),
               "--iters", str(args.iters)]
    return railyard.launch.launch(command, args.nproc, nodes=args.nodes, daemons=daemons,
                                  timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
