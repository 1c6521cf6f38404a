#!/usr/bin/python3
"""How long small operations wait behind a large device operation across nodes: the same session's,
and another tenant's on the same device.

    /usr/bin/python3 bench/staging_hold.py [--mib 64] [--iters 9] [--launches 3] [--tables 1,2]

Two railyardd on loopback (vnode0, vnode1) with fake devices (--fake_gpus), one rank on each (a
session each, threads of this process). Each rank, per iteration: an AllReduce of MIB MiB of fake
device memory across the two nodes, submitted without waiting (it is staged through host memory,
docs/gpu.md), then a 4-byte AllReduce on a second communicator of the same session that holds
only this rank (it has nobody to wait for), timed until it completes; then the large one is
waited for. Printed per launch: the medians over the iterations of the small operation's time
and the large one's, for the staging copy on the submitting thread (--staging_inline_bytes past
the size) and on the device's thread (--staging_inline_bytes=0), there pipelined with the
operation (the default) or before it (--staging_pipeline=false), launches interleaved.

Second table (another tenant): job A's two ranks run MIB MiB device AllReduces across the nodes
back to back (after one that warms the staging buffers up) while job B's two ranks, sessions of
vnode0 only, run 1 KiB device AllReduces on the same (fake) device, each timed; B's median, 90th
percentile and worst time, for staging copies of --staging_chunk_bytes (4 MiB, the default) and
of one task per copy (1 GiB).

Not a test: the numbers depend on the machine and its load (on a 2-CPU VM both daemons' copies
compete with everything else for the cores).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Iterator, List, Tuple

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
BUILD = os.path.join(REPO, os.environ.get("RAILYARD_BUILD_DIR", "build"))
if importlib.util.find_spec("railyard") is None:
    sys.path.append(os.path.join(BUILD, "python"))

import numpy as np  # noqa: E402

import railyard  # noqa: E402

MODES = (("submitting thread", ["--staging_inline_bytes=1099511627776"]),
         ("device thread, pipelined", ["--staging_inline_bytes=0"]),
         ("device thread, whole copy first", ["--staging_inline_bytes=0",
                                              "--staging_pipeline=false"]))


def launch(railyardd: str, flags: List[str], mib: int, iters: int) -> List[Tuple[float, float]]:
    with daemons(railyardd, flags) as sockets:
        clients = [railyard.connect(s, job="staging-hold") for s in sockets]
        comm_id = clients[0].new_comm_id()
        results: List[Tuple[float, float]] = [(0.0, 0.0)] * 2

        def rank(r: int) -> None:
            c = clients[r]
            send, recv = device_array(c, mib << 20), device_array(c, mib << 20)
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

        run_threads([lambda r=r: rank(r) for r in range(2)], clients)
        return results


@contextlib.contextmanager
def daemons(railyardd: str, flags: List[str]) -> Iterator[List[str]]:
    """Two railyardd (vnode0, vnode1) with fake devices; yields their sockets, ends them after."""
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
                 f"--topology={topo}", "--fake_gpus=1", "--log_level=error", *flags]))
            sockets.append(sock)
        for sock in sockets:
            for _ in range(200):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
        yield sockets
    finally:
        for p in procs:
            p.terminate()
            p.wait()


def run_threads(targets: List[Callable[[], None]], clients: List["railyard.Client"]) -> None:
    """Runs each target on its own thread, then closes the clients; raises the first error."""
    errors: List[BaseException] = []

    def guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(fn,)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    for c in clients:
        c.close()
    if errors:
        raise errors[0]


def device_array(client: "railyard.Client", nbytes: int):
    fd = os.memfd_create("railyard-fake-device-0")
    os.ftruncate(fd, nbytes)
    arr = client.register_device_memory(fd, nbytes, 0, dtype=np.float32)
    os.close(fd)  # the registration holds the memory
    return arr


def tenant_launch(railyardd: str, chunk: int, mib: int, iters: int) -> List[float]:
    """Job B's small operation times (ms) while job A moves mib MiB across nodes."""
    with daemons(railyardd, [f"--staging_chunk_bytes={chunk}"]) as sockets:
        a = [railyard.connect(s, job="tenant-a") for s in sockets]
        b = [railyard.connect(sockets[0], job="tenant-b") for _ in range(2)]
        a_id, b_id = a[0].new_comm_id(), b[0].new_comm_id()
        running = threading.Event()  # set while job A runs its timed operations
        times: List[float] = []

        def job_a(r: int) -> None:
            try:
                send, recv = device_array(a[r], mib << 20), device_array(a[r], mib << 20)
                comm = a[r].comm(a_id, r, 2, timeout=60)
                comm.all_reduce(send, out=recv)  # warm: the staging buffers exist, pages faulted
                comm.barrier()
                running.set()
                for _ in range(iters):
                    comm.all_reduce(send, out=recv)
                comm.barrier()
            finally:
                running.clear()

        def job_b(r: int) -> None:
            x, y = device_array(b[r], 1024), device_array(b[r], 1024)
            comm = b[r].comm(b_id, r, 2, timeout=60)
            for _ in range(20):
                comm.all_reduce(x, out=y)
            running.wait(120)
            while True:
                go = np.array([1.0 if running.is_set() else 0.0], np.float32)
                comm.all_reduce(go, op="min")  # both stop together
                if go[0] == 0.0:
                    break
                t0 = time.perf_counter()
                comm.all_reduce(x, out=y)
                if r == 0:
                    times.append((time.perf_counter() - t0) * 1e3)

        run_threads([lambda r=r: job_a(r) for r in range(2)] +
                    [lambda r=r: job_b(r) for r in range(2)], a + b)
        return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--iters", type=int, default=9)
    ap.add_argument("--launches", type=int, default=3)
    # --fake_gpus: the test build of the daemon.
    ap.add_argument("--railyardd",
                    default=os.path.join(BUILD, "tests", "support", "railyardd-testing"))
    ap.add_argument("--tables", default="1,2", help="which tables to print (1, 2 or both)")
    args = ap.parse_args()
    tables = {int(t) for t in args.tables.split(",")}
    if 1 in tables:
        first_table(args)
    if 2 in tables:
        second_table(args)
    return 0


def first_table(args: argparse.Namespace) -> None:
    print(f"# {args.mib} MiB device AllReduce across 2 daemons (fake devices) submitted without "
          f"waiting, then a 4 B AllReduce on a one-rank communicator of the same session; "
          f"medians of {args.iters} iterations per rank, ms")
    print("| launch | staging copy on | rank 0 small op | rank 1 small op | rank 0 large op "
          "| rank 1 large op |")
    print("|---|---|---|---|---|---|")
    for n in range(args.launches):
        for name, flags in MODES:
            (s0, l0), (s1, l1) = launch(args.railyardd, flags, args.mib, args.iters)
            print(f"| {n + 1} | {name} | {s0:.2f} | {s1:.2f} | {l0:.1f} | {l1:.1f} |",
                  flush=True)
    print()


def second_table(args: argparse.Namespace) -> None:
    print(f"# job B: 1 KiB device AllReduce, 2 ranks on vnode0, while job A runs {args.iters} "
          f"{args.mib} MiB device AllReduces across vnode0 and vnode1; B's times, ms")
    print("| launch | staging chunk | B operations | median | p90 | worst |")
    print("|---|---|---|---|---|---|")
    for n in range(args.launches):
        for chunk in (4 << 20, 1 << 30):
            times = sorted(tenant_launch(args.railyardd, chunk, args.mib, args.iters))
            if not times:
                print(f"| {n + 1} | {chunk >> 20} MiB | 0 | - | - | - |", flush=True)
                continue
            p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
            print(f"| {n + 1} | {chunk >> 20} MiB | {len(times)} | "
                  f"{statistics.median(times):.2f} | {p90:.2f} | {times[-1]:.2f} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
