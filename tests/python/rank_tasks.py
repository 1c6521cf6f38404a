"""Code that runs inside the rank processes of the tests (see conftest.RankPool).

Each rank process serves tasks: the test sends (function, args) to ranks 0..k-1, each runs it and
sends back its result (or the exception). Functions here are picklable by reference, so the
spawned processes can import them. Inputs are deterministic functions of (seed, rank), so the
test process can compute numpy references for every rank without receiving the inputs.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any, Dict, List, Optional

import numpy as np

# Every wait in the tests is bounded: operations use this daemon-side timeout (seconds).
OP_TIMEOUT = 20.0

_client = None


def client():
    """This rank process's session (connects on first use, to $RAILYARD_SOCKET)."""
    global _client
    import railyard
    if _client is None or _client.closed:
        _client = railyard.connect(job=os.environ.get("RAILYARD_JOB", "pytest"))
    return _client


def stacks_path(pid: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"rypy-stacks-{pid}.txt")


def serve(conn, rank: int, env: Dict[str, str]) -> None:
    """Main loop of a rank process: run tasks until told to stop (None) or the pipe closes."""
    os.environ.update(env)
    # SIGUSR1 writes every thread's Python stack to stacks_path(pid) (the pool asks for them
    # when a task hangs, and reports them).
    stacks = open(stacks_path(os.getpid()), "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        fn, args = task
        try:
            conn.send(("ok", fn(*args)))
        except BaseException as e:  # noqa: BLE001 - reported to the test
            try:
                conn.send(("err", (repr(e), traceback.format_exc())))
            except Exception:
                return


# ---------------------------------------------------------------------------------------------
# Deterministic inputs


def make_input(seed: int, rank: int, shape: Any, dtype: str, kind: str = "sum") -> np.ndarray:
    """Rank ``rank``'s input of a test: small values so that sums and averages do not overflow;
    values near 1 for products of floats."""
    rng = np.random.default_rng([seed, rank])
    dt = np.dtype(dtype)
    if dt.kind == "f":
        if kind == "prod":
            return rng.uniform(0.5, 1.5, size=shape).astype(dt)
        return rng.standard_normal(size=shape).astype(dt)
    if kind == "prod":
        lo, hi = (0, 4) if dt.kind == "u" else (-3, 4)
    else:
        lo, hi = (0, 61) if dt.kind == "u" else (-30, 31)
    return rng.integers(lo, hi, size=shape).astype(dt)


# ---------------------------------------------------------------------------------------------
# Collectives: each task runs the operation three ways (arrays from client.empty, plain numpy
# arrays, and async_op=True) and returns the three results.


def _fill(arr: np.ndarray, values: np.ndarray) -> np.ndarray:
    arr[...] = values.reshape(arr.shape)
    return arr


def run_collective(rank: int, n: int, comm_id: str, op: str, dtype: str, count: int, seed: int,
                   red: str = "sum") -> Dict[str, Any]:
    c = client()
    comm = c.comm(comm_id, rank, n, timeout=OP_TIMEOUT)
    kw = {"timeout": OP_TIMEOUT}
    out: Dict[str, Any] = {}
    try:
        for variant in ("shared", "plain", "async"):
            shared = variant == "shared"

            def new(shape, values=None):
                arr = c.empty(shape, dtype) if shared else np.empty(shape, dtype)
                if values is not None:
                    _fill(arr, values)
                else:
                    arr.fill(0)
                return arr

            a = variant == "async"
            if op == "all_reduce":
                x = new((count,), make_input(seed, rank, count, dtype, red))
                r = comm.all_reduce(x, red, async_op=a, **kw)
            elif op == "all_reduce_out":
                x = new((count,), make_input(seed, rank, count, dtype, red))
                o = new((count,))
                r = comm.all_reduce(x, red, out=o, async_op=a, **kw)
                out.setdefault("input_unchanged", []).append(
                    bool(np.array_equal(x, make_input(seed, rank, count, dtype, red))))
            elif op == "reduce_scatter":
                x = new((n, count), make_input(seed, rank, n * count, dtype, red))
                r = comm.reduce_scatter(x, red, async_op=a, **kw)
            elif op == "reduce_scatter_inplace":
                x = new((n, count), make_input(seed, rank, n * count, dtype, red))
                r = comm.reduce_scatter(x, red, out=x[rank], async_op=a, **kw)
            elif op == "all_gather":
                x = new((count,), make_input(seed, rank, count, dtype))
                r = comm.all_gather(x, async_op=a, **kw)
            elif op == "all_gather_inplace":
                o = new((n, count))
                _fill(o[rank], make_input(seed, rank, count, dtype))
                r = comm.all_gather(o[rank], out=o, async_op=a, **kw)
            elif op == "broadcast":
                root = n - 1
                x = new((count,), make_input(seed, rank, count, dtype) if rank == root else None)
                r = comm.broadcast(x, root, async_op=a, **kw)
            elif op == "reduce":
                root = n // 2
                x = new((count,), make_input(seed, rank, count, dtype, red))
                o = new((count,))
                r = comm.reduce(x, root, red, out=o, async_op=a, **kw)
            elif op == "all_to_all":
                x = new((n, count), make_input(seed, rank, n * count, dtype))
                r = comm.all_to_all(x, async_op=a, **kw)
            elif op == "all_to_all_v":
                # rank r sends (r + p) % 3 + 1 elements to rank p.
                sc = [(rank + p) % 3 + 1 for p in range(n)]
                rc = [(p + rank) % 3 + 1 for p in range(n)]
                x = new((sum(sc),), make_input(seed, rank, sum(sc), dtype))
                r = comm.all_to_all_v(x, sc, rc, out=new((sum(rc),)), async_op=a, **kw)
            elif op == "send_recv":
                # A ring: send to the right, receive from the left.
                x = new((count,), make_input(seed, rank, count, dtype))
                y = new((count,))
                right, left = (rank + 1) % n, (rank - 1) % n
                ws = comm.send(x, right, async_op=True, **kw)
                wr = comm.recv(y, left, async_op=True, **kw)
                ws.wait(OP_TIMEOUT + 5)
                r = wr if a else wr.wait(OP_TIMEOUT + 5)
            elif op == "barrier":
                r = comm.barrier(async_op=a, **kw)
            else:
                raise ValueError(op)
            if a:
                r = r.wait(OP_TIMEOUT + 5)
            out[variant] = None if r is None else np.array(r)
            out.setdefault("shared_checks", []).append(
                None if r is None else bool(c.is_shared(r)) == shared)
        # Leaving a comm fails the others' pending operations (docs/local-api.md): after
        # send/recv a rank may finish before its peers, so everyone waits for everyone first.
        comm.barrier(timeout=OP_TIMEOUT)
    finally:
        comm.close()
    return out


# ---------------------------------------------------------------------------------------------
# Error cases


def error_info(e: BaseException) -> Dict[str, Any]:
    import railyard
    return {"type": type(e).__name__, "code": getattr(e, "code", None) and e.code.name,
            "message": str(e), "is_railyard": isinstance(e, railyard.RailyardError)}


def mismatched_all_reduce(rank: int, n: int, comm_id: str) -> Dict[str, Any]:
    """Rank r all_reduces r+1 elements: every rank gets INVALID_ARGUMENT, then ABORTED."""
    c = client()
    comm = c.comm(comm_id, rank, n, timeout=OP_TIMEOUT)
    result: Dict[str, Any] = {}
    try:
        try:
            comm.all_reduce(c.zeros(rank + 1, np.float32), timeout=OP_TIMEOUT)
            result["first"] = None
        except Exception as e:  # noqa: BLE001
            result["first"] = error_info(e)
        try:
            comm.all_reduce(c.zeros(4, np.float32), timeout=OP_TIMEOUT)
            result["second"] = None
        except Exception as e:  # noqa: BLE001
            result["second"] = error_info(e)
    finally:
        comm.close()
    return result


def lonely_all_reduce(rank: int, n: int, comm_id: str) -> Dict[str, Any]:
    """Only rank 0 submits (with a short timeout): DEADLINE_EXCEEDED naming the others. Before
    that, a client-side wait(timeout) on the same operation times out without failing it."""
    c = client()
    comm = c.comm(comm_id, rank, n, timeout=OP_TIMEOUT)
    result: Dict[str, Any] = {}
    try:
        if rank == 0:
            work = comm.all_reduce(np.ones(8, np.float32), timeout=1.5, async_op=True)
            try:
                work.wait(0.2)
                result["client_wait"] = None
            except Exception as e:  # noqa: BLE001
                result["client_wait"] = error_info(e)
            result["completed_after_client_timeout"] = work.is_completed()
            try:
                work.wait(OP_TIMEOUT)
                result["daemon"] = None
            except Exception as e:  # noqa: BLE001
                result["daemon"] = error_info(e)
        else:
            import time
            time.sleep(2.5)  # outlive rank 0's timeout without submitting
    finally:
        comm.close()
    return result


def join_and_leave(rank: int, n: int, comm_id: str) -> Dict[str, Any]:
    """Rank 1 leaves the comm while rank 0's all_reduce waits for it: UNAVAILABLE or ABORTED."""
    import time
    c = client()
    comm = c.comm(comm_id, rank, n, timeout=OP_TIMEOUT)
    if rank == 1:
        time.sleep(0.5)
        comm.close()
        return {}
    try:
        comm.all_reduce(np.ones(4, np.float32), timeout=OP_TIMEOUT)
        return {"error": None}
    except Exception as e:  # noqa: BLE001
        return {"error": error_info(e)}
    finally:
        comm.close()


def shrink_and_grow(rank: int, n: int, comm_id: str, grow_id_file: str) -> Dict[str, Any]:
    """Ranks 0..n-2 join comm_id (n-1 ranks); rank 1 leaves; the others shrink it without rank 1
    (no id exchanged), then grow the result by one with rank n-1 as its new last rank, which
    joins with the id the shrunk communicator's rank 0 writes to grow_id_file. Returns each
    stage's all_reduce of (rank + 1), with the ranks and sizes seen."""
    import time
    c = client()
    out: Dict[str, Any] = {}
    if rank < n - 1:
        comm = c.comm(comm_id, rank, n - 1, timeout=OP_TIMEOUT)
        x = np.full(8, rank + 1, np.float32)
        out["full"] = float(comm.all_reduce(x, timeout=OP_TIMEOUT)[0])
        if rank == 1:
            comm.close()
            return out
        small = comm.shrink([1], timeout=OP_TIMEOUT)
        out["shrunk_rank"], out["shrunk_n"] = small.rank, small.nranks
        y = np.full(8, rank + 1, np.float32)
        out["shrunk"] = float(small.all_reduce(y, timeout=OP_TIMEOUT)[0])
        if small.rank == 0:
            gid = small.grow_id(small.nranks + 1)
            with open(grow_id_file + ".tmp", "w") as f:
                f.write(gid)
            os.rename(grow_id_file + ".tmp", grow_id_file)
        big = small.grow(small.nranks + 1, timeout=OP_TIMEOUT)
        comm.close()
    else:
        deadline = time.monotonic() + OP_TIMEOUT
        while not os.path.exists(grow_id_file) and time.monotonic() < deadline:
            time.sleep(0.01)
        gid = open(grow_id_file).read()
        big = c.comm(gid, n - 2, n - 1, timeout=OP_TIMEOUT)
    out["grown_rank"], out["grown_n"] = big.rank, big.nranks
    z = np.full(8, big.rank + 1, np.float32)
    out["grown"] = float(big.all_reduce(z, timeout=OP_TIMEOUT)[0])
    big.close()
    return out


def auto_shrink_after_a_departure(rank: int, n: int, comm_id: str) -> Dict[str, Any]:
    """n ranks of an on_failure="shrink" communicator; after one all_reduce the last rank leaves
    (Comm.close). The others' next all_reduce fails naming it, the communicator shrinks on its
    own, and the one after runs on the n - 1 left. Returns what each saw."""
    import railyard
    c = client()
    comm = c.comm(comm_id, rank, n, timeout=OP_TIMEOUT, on_failure="shrink",
                  shrink_timeout=OP_TIMEOUT)
    out: Dict[str, Any] = {"first": float(comm.all_reduce(np.full(8, rank + 1, np.float64),
                                                          timeout=OP_TIMEOUT)[0])}
    if rank == n - 1:
        comm.close()
        return out
    try:
        comm.all_reduce(np.full(8, rank + 1, np.float64), timeout=OP_TIMEOUT)
        out["error"] = None
    except railyard.RailyardError as e:
        out["error"] = type(e).__name__
        out["message"] = e.message
        out["lost"] = getattr(e, "lost_ranks", None)
        out["shrunk"] = getattr(e, "shrunk", None)
    out["rank"], out["nranks"], out["lost_ranks"] = comm.rank, comm.nranks, comm.lost_ranks
    out["after"] = float(comm.all_reduce(np.full(8, rank + 1, np.float64), timeout=OP_TIMEOUT)[0])
    comm.close()
    return out


# ---------------------------------------------------------------------------------------------
# torch.distributed


def _init_torch(rank: int, n: int, backend: str, store_path: str):
    import torch.distributed as dist
    import railyard.torch  # noqa: F401 - registers the backend
    store = dist.FileStore(store_path, n)
    dist.init_process_group(backend, rank=rank, world_size=n, store=store)
    return dist


def torch_completions_nobody_drives(rank: int, n: int, store_path: str) -> Dict[str, Any]:
    """A torch future waited for in C++ and a polled is_completed(), while the session's
    background reader dozes for 30 s (it does after operations this thread waited for itself):
    both must see their completion without it."""
    import torch
    import railyard.torch
    from railyard import _ring
    dist = _init_torch(rank, n, "railyard", store_path)
    old = _ring.READER_DOZE_S
    _ring.READER_DOZE_S = 30.0
    out: Dict[str, Any] = {}
    try:
        t = torch.full((3,), float(rank + 1))
        for _ in range(3):
            dist.all_reduce(t)
        time.sleep(0.2)
        for _ in range(3):
            dist.all_reduce(t)  # the reader wakes for the first and dozes
        t = torch.full((3,), float(rank + 1))
        work = dist.all_reduce(t, async_op=True)
        start = time.monotonic()
        value = work.get_future().wait()  # torch's C++ wait: it reads no ring
        out["future_s"] = time.monotonic() - start
        out["future"] = value[0].tolist()
        t = torch.full((2,), 10.0 * (rank + 1))
        work = dist.all_reduce(t, async_op=True)
        start = time.monotonic()
        while not work.is_completed() and time.monotonic() - start < 20:
            pass
        out["poll_s"] = time.monotonic() - start
        out["polled"] = t.tolist()
    finally:
        _ring.READER_DOZE_S = old
        rings = railyard.torch._shared_client()._rings
        if rings is not None:
            rings.background_wanted()  # out of the long doze, for the next test in this process
        dist.destroy_process_group()
    return out


def torch_collectives(rank: int, n: int, store_path: str, dtype_name: str) -> Dict[str, Any]:
    """The torch.distributed API on the railyard backend; returns the results for the test."""
    import torch
    dist = _init_torch(rank, n, "railyard", store_path)
    dtype = getattr(torch, dtype_name)
    out: Dict[str, Any] = {"backend": dist.get_backend()}

    def val(*shape, base=0.0):
        return (torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)
                + base).to(dtype)

    def f64(t):
        return t.to(torch.float64).numpy()

    try:
        t = val(5, base=rank)
        dist.all_reduce(t)
        out["all_reduce"] = f64(t)
        for name, op in (("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN),
                         ("prod", dist.ReduceOp.PRODUCT)):
            t = torch.full((3,), rank + 1.0).to(dtype)
            dist.all_reduce(t, op=op)
            out[f"all_reduce_{name}"] = f64(t)
        if dtype.is_floating_point:
            t = torch.full((3,), float(rank)).to(dtype)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            out["all_reduce_avg"] = f64(t)
        # Non-contiguous tensor (a column of a matrix).
        m = val(4, 3, base=rank)
        col = m[:, 1]
        dist.all_reduce(col)
        out["all_reduce_noncontig"] = f64(m)
        # Async with get_future, as DDP uses it.
        t = val(6, base=10 * rank)
        work = dist.all_reduce(t, async_op=True)
        fut_value = work.get_future().wait()
        work.wait()
        out["all_reduce_async"] = f64(t)
        out["future_value"] = f64(fut_value[0])
        out["work_completed"] = work.is_completed()

        t = val(4, base=100 * rank)
        dist.broadcast(t, src=n - 1)
        out["broadcast"] = f64(t)

        t = val(3, base=rank)
        dist.reduce(t, dst=0)
        out["reduce"] = f64(t)

        outs = [torch.zeros(2, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, val(2, base=rank))
        out["all_gather"] = np.stack([f64(o) for o in outs])

        big = torch.zeros(n * 2, dtype=dtype)
        dist.all_gather_into_tensor(big, val(2, base=rank)) if hasattr(
            dist, "all_gather_into_tensor") else dist._all_gather_base(big, val(2, base=rank))
        out["all_gather_base"] = f64(big)

        o = torch.zeros(2, dtype=dtype)
        dist.reduce_scatter(o, [val(2, base=10 * rank + i) for i in range(n)])
        out["reduce_scatter"] = f64(o)

        o = torch.zeros(2, dtype=dtype)
        dist._reduce_scatter_base(o, val(2 * n, base=rank))
        out["reduce_scatter_base"] = f64(o)

        outs = [torch.zeros(2, dtype=dtype) for _ in range(n)]
        dist.all_to_all(outs, [val(2, base=100 * rank + 10 * p) for p in range(n)])
        out["all_to_all"] = np.stack([f64(o) for o in outs])

        o = torch.zeros(2 * n, dtype=dtype)
        dist.all_to_all_single(o, val(2 * n, base=100 * rank))
        out["all_to_all_single"] = f64(o)

        # Uneven splits: rank r sends p+1 rows to rank p; receives r+1 rows from everyone.
        inp = val(sum(p + 1 for p in range(n)), 2, base=100 * rank)
        o = torch.zeros(n * (rank + 1), 2, dtype=dtype)
        dist.all_to_all_single(o, inp, output_split_sizes=[rank + 1] * n,
                               input_split_sizes=[p + 1 for p in range(n)])
        out["all_to_all_single_splits"] = f64(o)

        if n > 1:
            if rank == 0:
                dist.send(val(3, base=7), dst=1)
            elif rank == 1:
                r = torch.zeros(3, dtype=dtype)
                dist.recv(r, src=0)
                out["recv"] = f64(r)

        gl = [torch.zeros(2, dtype=dtype) for _ in range(n)] if rank == 0 else None
        dist.gather(val(2, base=rank), gather_list=gl, dst=0)
        if rank == 0:
            out["gather"] = np.stack([f64(g) for g in gl])
        s = torch.zeros(2, dtype=dtype)
        dist.scatter(s, scatter_list=[val(2, base=10 * p) for p in range(n)] if rank == 0
                     else None, src=0)
        out["scatter"] = f64(s)

        dist.barrier()
        out["barrier"] = True
    finally:
        dist.destroy_process_group()
    return out


def torch_subgroups(rank: int, n: int, store_path: str) -> Dict[str, Any]:
    """dist.new_group: even and odd ranks each get their own communicator."""
    import torch
    dist = _init_torch(rank, n, "railyard", store_path)
    try:
        evens = dist.new_group([r for r in range(n) if r % 2 == 0])
        odds = dist.new_group([r for r in range(n) if r % 2 == 1])
        mine = evens if rank % 2 == 0 else odds
        t = torch.full((2,), float(rank))
        dist.all_reduce(t, group=mine)
        world = torch.ones(1)
        dist.all_reduce(world)
        return {"group": t.tolist(), "world": world.item(),
                "group_size": dist.get_world_size(mine), "backend": dist.get_backend(mine)}
    finally:
        dist.destroy_process_group()


def torch_shrink(rank: int, n: int, store_path: str) -> Dict[str, Any]:
    """The world group shrinks without its last rank (which leaves first): the others get a
    group renumbered in order and all_reduce on it."""
    import torch
    dist = _init_torch(rank, n, "railyard", store_path)
    try:
        pg = dist.distributed_c10d._get_default_group()
        if rank == n - 1:
            return {}
        small = pg.shrink([n - 1])
        t = torch.full((3,), float(rank + 1))
        small.allreduce([t]).wait()
        out = {"rank": small.rank(), "size": small.size(), "sum": t.tolist()}
        small.shutdown()
        return out
    finally:
        dist.destroy_process_group()


def torch_small_all_reduce(rank: int, n: int, store_path: str) -> Dict[str, Any]:
    """all_reduce sums of every dtype the lean path takes, at sizes either side of its limit, a
    non-contiguous view and an async one; with the path each took (the railyard work behind the
    torch Work: the lean _HostOp, or the general path's railyard.Work)."""
    import torch
    dist = _init_torch(rank, n, "railyard", store_path)
    out: Dict[str, Any] = {}
    try:
        for name in ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32",
                     "int64"):
            dtype = getattr(torch, name)
            limit = (64 << 10) // torch.empty(0, dtype=dtype).element_size()
            for count in (1, 7, limit, limit + 1):
                t = (torch.arange(count, dtype=torch.float64) % 5 + rank).to(dtype)
                work = dist.all_reduce(t, async_op=True)
                work.wait()
                out[f"{name}/{count}"] = (t.to(torch.float64).numpy().tolist(),
                                          type(work._rw).__name__)
        m = torch.arange(12, dtype=torch.float32).reshape(4, 3) + rank
        work = dist.all_reduce(m[:, 1], async_op=True)
        work.wait()
        out["noncontig"] = (m[:, 1].tolist(), type(work._rw).__name__)
        t = torch.full((3,), float(rank + 1))
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
        out["future"] = work.get_future().wait()[0].tolist()
        out["completed"] = work.is_completed()
    finally:
        dist.destroy_process_group()
    return out


def torch_cyclic_garbage(rank: int, n: int, store_path: str) -> Dict[str, Dict[str, int]]:
    """Per kind of operation, the objects that 20 of them leave in reference cycles (what only
    Python's garbage collector frees), by type. Garbage per operation starts collections, and a
    full one takes tens of milliseconds in a process that has torch loaded."""
    import collections
    import gc
    import torch
    import railyard.torch
    dist = _init_torch(rank, n, "railyard", store_path)
    small = torch.ones(3)
    big = torch.ones(1 << 18)
    shared = railyard.torch.empty(16)
    shared.fill_(1.0)
    gathered = [torch.empty(1 << 18) for _ in range(n)]
    peer = (rank + 1) % n

    def send_recv() -> None:
        if rank % 2 == 0:
            dist.send(small, peer)
            dist.recv(small, peer)
        else:
            dist.recv(small, (rank - 1) % n)
            dist.send(small, (rank - 1) % n)

    kinds = {
        "all_reduce small": lambda: dist.all_reduce(small),
        "all_reduce small async": lambda: dist.all_reduce(small, async_op=True).wait(),
        "all_reduce small future": lambda: dist.all_reduce(small, async_op=True)
        .get_future().wait(),
        "all_reduce 1 MiB": lambda: dist.all_reduce(big),
        "all_reduce shared": lambda: dist.all_reduce(shared),
        "broadcast": lambda: dist.broadcast(big, 0),
        "all_gather": lambda: dist.all_gather(gathered, big),
        "barrier": lambda: dist.barrier(),
        "send_recv": send_recv,
    }
    out: Dict[str, Dict[str, int]] = {}
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for name, op in kinds.items():
            for _ in range(3):
                op()
            gc.collect()  # frees what is garbage already (an earlier process group's cycles)
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                for _ in range(20):
                    op()
                gc.collect()
                out[name] = dict(collections.Counter(type(o).__name__ for o in gc.garbage))
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.collect()  # what SAVEALL kept, freed now
    finally:
        if was_enabled:
            gc.enable()
        dist.destroy_process_group()
    return out


def torch_error(rank: int, n: int, store_path: str) -> Dict[str, Any]:
    """Mismatched sizes: the error surfaces from the synchronous call and from Work.wait()."""
    import torch
    dist = _init_torch(rank, n, "railyard", store_path)
    result: Dict[str, Any] = {}
    try:
        try:
            dist.all_reduce(torch.zeros(rank + 1))
            result["sync"] = None
        except Exception as e:  # noqa: BLE001
            result["sync"] = error_info(e)
        work = dist.all_reduce(torch.zeros(4), async_op=True)
        try:
            work.wait()
            result["async"] = None
        except Exception as e:  # noqa: BLE001
            result["async"] = error_info(e)
        try:
            dist.all_reduce(torch.zeros(4, dtype=torch.int16))
            result["int16"] = None
        except Exception as e:  # noqa: BLE001
            result["int16"] = error_info(e)
    finally:
        dist.destroy_process_group()
    return result


def _caught(fn) -> Optional[Dict[str, Any]]:
    """error_info of what fn() raises, with the seconds it took; None if it returned."""
    start = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - reported to the test
        return dict(error_info(e), seconds=time.monotonic() - start)
    return None


def _all_reduce_one() -> float:
    """An all_reduce of 1.0 on the default group: the world size when the group is in step."""
    import torch
    import torch.distributed as dist
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def torch_allgather_coalesced(rank: int, n: int, store_path: str) -> Dict[str, Any]:
    """dist.all_gather_coalesced: tensors of several shapes (an empty one, complex ones) in one
    call; then malformed calls, which must fail before anything is sent."""
    import torch
    dist = _init_torch(rank, n, "railyard", store_path)
    out: Dict[str, Any] = {}
    try:
        inputs = [torch.full((2, 3), float(rank)), torch.arange(4.0) + 10 * rank,
                  torch.zeros(0), torch.tensor([rank + 0.5])]
        outputs = [[torch.full_like(t, -1.0) for t in inputs] for _ in range(n)]
        dist.all_gather_coalesced(outputs, inputs)
        out["float"] = [[o.numpy().copy() for o in row] for row in outputs]
        cin = [torch.tensor([complex(rank, 1), complex(2, -rank)])]
        cout = [[torch.zeros(2, dtype=torch.complex64)] for _ in range(n)]
        dist.all_gather_coalesced(cout, cin)
        out["complex"] = [row[0].numpy().copy() for row in cout]
        fut = dist.all_gather_coalesced(outputs, inputs, async_op=True)  # a Future in 1.13
        out["async_value"] = [[o.numpy().copy() for o in row] for row in fut.wait()]
        out["async_is_outputs"] = all(a is b for row, mine in zip(fut.wait(), outputs)
                                      for a, b in zip(row, mine))
        pg = dist.distributed_c10d._get_default_group()
        out["wrong_count"] = _caught(lambda: pg.allgather_coalesced(outputs[:-1], inputs))
        out["wrong_shape"] = _caught(lambda: pg.allgather_coalesced(
            [[torch.zeros(5) for _ in inputs] for _ in range(n)], inputs))
        out["mixed_dtypes"] = _caught(lambda: pg.allgather_coalesced(
            outputs, [inputs[0], inputs[1].double()]))
        # The group is still in step after the refused calls.
        out["after"] = _all_reduce_one()
    finally:
        dist.destroy_process_group()
    return out


def torch_recv_any_source(rank: int, n: int, store_path: str) -> Dict[str, Any]:
    """dist.recv without src: rank 0 takes the peers' messages in whatever order they come,
    mixed with receives from a named peer; a wrong-sized tensor fails only that receive; a
    receive nobody sends to times out alone (the group goes on)."""
    import torch
    dist = _init_torch(rank, n, "railyard", store_path)
    out: Dict[str, Any] = {}
    try:
        # 1. Every peer sends two messages (value 100 * rank + i); rank 0 receives them all from
        #    any source, the second half with irecv + _source_rank().
        if rank == 0:
            got = []
            for i in range(2 * (n - 1)):
                t = torch.zeros(3)
                if i % 2 == 0:
                    src = dist.recv(t)
                else:
                    work = dist.irecv(t)
                    work.wait()
                    src = work._source_rank()
                got.append((src, t.tolist()))
            out["any"] = got
        else:
            for i in range(2):
                dist.send(torch.full((3,), 100.0 * rank + i), dst=0)
        dist.barrier()
        # 2. An any-source receive posted first, then one from rank 1: rank 2 sends first (rank 1
        #    waits for the barrier), so the any-source receive gets rank 2's message and the
        #    named one rank 1's, though rank 1's header is probed by the any-source receive too.
        if n >= 3:
            if rank == 0:
                anyw = dist.irecv(torch.zeros(2))
                t1 = torch.zeros(2)
                named = dist.irecv(t1, src=1)
                anyw.wait()
                out["any_first"] = anyw._source_rank()
                dist.barrier()
                named.wait()
                out["named"] = (named._source_rank(), t1.tolist())
            elif rank == 2:
                dist.send(torch.full((2,), 2.0), dst=0)
                dist.barrier()
            else:
                dist.barrier()
                if rank == 1:
                    dist.send(torch.full((2,), 1.0), dst=0)
        dist.barrier()
        # 3. A message of 4 floats into a receive of 3 (any source): that receive fails naming
        #    both sizes; the next message from the same rank still arrives intact.
        if rank == 0:
            out["wrong_size"] = _caught(lambda: dist.recv(torch.zeros(3)))
            t = torch.zeros(5)
            out["after_wrong"] = (dist.recv(t, src=1), t.tolist())
        elif rank == 1:
            dist.send(torch.ones(4), dst=0)
            dist.send(torch.arange(5.0), dst=0)
        dist.barrier()
        # 4. In a group with a 2 s timeout, nobody sends: the any-source receive times out after
        #    2 s, and the group still works (its probes outlive it).
        quick = dist.new_group(list(range(n)), timeout=timedelta(seconds=2))
        if rank == 0:
            out["timeout"] = _caught(lambda: dist.recv(torch.zeros(1), group=quick))
        dist.barrier()
        if rank == 0:
            t = torch.zeros(1)
            out["after_timeout"] = (dist.recv(t, group=quick), t.item())
        elif rank == n - 1:
            dist.send(torch.full((1,), 7.0), dst=0, group=quick)
        if rank == 0:
            out["self"] = _caught(lambda: dist.distributed_c10d._get_default_group().recv(
                [torch.zeros(1)], 0))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return out


def torch_timeouts(rank: int, n: int, store_path: str) -> Dict[str, Any]:
    """A group's timeout bounds its barrier and collectives; a timeout in the operation's options
    overrides it; Work.wait(timeout) bounds the wait alone. Each case gets a group of its own:
    a timed-out operation aborts its communicator."""
    import torch
    dist = _init_torch(rank, n, "railyard", store_path)
    out: Dict[str, Any] = {}
    try:
        # Rank 0 alone enters the barrier of a group whose timeout is 1 s.
        g = dist.new_group(list(range(n)), timeout=timedelta(seconds=1))
        if rank == 0:
            out["barrier"] = _caught(lambda: dist.barrier(group=g))
            out["after_abort"] = _caught(lambda: dist.all_reduce(torch.ones(1), group=g))
        dist.barrier()
        # A 0.5 s timeout in AllreduceOptions, in a group whose own is 60 s.
        g = dist.new_group(list(range(n)), timeout=timedelta(seconds=60))
        if rank == 0:
            opts = dist.AllreduceOptions()
            opts.timeout = timedelta(seconds=0.5)
            out["opts"] = _caught(lambda: g.allreduce([torch.ones(1)], opts).wait())
        dist.barrier()
        # Work.wait(0.3 s) gives up waiting; the operation goes on and completes once the other
        # ranks join it.
        g = dist.new_group(list(range(n)), timeout=timedelta(seconds=60))
        t = torch.ones(2)
        if rank == 0:
            work = dist.all_reduce(t, group=g, async_op=True)
            out["wait"] = _caught(lambda: work.wait(timedelta(seconds=0.3)))
            dist.barrier()
            work.wait()
            out["later"] = t.tolist()
        else:
            dist.barrier()
            dist.all_reduce(t, group=g)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return out


def torch_monitored_barrier(rank: int, n: int, store_path: str) -> Dict[str, Any]:
    """dist.monitored_barrier: passes when every rank comes; otherwise rank 0 names the missing
    ranks (the first, or all with wait_all_ranks) and the others fail instead of waiting.
    Every failing case gets a group of its own (a missing rank aborts it)."""
    import torch
    dist = _init_torch(rank, n, "railyard", store_path)
    out: Dict[str, Any] = {}
    try:
        dist.all_reduce(torch.ones(1))
        dist.monitored_barrier(timeout=timedelta(seconds=30))
        dist.monitored_barrier(timeout=30.0, wait_all_ranks=True)
        out["passed"] = True
        # Rank 1 stays away.
        g = dist.new_group(list(range(n)))
        if rank != 1:
            out["missing_1"] = _caught(lambda: dist.monitored_barrier(
                g, timeout=timedelta(seconds=1)))
        dist.barrier()
        # Only rank 0 comes, and waits for all the others.
        g = dist.new_group(list(range(n)))
        if rank == 0:
            out["wait_all"] = _caught(lambda: dist.monitored_barrier(
                g, timeout=timedelta(seconds=0.5), wait_all_ranks=True))
            out["zero"] = _caught(lambda: dist.monitored_barrier(g, timeout=timedelta(0)))
            out["bad_timeout"] = _caught(lambda: dist.monitored_barrier(g, timeout="1s"))
        dist.barrier()
        # A subgroup of ranks 0 and 1: the others are not in it (a no-op for them).
        g = dist.new_group([0, 1])
        dist.monitored_barrier(g, timeout=timedelta(seconds=30))
        out["subgroup"] = True
    finally:
        dist.destroy_process_group()
    return out


def torch_sparse_all_reduce(rank: int, n: int, store_path: str) -> Dict[str, Any]:
    """all_reduce of sparse COO tensors (sum): rank r holds entries (r, i) = r + 1 + i for
    i < r + 1 (duplicated, uncoalesced, on rank 1), dense rows too; then bad input."""
    import torch
    dist = _init_torch(rank, n, "railyard", store_path)
    out: Dict[str, Any] = {}
    try:
        for name, dtype in (("float64", torch.float64), ("int64", torch.int64),
                            ("bfloat16", torch.bfloat16)):
            idx = torch.tensor([[rank] * (rank + 1), list(range(rank + 1))])
            val = torch.arange(rank + 1, dtype=torch.float64) + rank + 1
            if rank == 1:  # every entry twice (value - 1, then 1): coalescing adds them up
                idx = torch.cat([idx, idx], 1)
                val = torch.cat([val - 1, torch.ones_like(val)])
            t = torch.sparse_coo_tensor(idx, val.to(dtype), (n, n))
            dist.all_reduce(t)
            out[name] = {"dense": t.to_dense().to(torch.float64).numpy(),
                         "coalesced": t.is_coalesced(), "dtype": str(t.dtype)}
        # Hybrid (one sparse dim, dense rows of 2); rank 0 contributes nothing.
        idx = torch.tensor([[rank % n]]) if rank else torch.zeros((1, 0), dtype=torch.int64)
        val = torch.full((1, 2), float(rank)) if rank else torch.zeros((0, 2))
        t = torch.sparse_coo_tensor(idx, val, (n, 2))
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        out["hybrid"] = t.to_dense().numpy()
        # Nothing anywhere.
        t = torch.sparse_coo_tensor(torch.zeros((2, 0), dtype=torch.int64), torch.zeros(0),
                                    (n, n))
        dist.all_reduce(t)
        out["empty_nnz"] = t._nnz()
        out["csr"] = _caught(lambda: dist.all_reduce(torch.eye(2).to_sparse_csr()))
        out["max"] = _caught(lambda: dist.all_reduce(
            torch.sparse_coo_tensor(torch.zeros((1, 1), dtype=torch.int64), torch.ones(1),
                                    (n,)), op=dist.ReduceOp.MAX))
        # Ranks disagree on the shape: every rank refuses, and the group stays in step.
        out["shapes"] = _caught(lambda: dist.all_reduce(
            torch.sparse_coo_tensor(torch.zeros((1, 1), dtype=torch.int64), torch.ones(1),
                                    (n + (rank == 1),))))
        out["after"] = _all_reduce_one()
    finally:
        dist.destroy_process_group()
    return out


def torch_reduce_scatter_ops(rank: int, n: int, store_path: str,
                             dtype_name: str) -> Dict[str, Any]:
    """Beyond what gloo does on torch 1.13: reduce_scatter (list and single tensor) with every
    reduce op, all_reduce AVG, in the given dtype. Rank r's input is arange(2n) + r + 1."""
    import torch
    dist = _init_torch(rank, n, "railyard", store_path)
    dtype = getattr(torch, dtype_name)
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
           "prod": dist.ReduceOp.PRODUCT}
    if dtype.is_floating_point:
        ops["avg"] = dist.ReduceOp.AVG
    out: Dict[str, Any] = {}
    try:
        for name, op in ops.items():
            x = (torch.arange(2 * n, dtype=torch.float64) % 4 + rank + 1).to(dtype)
            o = torch.zeros(2, dtype=dtype)
            dist.reduce_scatter(o, list(x.chunk(n)), op=op)
            out[f"list_{name}"] = o.to(torch.float64).numpy()
            o = torch.zeros(2, dtype=dtype)
            scatter_tensor = getattr(dist, "reduce_scatter_tensor", dist._reduce_scatter_base)
            scatter_tensor(o, x, op=op)
            out[f"tensor_{name}"] = o.to(torch.float64).numpy()
            t = x.clone()
            dist.all_reduce(t, op=op)
            out[f"all_reduce_{name}"] = t.to(torch.float64).numpy()
        out["bad_list"] = _caught(lambda: dist.reduce_scatter(
            torch.zeros(2, dtype=dtype), [torch.zeros(2, dtype=dtype)] * (n + 1)))
        out["bad_size"] = _caught(lambda: dist._reduce_scatter_base(
            torch.zeros(2, dtype=dtype), torch.zeros(2 * n + 1, dtype=dtype)))
        out["after"] = _all_reduce_one()
    finally:
        dist.destroy_process_group()
    return out


def ddp_no_sync(rank: int, n: int, store_path: str, backend: str) -> Dict[str, Any]:
    """DDP gradient accumulation: two backward passes under no_sync() (local gradients only),
    then one synced pass, whose all_reduce averages all three. Returns the gradients after
    the no_sync passes and after the synced one (PyTorch's own test of this cannot run for a
    plugin backend: see test_torch_distributed_suite.NOT_APPLICABLE)."""
    import torch
    dist = _init_torch(rank, n, backend, store_path)
    ddp = None
    try:
        torch.manual_seed(7)
        model = torch.nn.Linear(4, 2)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        gen = torch.Generator().manual_seed(100 + rank)
        batches = [torch.randn(3, 4, generator=gen) for _ in range(3)]
        with ddp.no_sync():
            for x in batches[:2]:
                ddp(x).sum().backward()
        local = [p.grad.detach().clone().numpy() for p in model.parameters()]
        ddp(batches[2]).sum().backward()
        synced = [p.grad.detach().clone().numpy() for p in model.parameters()]
    finally:
        ddp = None
        dist.destroy_process_group()
    return {"local": local, "synced": synced}


def ddp_train(rank: int, n: int, store_path: str, backend: str, steps: int,
              seed: int = 1234) -> Dict[str, Any]:
    """A small MLP trained with DDP; returns per-step losses (of this rank's batch, and averaged
    over ranks) and the final parameters."""
    import gc
    import weakref

    import torch
    dist = _init_torch(rank, n, backend, store_path)
    ddp = loss = None
    try:
        torch.manual_seed(seed)  # the same initial model everywhere (DDP broadcasts it anyway)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 1))
        # A small bucket cap: several buckets, so DDP overlaps async all_reduces with backward.
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.002)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator().manual_seed(seed + 1 + rank)
        w_true = torch.linspace(-1, 1, 16)
        losses: List[float] = []
        mean_losses: List[float] = []
        for _ in range(steps):
            x = torch.randn(64, 16, generator=gen)
            y = (x @ w_true).unsqueeze(1) + 0.1 * torch.randn(64, 1, generator=gen)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            mean_losses.append(mean.item() / n)
        params = [p.detach().numpy().copy() for p in model.parameters()]
    finally:
        # Free the DDP model while the process group is still registered, then destroy the group.
        # The order matters for gloo (torch 1.13): whoever drops the last reference to a
        # ProcessGroupGloo runs its destructor, which joins the group's worker threads. The
        # group's Python object releases the GIL for that; DDP's C++ Reducer does not. A DDP
        # model that outlives destroy_process_group() (here: until this frame goes) makes its
        # Reducer end the group with the GIL held, and a worker that still has to free a tensor
        # with a Python object (the last all_reduce's `mean`, which it holds for a moment after
        # completing it) then waits for the GIL forever: the rank hangs in ~ProcessGroupGloo,
        # now and then under CPU load. Freed first, the Reducer only drops a reference.
        if ddp is not None:
            alive = weakref.ref(ddp.reducer)
            ddp = loss = None
            if alive() is not None:  # only in a reference cycle: let the collector free it now
                gc.collect()
        dist.destroy_process_group()
    return {"losses": losses, "mean_losses": mean_losses, "params": params}


def noop(rank: int) -> int:
    return rank


def pid(rank: int) -> Optional[int]:
    return os.getpid()


def ddp_compressed(rank: int, n: int, store_path: str, codec: str, feedback: bool,
                   steps: int, seed: int = 0) -> Dict[str, Any]:
    """examples/python/ddp_train.py's MLP and data under DDP, its buckets all-reduced by
    railyard.torch.compression_hook(codec) (codec "": DDP's own allreduce); returns the loss
    averaged over ranks per step and the final parameters."""
    import gc
    import weakref

    import torch
    import railyard.torch as rt
    dist = _init_torch(rank, n, "railyard", store_path)
    ddp = loss = None
    try:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 1))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        if codec:
            ddp.register_comm_hook(None, rt.compression_hook(codec, error_feedback=feedback))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(seed + 1 + rank)
        w_true = torch.randn(32, 1, generator=torch.Generator().manual_seed(seed)) / 32 ** 0.5
        mean_losses: List[float] = []
        for _ in range(steps):
            x = torch.randn(128, 32, generator=gen)
            y = x @ w_true + 0.05 * torch.randn(128, 1, generator=gen)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            mean_losses.append(mean.item() / n)
        params = [p.detach().numpy().copy() for p in model.parameters()]
    finally:
        if ddp is not None:  # see ddp_train
            alive = weakref.ref(ddp.reducer)
            ddp = loss = None
            if alive() is not None:
                gc.collect()
        dist.destroy_process_group()
    return {"mean_losses": mean_losses, "params": params}


def compressed_reduce_scatter(rank: int, n: int, comm_id: str, codec: str,
                              count: int) -> Dict[str, Any]:
    """reduce_scatter of n * count float32 under ``codec`` (docs/compression.md); also the
    refusals of a bad codec and a bad key. Rank r's input element i is sin(0.01 i + r)."""
    import railyard
    c = client()
    comm = c.comm(comm_id, rank, n, timeout=OP_TIMEOUT)
    try:
        x = np.sin(0.01 * np.arange(n * count, dtype=np.float64) + rank).astype(np.float32)
        out = comm.reduce_scatter(x, "sum", compression=codec, timeout=OP_TIMEOUT)
        refused = {}
        for name, kw in (("codec", {"compression": "int9"}),
                         ("key", {"compression": codec, "compression_key": -1})):
            try:
                comm.reduce_scatter(x, "sum", timeout=OP_TIMEOUT, **kw)
                refused[name] = None
            except railyard.RailyardError as e:
                refused[name] = str(e)
        return {"out": np.asarray(out).tolist(), "refused": refused}
    finally:
        comm.close()


def torch_cuda_collectives(rank: int, n: int, store_path: str) -> Dict[str, Any]:
    """torch.distributed on cuda tensors (device 0, shared by the ranks) through the railyard
    backend (tests/python/test_torch_cuda.py, on a GPU only). Each input is written by stream work
    that runs after ~20 ms of GPU sleep: an operation that did not wait for its stream would read
    the old values. Then three DDP steps on cuda."""
    import torch
    dist = _init_torch(rank, n, "railyard", store_path)
    torch.cuda.set_device(0)
    out: Dict[str, Any] = {}
    try:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            t = torch.zeros(1 << 20, device="cuda")
            torch.cuda._sleep(40_000_000)
            t.fill_(rank + 1.0)
            work = dist.all_reduce(t, async_op=True)
            doubled = t * 2  # stream work after the operation: it reads the result
            m = torch.arange(24, dtype=torch.float32, device="cuda").view(6, 4) + rank
            dist.all_reduce(m[:, 1], op=dist.ReduceOp.MAX)  # strided: through a contiguous copy
            gathered = torch.empty(n * 3, dtype=torch.bfloat16, device="cuda")
            dist.all_gather_into_tensor(gathered, torch.full((3,), rank, dtype=torch.bfloat16,
                                                             device="cuda"))
            outs = [torch.empty(2, dtype=torch.int64, device="cuda") for _ in range(n)]
            dist.all_gather(outs, torch.tensor([rank, -rank], device="cuda"))
            b = torch.full((5,), float(rank), device="cuda", dtype=torch.float64)
            dist.broadcast(b, src=n - 1)
        work.wait()
        stream.synchronize()
        out["all_reduce"] = doubled[:4].cpu().tolist()
        out["strided_max"] = m[:, 1].cpu().tolist()
        out["strided_rest"] = m[:, 0].cpu().tolist()
        out["all_gather_base"] = gathered.float().cpu().tolist()
        out["all_gather"] = [o.cpu().tolist() for o in outs]
        out["broadcast"] = b.cpu().tolist()
        # DDP on the GPU: every rank's parameters after 3 steps, against the same steps on CPU
        # with the gradient averaged by hand (rank r's batch is seeded by r).
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 4)
        reference = torch.nn.Linear(16, 4)
        reference.load_state_dict(model.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(model.cuda(), device_ids=[0])
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        for step in range(3):
            batches = [torch.Generator().manual_seed(100 * step + r) for r in range(n)]
            xs = [torch.randn(8, 16, generator=g) for g in batches]
            opt.zero_grad()
            ddp(xs[rank].cuda()).pow(2).sum().backward()
            opt.step()
            ref_opt.zero_grad()
            sum(reference(x).pow(2).sum() for x in xs).div(n).backward()
            ref_opt.step()
        out["ddp_max_diff"] = max(float((p.detach().cpu() - q.detach()).abs().max())
                                  for p, q in zip(model.parameters(), reference.parameters()))
    finally:
        dist.destroy_process_group()
    return out


# ---------------------------------------------------------------------------------------------
# Daemon handovers and restarts under running ranks (test_restart.py). The test steers the ranks
# through files in a control directory: "stop" ends the loop, "pause-p2p" holds sends and
# receives (the ranks say they hold none in flight with "paused-<rank>").


def _agree(comm: Any, flags: np.ndarray, agreed: np.ndarray) -> np.ndarray:
    """Sums every rank's flags: each rank decides on the same values (a collective never comes
    out differently on two ranks, not even across a restart), so all run the same operations."""
    comm.all_reduce(flags, out=agreed, timeout=OP_TIMEOUT)
    return agreed


def restart_loop(rank: int, n: int, comm_id: str, control: str, max_s: float) -> Dict[str, Any]:
    """Checked all_reduces (in place, out of place, and through the staging of a plain numpy
    array) and a ring of send/recv, over and over, while the test hands the daemon over or kills
    it. Returns the times of the completed iterations and of the completed exchanges, every
    failure (time, operation, code, message), every wrong result, and the client's reconnects."""
    import time

    import railyard
    c = railyard.connect(job=os.environ.get("RAILYARD_JOB", "pytest"))
    count = 4096
    base = np.arange(count, dtype=np.float32)

    def value(i: int, r: int) -> np.ndarray:  # small integers: float32 sums are exact
        return base + float((i * 31 + r * 7) % 1000)

    def total(i: int) -> np.ndarray:
        return sum(value(i, r) for r in range(n))

    out: Dict[str, Any] = {"iterations": [], "exchanges": [], "failures": [], "wrong": []}

    def run(what: str, work: Any) -> bool:
        try:
            work.wait(OP_TIMEOUT + 10)
            return True
        except railyard.RailyardError as e:
            out["failures"].append((time.time(), what, e.code.name, e.message))
            return False

    def check(what: str, i: int, got: np.ndarray, want: np.ndarray) -> None:
        if not np.array_equal(got, want):
            bad = int(np.argmax(got != want))
            out["wrong"].append((time.time(), what, i, bad, float(got[bad]), float(want[bad])))

    try:
        comm = c.comm(comm_id, rank, n, timeout=OP_TIMEOUT)
        inplace = c.empty(count, np.float32)
        src, dst = c.empty(count, np.float32), c.empty(count, np.float32)
        plain_src, plain_dst = np.empty(count, np.float32), np.empty(count, np.float32)
        sbuf, rbuf = c.empty(count, np.float32), c.empty(count, np.float32)
        flags, agreed = c.empty(2, np.float32), c.empty(2, np.float32)
        to, frm = (rank + 1) % n, (rank - 1) % n
        deadline = time.monotonic() + max_s
        paused_file = os.path.join(control, f"paused-{rank}")
        i = 0
        while True:
            flags[0] = os.path.exists(os.path.join(control, "stop")) or time.monotonic() > deadline
            flags[1] = os.path.exists(os.path.join(control, "pause-p2p"))
            try:
                _agree(comm, flags, agreed)
            except railyard.RailyardError as e:
                out["failures"].append((time.time(), "agree", e.code.name, e.message))
                continue
            if agreed[0] > 0:
                break
            paused = agreed[1] > 0
            if paused and not os.path.exists(paused_file):
                open(paused_file, "w").close()  # no send or receive of this rank is in flight
            elif not paused and os.path.exists(paused_file):
                os.unlink(paused_file)
            inplace[:] = value(i, rank)
            src[:] = value(i + 1, rank)
            plain_src[:] = value(i + 2, rank)
            works = [("all_reduce in place", comm.all_reduce(inplace, async_op=True,
                                                             timeout=OP_TIMEOUT)),
                     ("all_reduce out of place", comm.all_reduce(src, out=dst, async_op=True,
                                                                 timeout=OP_TIMEOUT)),
                     ("all_reduce staged", comm.all_reduce(plain_src, out=plain_dst,
                                                           async_op=True, timeout=OP_TIMEOUT))]
            results = [run(what, w) for what, w in works]
            if results[0]:
                check("all_reduce in place", i, inplace, total(i))
            if results[1]:
                check("all_reduce out of place", i, dst, total(i + 1))
                check("all_reduce out of place: its input", i, src, value(i + 1, rank))
            if results[2]:
                check("all_reduce staged", i, plain_dst, total(i + 2))
            ok = all(results)
            if not paused:
                sbuf[:] = value(i + 3, rank)
                ws = comm.send(sbuf, to, async_op=True, timeout=OP_TIMEOUT)
                wr = comm.recv(rbuf, frm, async_op=True, timeout=OP_TIMEOUT)
                sent, got = run("send", ws), run("recv", wr)
                if got:
                    check("recv", i, rbuf, value(i + 3, frm))
                if sent and got:
                    out["exchanges"].append(time.time())
                ok = ok and sent and got
            if ok:
                out["iterations"].append(time.time())
            i += 1
        comm.close()
    finally:
        out["reconnects"] = c.reconnects
        c.close()
    return out


def ddp_across_handover(rank: int, n: int, store_path: str, steps: int,
                        control: Optional[str]) -> Dict[str, Any]:
    """A small DDP training loop on the railyard backend. With ``control``, rank 0 says when
    the loop is under way ("training") and both ranks wait, a little later, for the test to have
    handed the daemon over ("handed-over"): the handover lands among the loop's steps, its
    bucketed all_reduces in flight. Returns the losses, the final parameters and the session's
    reconnects."""
    import time

    import torch
    from railyard.torch.process_group import shared_client
    dist = _init_torch(rank, n, "railyard", store_path)
    ddp = loss = None
    try:
        torch.manual_seed(1234)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 1))
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator().manual_seed(99 + rank)
        losses: List[float] = []
        for step in range(steps):
            if control is not None and step == 2 and rank == 0:
                open(os.path.join(control, "training"), "w").close()
            if control is not None and step == steps - 3:
                give_up = time.monotonic() + 60
                while not os.path.exists(os.path.join(control, "handed-over")):
                    assert time.monotonic() < give_up, "the test never handed the daemon over"
                    time.sleep(0.01)
            x = torch.randn(32, 16, generator=gen)
            y = x.sum(dim=1, keepdim=True).tanh()
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item())
            if control is not None:
                time.sleep(0.01)  # the handover lands among steps, not after the last
        params = [p.detach().numpy().copy() for p in model.parameters()]
    finally:
        ddp = loss = None
        dist.destroy_process_group()
    return {"losses": losses, "params": params, "reconnects": shared_client().reconnects}
