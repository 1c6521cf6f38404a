#!/usr/bin/python3
"""What a 4-byte torch.distributed all_reduce costs before any backend moves a byte.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_dispatch_floor.py [--iters N]

Runs, in one process each (world size 1, so no peer waits), interleaved --repeats times, the
median of each:

  null             dist.all_reduce through a Python ProcessGroup whose allreduce returns a Work
                   that is already complete: PyTorch 1.13's dispatch to a Python backend
                   (c10d's pybind11 trampoline) and back, and nothing else. No Python backend,
                   railyard's included, can be faster than this.
  null-wait        the same with work.wait() called through the trampoline (async_op=True), as
                   a backend whose operation completes later is used.
  client           railyard.Comm.all_reduce of a 1-element float32 numpy array straight through
                   the Python client (shared-memory rings), no torch.
  railyard         dist.all_reduce through the railyard backend (a daemon is started for it).
  gloo             dist.all_reduce through gloo.

A daemon is started from --railyardd (default $RAILYARD_BUILD_DIR/daemon/railyardd, build/).
Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from typing import Callable, Dict, List

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
try:
    import railyard  # noqa: F401
except ImportError:
    sys.path.append(os.path.join(REPO, os.environ.get("RAILYARD_BUILD_DIR", "build"), "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch._C._distributed_c10d import _create_work_from_future  # noqa: E402,F401

import railyard  # noqa: E402
import railyard.torch  # noqa: E402,F401


class _DoneWork(dist.distributed_c10d.Work):
    def __init__(self) -> None:
        super().__init__()

    def wait(self, timeout: object = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class NullGroup(dist.ProcessGroup):
    def __init__(self, store: object, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)

    def getBackendName(self) -> str:  # noqa: N802
        return "null"

    def allreduce(self, tensors: List[torch.Tensor], opts: object = None) -> _DoneWork:
        return _DoneWork()


def per_op_us(fn: Callable[[], None], iters: int) -> float:
    for _ in range(max(10, iters // 10)):
        fn()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters * 1e6


def group(backend: str, store_dir: str, n: int):
    store = dist.FileStore(os.path.join(store_dir, f"store-{backend}-{n}"), 1)
    dist.init_process_group(backend, store=store, rank=0, world_size=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--railyardd", default=os.path.join(
        REPO, os.environ.get("RAILYARD_BUILD_DIR", "build"), "daemon", "railyardd"))
    args = ap.parse_args()
    if "NULL" not in dist.Backend._plugins:
        dist.Backend.register_backend("null", NullGroup)
    tmp = tempfile.mkdtemp(prefix="ry-floor-")
    sock = os.path.join(tmp, "d.sock")
    daemon = subprocess.Popen([args.railyardd, f"--socket={sock}", "--insecure_first_session_token",
                               "--log_level=warn"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        os.environ["RAILYARD_SOCKET"] = sock
        t = torch.ones(1)
        arr = np.ones(1, dtype=np.float32)
        samples: Dict[str, List[float]] = {k: [] for k in
                                           ("null", "null-wait", "client", "railyard", "gloo")}
        n = 0
        client = railyard.connect(sock)
        comm = client.comm(client.new_comm_id(), 0, 1)
        for _ in range(args.repeats):
            for name in samples:
                n += 1
                if name == "client":
                    samples[name].append(per_op_us(lambda: comm.all_reduce(arr), args.iters))
                    continue
                group("null" if name.startswith("null") else name, tmp, n)
                if name == "null-wait":
                    fn = lambda: dist.all_reduce(t, async_op=True).wait()  # noqa: E731
                else:
                    fn = lambda: dist.all_reduce(t)  # noqa: E731
                samples[name].append(per_op_us(fn, args.iters))
                dist.destroy_process_group()
        comm.close()
        client.close()
    finally:
        daemon.terminate()
        daemon.wait(10)
    print(f"# torch {torch.__version__}, 1 process (world size 1), 4 B float32 all_reduce, "
          f"{args.iters} iterations, median of {args.repeats} interleaved repeats")
    print("| path | us per op | samples |")
    print("|---|---|---|")
    for name, s in samples.items():
        print(f"| {name} | {statistics.median(s):.1f} | {', '.join(f'{x:.1f}' for x in s)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
