#!/usr/bin/python3
"""Shrink and grow time (Comm.shrink / Comm.grow, as ncclCommShrink / ncclCommGrow) at NODES
railyardd on loopback, one rank each (1 rail on lo, plaintext peer plane): NODES-1 survivors
drop the last rank, then grow back to NODES with it as the new rank. Each time is the slowest
rank's, from the call to the end of a first AllReduce on the new communicator; ROUNDS rounds per
size, median reported. Prints one row per size.

    /usr/bin/python3 bench/shrink_grow.py [--nodes 2,4,8,16] [--rounds 5] [--build build]
"""

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))


def rank_main(rank, n, sock, comm_id, rounds, barrier, ids, times):
    os.environ["RAILYARD_SOCKET"] = sock
    import numpy as np
    import railyard
    client = railyard.connect(job="shrinkgrow")
    comm = client.comm(comm_id, rank, n, timeout=60)
    x = np.ones(4, np.float32)
    comm.all_reduce(x)
    for r in range(rounds):
        barrier.wait()
        t0 = time.perf_counter()
        small = None
        if rank < n - 1:
            small = comm.shrink([n - 1], timeout=60)
            small.all_reduce(np.ones(4, np.float32))
            if small.rank == 0:
                ids.put(small.grow_id(n))
        t_shrink = time.perf_counter() - t0
        barrier.wait()
        if rank == n - 1:
            gid = ids.get(timeout=60)
        barrier.wait()
        t1 = time.perf_counter()
        if rank < n - 1:
            big = small.grow(n, timeout=60)
        else:
            big = client.comm(gid, n - 1, n, timeout=60)
        y = np.ones(4, np.float32)
        big.all_reduce(y)
        assert y[0] == n, y
        t_grow = time.perf_counter() - t1
        times.put((r, rank, t_shrink if rank < n - 1 else 0.0, t_grow))
        if small is not None:
            small.close()
        comm.close()
        comm = big
    barrier.wait()
    comm.close()
    client.close()


def start_daemons(railyardd, tmp, n):
    procs, socks = [], []
    for i in range(n):
        topo = os.path.join(tmp, f"n{i}.json")
        with open(topo, "w") as f:
            json.dump({"node": f"vnode{i}", "rails": [{"name": "rail0", "device": "lo"}]}, f)
        sock = os.path.join(tmp, f"n{i}.sock")
        log = open(os.path.join(tmp, f"n{i}.log"), "w")
        procs.append(subprocess.Popen(
            [railyardd, f"--socket={sock}", f"--topology={topo}", "--peer_listen=127.0.0.1:0",
             "--peer_insecure", "--insecure_first_session_token", "--worker_threads=1"],
            stdout=log, stderr=subprocess.STDOUT))
        socks.append(sock)
    deadline = time.monotonic() + 30
    while not all(os.path.exists(s) for s in socks):
        if time.monotonic() > deadline:
            raise SystemExit("daemons did not start")
        time.sleep(0.05)
    return procs, socks


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def run_size(railyardd, n, rounds):
    tmp = tempfile.mkdtemp(prefix="ry-shrinkgrow-")
    procs, socks = start_daemons(railyardd, tmp, n)
    try:
        sys.path.insert(0, os.path.join(REPO, os.environ.get("RAILYARD_BUILD_DIR", "build"),
                                        "python"))
        import railyard
        comm_id = railyard.connect(socks[0], job="shrinkgrow").new_comm_id()
        ctx = mp.get_context("spawn")
        barrier, ids, times = ctx.Barrier(n), ctx.Queue(), ctx.Queue()
        ranks = [ctx.Process(target=rank_main,
                             args=(r, n, socks[r], comm_id, rounds, barrier, ids, times))
                 for r in range(n)]
        for p in ranks:
            p.start()
        got = [times.get(timeout=300) for _ in range(n * rounds)]
        for p in ranks:
            p.join(60)
        shrink = [max(t[2] for t in got if t[0] == r) for r in range(rounds)]
        grow = [max(t[3] for t in got if t[0] == r) for r in range(rounds)]
        return statistics.median(shrink), statistics.median(grow), shrink, grow
    finally:
        stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="2,4,8,16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--build", default=os.environ.get("RAILYARD_BUILD_DIR", "build"))
    a = ap.parse_args()
    os.environ["RAILYARD_BUILD_DIR"] = a.build
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, a.build, "python")] + path)
    railyardd = os.path.join(REPO, a.build, "daemon", "railyardd")
    print(f"# shrink and grow, {a.rounds} rounds per size, 1 rank per railyardd on loopback, "
          f"{os.cpu_count()} cores; ms, slowest rank, to the end of a first 16 B AllReduce")
    print(f"# {'daemons':>8} {'shrink_p50':>11} {'grow_p50':>9}  rounds(shrink | grow)")
    for n in [int(v) for v in a.nodes.split(",")]:
        s, g, ss, gg = run_size(railyardd, n, a.rounds)
        print(f"  {n:8d} {s * 1e3:11.1f} {g * 1e3:9.1f}  "
              f"{' '.join(f'{v * 1e3:.1f}' for v in ss)} | {' '.join(f'{v * 1e3:.1f}' for v in gg)}",
              flush=True)


if __name__ == "__main__":
    main()
