#!/usr/bin/python3
"""How long a session's small operation waits behind its own large device operation across nodes.

    PYTHONPATH=build/python /usr/bin/python3 bench/staging_hold.py [--mib 64] [--iters 9] [--launches 3]

Two railyardd on loopback (vnode0, vnode1) with fake devices (--fake_gpus), one rank on each (a
session each, threads of this process). Each rank, per iteration: an AllReduce of MIB MiB of fake
device memory across the two nodes, submitted without waiting (it is staged through host memory,
docs/gpu.md), then a 4-byte AllReduce on a second communicator of the same session that holds
only this rank (it has nobody to wait for), timed until it completes; then the large one is
waited for. Printed per launch: the medians over the iterations of the small operation's time
and the large one's, for the staging copy on the submitting thread (--staging_inline_bytes past
the size) and on the device's thread (--staging_inline_bytes=0), launches interleaved.

Not a test: the numbers depend on the machine and its load (on a 2-CPU VM both daemons' copies
compete with everything else for the cores).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Tuple

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
BUILD = os.path.join(REPO, os.environ.get("RAILYARD_BUILD_DIR", "build"))
if importlib.util.find_spec("railyard") is None:
    sys.path.append(os.path.join(BUILD, "python"))

import numpy as np  # noqa: E402

import railyard  # noqa: E402

MODES = (("submitting thread", "--staging_inline_bytes=1099511627776"),
         ("device thread", "--staging_inline_bytes=0"))


def launch(railyardd: str, flag: str, mib: int, iters: int) -> List[Tuple[float, float]]:
    tmp = tempfile.mkdtemp(prefix="rysh-", dir="/tmp")
    procs, sockets = [], []
    try:
        for i in range(2):
            topo = os.path.join(tmp, f"vnode{i}.json")
            with open(topo, "w") as f:
                json.dump({"node": f"vnode{i}", "rails": [{"name": "rail0", "device": "lo"}]}, f)
            sock = os.path.join(tmp, f"d{i}.sock")
            procs.append(subprocess.Popen(
                [railyardd, f"--socket={sock}", "--insecure_first_session_token",
                 f"--node_name=vnode{i}", "--peer_listen=127.0.0.1:0", "--peer_insecure",
                 f"--topology={topo}", "--fake_gpus=1", "--log_level=error", flag]))
            sockets.append(sock)
        for sock in sockets:
            for _ in range(200):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
        clients = [railyard.connect(s, job="staging-hold") for s in sockets]
        comm_id = clients[0].new_comm_id()
        results: List[Tuple[float, float]] = [(0.0, 0.0)] * 2
        errors: List[BaseException] = []

        def rank(r: int) -> None:
            try:
                c = clients[r]
                nbytes = mib << 20
                fds = [os.memfd_create("railyard-fake-device-0") for _ in range(2)]
                for fd in fds:
                    os.ftruncate(fd, nbytes)
                send, recv = (c.register_device_memory(fd, nbytes, 0, dtype=np.float32)
                              for fd in fds)
                comm = c.comm(comm_id, r, 2, timeout=60)
                alone = c.comm(c.new_comm_id(), 0, 1)
                x = np.ones(1, np.float32)
                small, large = [], []
                for _ in range(iters):
                    comm.barrier()
                    t0 = time.perf_counter()
                    work = comm.all_reduce(send, out=recv, async_op=True)
                    t1 = time.perf_counter()
                    alone.all_reduce(x)
                    t2 = time.perf_counter()
                    work.wait()
                    t3 = time.perf_counter()
                    small.append((t2 - t1) * 1e3)
                    large.append((t3 - t0) * 1e3)
                comm.barrier()
                results[r] = (statistics.median(small), statistics.median(large))
                for fd in fds:
                    os.close(fd)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        for c in clients:
            c.close()
        if errors:
            raise errors[0]
        return results
    finally:
        for p in procs:
            p.terminate()
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--iters", type=int, default=9)
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--railyardd", default=os.path.join(BUILD, "daemon", "railyardd"))
    args = ap.parse_args()
    print(f"# {args.mib} MiB device AllReduce across 2 daemons (fake devices) submitted without "
          f"waiting, then a 4 B AllReduce on a one-rank communicator of the same session; "
          f"medians of {args.iters} iterations per rank, ms")
    print("| launch | staging copy on | rank 0 small op | rank 1 small op | rank 0 large op "
          "| rank 1 large op |")
    print("|---|---|---|---|---|---|")
    for n in range(args.launches):
        for name, flag in MODES:
            (s0, l0), (s1, l1) = launch(args.railyardd, flag, args.mib, args.iters)
            print(f"| {n + 1} | {name} | {s0:.2f} | {s1:.2f} | {l0:.1f} | {l1:.1f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
