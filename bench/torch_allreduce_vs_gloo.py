#!/usr/bin/python3
"""torch.distributed all_reduce latency and bandwidth: railyard vs gloo, side by side.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_allreduce_vs_gloo.py --nproc 4

Runs --nproc processes on this machine. Each size is all_reduced (sum, float32) --iters times
(--small-iters for sizes up to 64 KiB, a tenth of --iters, at least 3, from 16 MiB) after
--warmup iterations, with each backend in turn, in the same processes, --repeats times
interleaved (railyard, railyard-shared, gloo, railyard, ...; a fresh process group each time):

  railyard         ordinary CPU tensors (copied into shared memory and back by the backend)
  railyard-shared  tensors from railyard.torch.empty (shared with the daemon: zero copy)
  gloo             torch's gloo backend over loopback TCP
  shm-floor        a Python backend with no daemon: each rank copies its tensor into shared
                   memory, and every rank sums all of them once all have (spinning, yielding
                   every 64 polls). torch's dispatch and one shared-memory exchange, nothing
                   else: the floor of any Python backend on this machine, railyard's included
                   (not a usable backend: no isolation, no timeouts, no failure handling)

Time per op is the slowest rank's mean, and the median of that over the repeats; algbw =
bytes / time and busbw = algbw * 2(n-1)/n (the nccl-tests convention: the traffic of a ring
all-reduce). A daemon is needed: --socket (or $RAILYARD_SOCKET), or --railyardd PATH to start
one for the run (default: $RAILYARD_BUILD_DIR/daemon/railyardd, build/ when unset, when no
socket is given). RAILYARD_* variables reach the backend's clients unchanged. --busy N runs N
busy loops beside the ranks (a host whose cores other work keeps busy). Not a test:
numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket as socketlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
try:
    import railyard  # noqa: F401
except ImportError:  # fall back to the build tree's package copy
    sys.path.append(os.path.join(REPO, os.environ.get("RAILYARD_BUILD_DIR", "build"), "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

VARIANTS = ("railyard", "railyard-shared", "gloo", "shm-floor")


_shm_prefix = ""  # the shm-floor group's files: /dev/shm/<prefix>-ctr, -<bytes>


def shm_floor_group():
    """The shm-floor variant's ProcessGroup class, registered once per process; each group
    maps the files named by _shm_prefix when it is created."""
    import mmap

    import numpy as np

    class Done(dist.distributed_c10d.Work):
        def wait(self, timeout: object = None) -> bool:
            return True

        def is_completed(self) -> bool:
            return True

    def mapped(path: str, nbytes: int):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < nbytes:
                os.ftruncate(fd, nbytes)
            return mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)

    class ShmFloor(dist.ProcessGroup):
        def __init__(self, store: object, rank: int, size: int, timeout: object) -> None:
            super().__init__(rank, size)
            self.rank, self.n, self.seq = rank, size, 0
            self.prefix = _shm_prefix
            self.ctr = np.ndarray((size,), np.int64, mapped(self.prefix + "-ctr", 8 * size))
            self.segments: Dict[int, object] = {}

        def getBackendName(self) -> str:  # noqa: N802
            return "shm-floor"

        def _exchange(self) -> None:
            self.seq += 1
            seq, ctr, i = self.seq, self.ctr, 0
            ctr[self.rank] = seq
            while ctr.min() < seq:  # a peer is at most one exchange ahead: parity slots suffice
                i += 1
                if i & 63 == 0:
                    os.sched_yield()

        def allreduce(self, tensors: List[torch.Tensor], opts: object = None) -> Done:
            a = tensors[0].numpy().reshape(-1)
            nbytes = a.nbytes
            if nbytes not in self.segments:
                self.segments[nbytes] = mapped(f"{self.prefix}-{nbytes}", 2 * self.n * nbytes)
            slots = np.ndarray((2, self.n, a.size), a.dtype, self.segments[nbytes])[
                (self.seq + 1) & 1]
            slots[self.rank] = a
            self._exchange()
            with np.errstate(over="ignore"):  # the timed loop sums a tensor into itself
                if opts is not None and opts.reduceOp == dist.ReduceOp.MAX:
                    np.max(slots, axis=0, out=a)
                else:
                    np.sum(slots, axis=0, out=a)
            return Done()

        def barrier(self, opts: object = None) -> Done:
            self._exchange()
            return Done()

    return ShmFloor


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def measure(rank: int, n: int, variant: str, sizes: List[int], iters: int, small_iters: int,
            warmup: int, store_path: str) -> Dict[int, float]:
    import railyard.torch
    backend = "gloo" if variant == "gloo" else "railyard"
    if variant == "shm-floor":
        global _shm_prefix
        backend = "shmfloor"
        _shm_prefix = prefix = "/dev/shm/" + os.path.basename(
            os.path.dirname(store_path)) + "-" + os.path.basename(store_path)
        if backend.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(backend, shm_floor_group())
    dist.init_process_group(backend, rank=rank, world_size=n,
                            store=dist.FileStore(store_path, n))
    times: Dict[int, float] = {}
    try:
        for nbytes in sizes:
            count = max(nbytes // 4, 1)
            if variant == "railyard-shared":
                t = railyard.torch.empty(count, dtype=torch.float32)
            else:
                t = torch.empty(count, dtype=torch.float32)
            t.fill_(1.0)
            if nbytes <= (64 << 10):
                reps = small_iters
            elif nbytes < (16 << 20):
                reps = iters
            else:
                reps = max(3, iters // 10)
            for _ in range(warmup):
                dist.all_reduce(t)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(reps):
                dist.all_reduce(t)
            elapsed = torch.tensor([(time.perf_counter() - start) / reps], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            times[nbytes] = elapsed.item()
    finally:
        dist.destroy_process_group()
        if variant == "shm-floor" and rank == 0:
            for name in os.listdir("/dev/shm"):
                if name.startswith(os.path.basename(prefix)):
                    os.unlink(os.path.join("/dev/shm", name))
    return times


def worker(rank: int, n: int, args: argparse.Namespace, tmp: str, queue) -> None:
    os.environ["RAILYARD_SOCKET"] = args.socket
    os.environ.setdefault("RAILYARD_JOB", f"bench-{os.getppid()}")
    results: Dict[str, List[Dict[int, float]]] = {v: [] for v in args.variants}
    for r in range(args.repeats):
        for i, variant in enumerate(args.variants):
            results[variant].append(
                measure(rank, n, variant, args.sizes, args.iters, args.small_iters, args.warmup,
                        os.path.join(tmp, f"store{r}-{i}")))
    if rank == 0:
        queue.put(results)


def start_daemon(binary: str, tmp: str) -> Tuple[subprocess.Popen, str]:
    sock = os.path.join(tmp, "ry.sock")
    proc = subprocess.Popen([binary, f"--socket={sock}", "--insecure_first_session_token", "--node_name=bench", "--log_level=warn"],
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        try:
            s.connect(sock)
            return proc, sock
        except OSError:
            time.sleep(0.02)
        finally:
            s.close()
    proc.kill()
    raise SystemExit(f"railyardd ({binary}) did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--sizes", default="4,4096,65536,1048576,16777216,67108864",
                        help="comma-separated message sizes in bytes")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--small-iters", type=int, default=500,
                        help="timed iterations for sizes up to 64 KiB")
    parser.add_argument("--repeats", type=int, default=3,
                        help="interleaved measurements of every variant; the median is shown")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--busy", type=int, default=0,
                        help="busy loops (processes that only spin) to run beside the ranks "
                             "for the whole run: a host whose cores other work keeps busy")
    parser.add_argument("--socket", default=os.environ.get("RAILYARD_SOCKET", ""))
    parser.add_argument("--railyardd", default=os.environ.get(
        "RAILYARDD", os.path.join(REPO, os.environ.get("RAILYARD_BUILD_DIR", "build"), "daemon",
                                  "railyardd")))
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.variants = [v for v in args.variants.split(",") if v]
    for v in args.variants:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v}; choose from {', '.join(VARIANTS)}")

    if args.busy < 0:
        parser.error("--busy must be at least 0")
    with tempfile.TemporaryDirectory(prefix="rybench-", dir="/tmp") as tmp:
        daemon = None
        busy = [subprocess.Popen(["/bin/sh", "-c", "while :; do :; done"])
                for _ in range(args.busy)]
        try:
            if not args.socket:
                daemon, args.socket = start_daemon(args.railyardd, tmp)
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            mp.start_processes(worker, args=(args.nproc, args, tmp, queue), nprocs=args.nproc,
                               start_method="spawn")
            results = queue.get(timeout=600)
        finally:
            for p in busy:
                p.kill()
                p.wait()
            if daemon is not None:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(15)

    n = args.nproc
    factor = 2 * (n - 1) / n if n > 1 else 1.0
    print(f"all_reduce float32 sum, {n} processes on one machine "
          f"(torch {torch.__version__}); time = slowest rank's mean, median of "
          f"{args.repeats} interleaved repeats"
          + (f", beside {args.busy} busy loops" if args.busy else ""))
    env = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                   if k.startswith("RAILYARD_")
                   and k not in ("RAILYARD_SOCKET", "RAILYARD_JOB", "RAILYARD_BUILD_DIR"))
    print(f"railyard env: {env or '(none)'}")
    med = {v: {s: statistics.median(run[s] for run in results[v]) for s in args.sizes}
           for v in args.variants}
    width = 23
    print(f"{'':>10} |" + "|".join(f"{v:^{width}}" for v in args.variants))
    print(f"{'size':>10} |" + "|".join(f"{'time us':>11} {'busbw GB/s':>10} "
                                       for _ in args.variants))
    print("-" * (12 + (width + 1) * len(args.variants)))
    for nbytes in args.sizes:
        cells = []
        for v in args.variants:
            t = med[v][nbytes]
            busbw = max(nbytes, 4) / t * factor / 1e9
            cells.append(f"{t * 1e6:>11.1f} {busbw:>10.3f} ")
        print(f"{human(nbytes):>10} |" + "|".join(cells))
    if "gloo" in args.variants and len(args.variants) > 1:
        ours = [v for v in args.variants if v != "gloo"]
        print()
        print("| size | " + " | ".join(f"{v} us" for v in args.variants) + " | "
              + " | ".join(f"{v} / gloo time" for v in ours) + " |")
        print("|---" * (1 + len(args.variants) + len(ours)) + "|")
        for nbytes in args.sizes:
            cells = [f"{med[v][nbytes] * 1e6:.1f}" for v in args.variants]
            cells += [f"{med[v][nbytes] / med['gloo'][nbytes]:.2f}" for v in ours]
            print(f"| {human(nbytes)} | " + " | ".join(cells) + " |")
        print("(time ratio < 1: railyard faster)")
        print()
        print("samples (us per call, one per repeat):")
        for v in args.variants:
            for nbytes in args.sizes:
                print(f"  {v:>15} {human(nbytes):>8}: "
                      + ", ".join(f"{run[nbytes] * 1e6:.1f}" for run in results[v]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
