"""The ``"railyard"`` backend of ``torch.distributed`` (CPU tensors; ``cuda`` tensors in the
operations :data:`_ON_DEVICES` lists, ordered on their current stream: docs/gpu.md, "From torch").

Importing this module registers the backend::

    import torch.distributed as dist
    import railyard.torch  # noqa: F401  (registers "railyard")

    dist.init_process_group("railyard", rank=rank, world_size=world_size, store=store)
    # or init_method="env://" / "tcp://..." like any backend (torchrun works unchanged)
    model = torch.nn.parallel.DistributedDataParallel(model)

Each process talks to its node's railyardd (``RAILYARD_SOCKET``, ``RAILYARD_JOB``,
``RAILYARD_TOKEN`` as for :func:`railyard.connect`). Rank 0 of every process group creates a
communicator id and publishes it through the group's c10d store; every rank then joins it.

How it is built, and why: :class:`ProcessGroupRailyard` is a *Python* subclass of
``torch.distributed.ProcessGroup``. PyTorch 1.13 ships a pybind11 trampoline
(``c10d::PyProcessGroup``) that forwards the C++ virtual calls DDP makes (``allreduce``,
``broadcast``, ``allgather``, ``barrier``...) to Python overrides, and
``Backend.register_backend`` accepts a Python creator, so no C++ extension (and no libtorch
headers, which Debian's python3-torch does not ship) is needed. Works returned to PyTorch are
Python subclasses of ``Work``: PyTorch's own ``_create_work_from_future`` wrapper would do for
DDP, but its ``wait()`` ignores the future's error (a failed ``dist.all_reduce`` would look
successful), so the Python ``Work`` here raises instead and hands DDP a ``torch.futures.Future``
from ``get_future()``. Such a Python object must outlive every C++ call on it (otherwise the
trampoline falls back to the base class, whose ``wait()`` never returns), so each one is kept
alive until its operation has completed *and* it has been waited on or had its future taken.

Supported: ``all_reduce`` (sum, product, min, max, avg; sum of sparse COO tensors too),
``broadcast``, ``reduce``, ``all_gather`` (list, ``_all_gather_base``/``all_gather_into_tensor``
and ``all_gather_coalesced``), ``reduce_scatter`` (list and ``_reduce_scatter_base``),
``all_to_all`` (list and ``all_to_all_single`` with or without split sizes), ``gather``,
``scatter``, ``send``/``recv`` (from a given rank or from any source; tags are ignored: messages
between two ranks match in order), ``barrier``, ``monitored_barrier`` and ``allreduce_coalesced``,
on CPU tensors of float32/64, float16, bfloat16, int8, uint8, int32, int64 (and, for the
operations that do not reduce, any dtype; complex for sum/avg). Tensors are copied into shared
staging memory and back, except those from :func:`empty`, which live in shared memory (zero copy).

Timeouts: every operation is bounded by the group's timeout (``init_process_group(timeout=)``,
``new_group(timeout=)``) or by the one in its options where PyTorch passes one; past it the
daemon fails the operation with a :class:`railyard.DeadlineExceededError` ("Timed out after ...")
and aborts the communicator, so that the other ranks fail too instead of waiting.

Point-to-point messages carry a small header (element count and dtype) ahead of the payload: a
receive from any source takes whichever peer's header arrives first (see :class:`_PointToPoint`).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import os
import threading
import time
import traceback
import weakref
import zlib
from datetime import timedelta
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist

import railyard
from railyard import _types
from railyard import errors as _errors
from railyard.client import _sleep_until_done, _timeout_ms
from railyard.v1 import common_pb2 as _common_pb2

from ._device_tensors import CudaTensors, DeviceTensors, numpy_dtype

__all__ = ["ProcessGroupRailyard", "BACKEND", "empty", "create_process_group",
           "compression_hook", "DeviceTensors", "CudaTensors"]

#: The backend name, for ``dist.init_process_group(BACKEND, ...)``.
BACKEND = "railyard"

_Work = torch._C._distributed_c10d.Work
_STORE_KEY = "railyard/comm_id"
_INIT_COUNT_KEY = "railyard/inits"
_MAX_TIMEOUT = 4_000_000.0  # seconds (the daemon takes up to 2^32 - 1 ms)


# ---------------------------------------------------------------------------------------------
# Tensors <-> numpy views


_RED_OPS = (("sum", dist.ReduceOp.SUM), ("prod", dist.ReduceOp.PRODUCT),
            ("min", dist.ReduceOp.MIN), ("max", dist.ReduceOp.MAX), ("avg", dist.ReduceOp.AVG))


def _red_op(op: Any) -> str:
    for name, ref in _RED_OPS:
        if op == ref:
            return name
    raise ValueError(f"railyard: reduce op {op} is not supported "
                     "(supported: SUM, PRODUCT, MIN, MAX, AVG)")


# The lean path of a small all_reduce (ProcessGroupRailyard._small_allreduce): wire numbers by
# torch dtype and reduce op, and the largest tensor it takes (beyond, the staging copies cost more
# than the Python it saves).
_WIRE_DTYPES = {t: _types.dtype_number(np.dtype(n)) for t, n in (
    (torch.float32, np.float32), (torch.float64, np.float64), (torch.float16, np.float16),
    (torch.int8, np.int8), (torch.uint8, np.uint8), (torch.int32, np.int32),
    (torch.int64, np.int64))}
_WIRE_DTYPES[torch.bfloat16] = _types.DTYPE_BFLOAT16
_WIRE_RED_OPS = {ref: _types.red_op_number(name) for name, ref in _RED_OPS}
_SMALL_BYTES = 64 << 10
_ALL_REDUCE = _common_pb2.COLLECTIVE_OP_ALL_REDUCE


_ON_DEVICES = ("all_reduce, all_reduce_coalesced, broadcast, reduce, all_gather, "
               "all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, "
               "all_to_all_single and barrier")


def _check_tensor(t: Any, what: str, devices: Optional[DeviceTensors] = None) -> torch.Tensor:
    """``t`` if the operation ``what`` can take it: a dense CPU tensor, or a device tensor
    ``devices`` serves (``None``: host memory only)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"railyard: {what} must be a tensor, got {type(t).__name__}")
    if t.device.type != "cpu" and (devices is None or not devices.owns(t)):
        if devices is None:
            raise ValueError(f"railyard: {what} is on {t.device}; the railyard backend runs it "
                             f"on CPU tensors only (device tensors: {_ON_DEVICES})")
        raise ValueError(f"railyard: {what} is on {t.device}; the railyard backend takes CPU "
                         f"tensors and {devices.kind} only")
    if t.layout != torch.strided:
        raise ValueError(f"railyard: {what} has layout {t.layout}; only dense tensors are "
                         "supported here (all_reduce also takes sparse COO tensors)")
    return t


def _as_numpy(t: torch.Tensor, red: Optional[str]) -> Tuple[np.ndarray, Optional[str]]:
    """A numpy view of contiguous ``t`` and the ``dtype=`` override for railyard.

    Reductions need a dtype the daemon reduces; other operations move any dtype as bytes.
    """
    if t.requires_grad:  # numpy() refuses it; detach() costs ~3 us, so only then
        t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), "bfloat16"
    if t.is_complex():
        _refuse_red(t.dtype, red)
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        _refuse_red(t.dtype, red)
        arr = t.view(torch.uint8).numpy()
    else:
        arr = t.numpy()
    if arr.dtype in railyard.SUPPORTED_DTYPES:
        return arr, None
    _refuse_red(t.dtype, red, unsupported=True)
    return arr.reshape(-1).view(np.uint8), None


def _refuse_red(dtype: torch.dtype, red: Optional[str], unsupported: bool = False) -> None:
    """Raises when tensors of ``dtype`` cannot be reduced with ``red`` (None: no reduction)."""
    if red is None:
        return
    if dtype.is_complex and red not in ("sum", "avg"):
        raise ValueError(f"railyard: {red} is not defined for complex tensors")
    if dtype == torch.bool and red not in ("min", "max"):
        raise ValueError(f"railyard: {red} is not supported for bool tensors (min/max are)")
    if unsupported:
        raise ValueError(f"railyard: dtype {dtype} cannot be reduced (supported: float32, "
                         "float64, float16, bfloat16, int8, uint8, int32, int64)")


def _as_device_array(reg: "railyard.DeviceArray", t: torch.Tensor,
                     red: Optional[str]) -> Tuple["railyard.DeviceArray", Optional[str]]:
    """What :func:`_as_numpy` is for host tensors, for ``reg``: the bytes of a device tensor
    ``t`` (uint8), seen as the dtype the daemon reduces (or left as bytes)."""
    if t.dtype == torch.bfloat16:
        return reg.view(np.int16), "bfloat16"
    _refuse_red(t.dtype, red)
    if t.is_complex():
        dt = numpy_dtype(torch.float32 if t.dtype == torch.complex64 else torch.float64)
    elif t.dtype == torch.bool:
        dt = np.dtype(np.uint8)
    else:
        dt = numpy_dtype(t.dtype)
    if dt in railyard.SUPPORTED_DTYPES:
        return reg.view(dt), None
    _refuse_red(t.dtype, red, unsupported=True)
    return reg, None


class _Io:
    """Numpy views of an operation's tensors: non-contiguous tensors go through contiguous
    copies, copied back into the originals once the operation completes."""

    def __init__(self) -> None:
        self.copy_back: List[Tuple[torch.Tensor, torch.Tensor]] = []

    def input(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.is_contiguous() else t.contiguous()

    def output(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous():
            return t
        tmp = t.contiguous()
        self.copy_back.append((tmp, t))
        return tmp

    def finish(self) -> None:
        if not self.copy_back:
            return
        with torch.no_grad():
            for tmp, t in self.copy_back:
                t.copy_(tmp)


class _DeviceIo(_Io):
    """An :class:`_Io` for device tensors: the contiguous copies are device tensors, and the
    copies into and out of them are work on the operation's stream."""

    def __init__(self, devices: DeviceTensors, stream: Any) -> None:
        super().__init__()
        self._devices = devices
        self._stream = stream

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        tmp = self._devices.empty(tuple(t.shape), t.dtype, t)

        def copy() -> None:
            with torch.no_grad():
                tmp.copy_(t)

        self._devices.on_stream(self._stream, copy)
        return tmp

    def input(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.is_contiguous() else self._copy(t)

    def output(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous():
            return t
        tmp = self._copy(t)
        self.copy_back.append((tmp, t))
        return tmp


# ---------------------------------------------------------------------------------------------
# Work


class _Worker:
    """A thread of this process that runs functions in the order they were queued, and timers
    (``call_at``), off the railyard client's threads: completion callbacks only queue here."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._queue: Deque[Callable[[], None]] = collections.deque()
        self._timers: List[Tuple[float, int, Callable[[], None]]] = []
        self._ids = itertools.count()
        self._pid = -1

    def _ensure_thread(self) -> None:  # under self._cond
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._queue.clear()
            self._timers = []
            threading.Thread(target=self._run, daemon=True, name=self._name).start()

    def submit(self, fn: Callable[[], None]) -> None:
        with self._cond:
            self._ensure_thread()
            self._queue.append(fn)
            self._cond.notify()

    def call_at(self, deadline: float, fn: Callable[[], None]) -> None:
        """Runs ``fn`` once ``time.monotonic()`` reaches ``deadline``."""
        with self._cond:
            self._ensure_thread()
            heapq.heappush(self._timers, (deadline, next(self._ids), fn))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if self._queue:
                        fn = self._queue.popleft()
                        break
                    if self._timers and self._timers[0][0] <= now:
                        fn = heapq.heappop(self._timers)[2]
                        break
                    self._cond.wait(self._timers[0][0] - now if self._timers else None)
            try:
                fn()
            except Exception:  # pragma: no cover - a callback's bug must not stop the thread
                traceback.print_exc()


# Torch futures are completed on their own thread, so that their callbacks (DDP comm hooks,
# ``Future.then``) never run on, and never block, the railyard client's event thread. The
# point-to-point protocol posts its follow-up receives from another (a comm hook that waits must
# not hold them up).
_futures = _Worker("railyard-torch-futures")
_p2p_worker = _Worker("railyard-torch-p2p")


# Works kept alive until completed and consumed (see the module docstring). A work nobody ever
# waits on (async_op=True, handle dropped) would stay forever: past this many entries, completed
# ones are let go (PyTorch's own C++ callers consume a work right after the call that made it).
_live_works: Dict[int, "Work"] = {}
_live_lock = threading.Lock()
_LIVE_PRUNE_AT = 4096


def _keep_alive(work: "Work") -> None:
    with _live_lock:
        if len(_live_works) >= _LIVE_PRUNE_AT:
            for key in [k for k, w in _live_works.items() if w._done]:
                del _live_works[key]
        _live_works[id(work)] = work


def _timed_out(seconds: Optional[float], what: str) -> "_errors.DeadlineExceededError":
    after = "" if seconds is None else f" after {seconds:g} s"
    return _errors.DeadlineExceededError(_errors.status_code(4), f"Timed out{after}: {what}")


def _worded(error: Optional[BaseException], seconds: Optional[float]) -> Optional[BaseException]:
    """The daemon's deadline errors, worded as PyTorch's backends word theirs ("Timed out")."""
    if isinstance(error, _errors.DeadlineExceededError) and \
            not error.message.startswith("Timed out"):
        worded = _timed_out(seconds, error.message)
        worded.__cause__ = error
        return worded
    return error


def _cuda_devices(outputs: List[Any]) -> List[torch.device]:
    """The cuda devices of ``outputs`` (tensors, or lists of them)."""
    found: List[torch.device] = []
    for o in outputs:
        for t in (o if isinstance(o, (list, tuple)) else [o]):
            if isinstance(t, torch.Tensor) and t.device.type == "cuda" and t.device not in found:
                found.append(t.device)
    return found


class Work(_Work):
    """A railyard operation as a ``torch.distributed`` Work.

    ``wait()`` raises the operation's error (a :class:`railyard.RailyardError` subclass);
    ``get_future()`` returns a ``torch.futures.Future`` whose value is the list of output tensors
    (DDP uses it for its bucketed asynchronous all_reduce). An operation may take several daemon
    operations (a point-to-point message is a header and a payload): it completes when the last
    does, with the first error.
    """

    def __init__(self, outputs: List[Any],
                 post: Optional[Callable[[], None]] = None,
                 timeout: Optional[float] = None) -> None:
        super().__init__()
        self._outputs = outputs
        self._post = post
        self._timeout = timeout  # the operation's daemon-side timeout (for the error's words)
        self._lock = threading.Lock()
        # _done is set last, after _error; an Event (~2 us to make) only for a thread that
        # must sleep for it (a waiter on the session rings reads them itself until _done).
        self._done = False
        self._event: Optional[threading.Event] = None
        self._error: Optional[BaseException] = None
        self._future: Optional[torch.futures.Future] = None
        self._consumed = False
        self._source: Optional[int] = None  # recv: the rank the message came from
        # The last railyard work behind it: wait() reads the session rings for it on the waiting
        # thread (no hop through the client's reader thread).
        self._rw: Optional["railyard.Work"] = None
        _keep_alive(self)

    def _expect(self, rws: Sequence["railyard.Work"]) -> None:
        """Completes once every one of ``rws`` has (with the first error among them)."""
        self._rw = rws[-1]
        if len(rws) == 1:
            # wait() reads the rings for it itself: the background reader need not hurry.
            rws[0]._on_done(lambda rw: self._complete(rw.exception()))
            return
        left = [len(rws)]
        lock = threading.Lock()

        def one_done(_: "railyard.Work") -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            self._complete(next((rw.exception() for rw in rws if rw.exception() is not None),
                                None))

        for rw in rws:
            rw.add_done_callback(one_done)

    # Called once, when the operation ends (a client thread or the p2p worker).
    def _complete(self, error: Optional[BaseException]) -> None:
        with self._lock:
            if self._done:
                return
            post, self._post = self._post, None
        if error is None and post is not None:
            try:
                post()
            except Exception as e:
                error = e
        error = _worded(error, self._timeout)
        with self._lock:
            self._error = error
            self._done = True
            if self._event is not None:
                self._event.set()
            future = self._future
        if future is not None:
            _futures.submit(lambda: self._complete_future(future))
        self._maybe_release()

    def _complete_future(self, future: torch.futures.Future) -> None:
        if self._error is None:
            future.set_result(self._outputs)
        else:
            future.set_exception(self._error)

    def _maybe_release(self) -> None:
        if self._consumed and self._done:
            with _live_lock:
                _live_works.pop(id(self), None)

    def wait(self, timeout: Any = None) -> bool:
        """Waits for completion; raises the operation's error. ``timeout``: a ``timedelta`` or
        seconds (``None`` or zero: until the daemon answers, which the operation's own timeout
        bounds)."""
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        if timeout is not None and timeout <= 0:
            timeout = None
        deadline = None if timeout is None else time.monotonic() + timeout
        rw = self._rw
        if rw is not None and not self._done:
            rw._drive(deadline)
        if not self._done and not _sleep_until_done(self, deadline):
            raise _timed_out(timeout, "the railyard operation is not complete (it keeps running "
                                      "in the daemon; wait again or give up)")
        self._consumed = True
        self._maybe_release()
        if self._error is not None:
            raise self._error.with_traceback(None)
        return True

    def get_future(self) -> torch.futures.Future:
        """A future completed with the output tensors (or the error) when the operation ends."""
        with self._lock:
            if self._future is None:
                # A future whose value holds cuda tensors must name their devices (PyTorch
                # refuses the value otherwise) and is then stream-aware.
                self._future = torch.futures.Future(devices=_cuda_devices(self._outputs))
                if self._done:
                    future = self._future
                    _futures.submit(lambda: self._complete_future(future))
            future = self._future
            self._consumed = True
        if not self._done and self._rw is not None:
            self._rw._wanted_in_background()  # the future's waiters do not read the rings
        self._maybe_release()
        return future

    def is_completed(self) -> bool:
        if not self._done and self._rw is not None:
            self._rw._poll()
        return self._done

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._outputs

    def _source_rank(self) -> int:
        """The rank a completed receive got its message from (``dist.recv`` without ``src``
        returns it)."""
        if self._source is None or not self.is_success():
            raise RuntimeError("railyard: source_rank() is only defined for a receive that has "
                               "completed successfully (wait() on it first)")
        return self._source

    source_rank = _source_rank

    def synchronize(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# Process group


_clients: Dict[Tuple[int, str, str, str], "railyard.Client"] = {}
_clients_lock = threading.Lock()


def _shared_client() -> "railyard.Client":
    """One session per process (and daemon): every process group's comm shares it."""
    key = (os.getpid(), os.environ.get("RAILYARD_SOCKET", ""),
           os.environ.get("RAILYARD_JOB", ""), os.environ.get("RAILYARD_TOKEN", ""))
    with _clients_lock:
        client = _clients.get(key)
        if client is None or client.closed:
            client = railyard.connect()
            _clients[key] = client
        return client


def _seconds(timeout: Any, what: str) -> Optional[float]:
    """A ``timedelta`` or a number of seconds as float seconds (``None`` stays ``None``)."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        return float(timeout)
    raise TypeError(f"railyard: {what} must be a timedelta or seconds, got "
                    f"{type(timeout).__name__}")


def _raw_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of ``t`` (any dtype) as a flat uint8 array."""
    arr, _ = _as_numpy(t.contiguous(), None)
    return arr.reshape(-1).view(np.uint8)


def _from_raw_bytes(raw: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A flat tensor of ``dtype`` made of a copy of ``raw`` (uint8)."""
    if not raw.size:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(bytearray(raw.tobytes()), dtype=dtype)


_HEADER_WORDS = 2  # a point-to-point header: [element count, dtype id]


def _dtype_id(dtype: torch.dtype) -> int:
    return zlib.crc32(str(dtype).encode())


_DTYPES_BY_ID = {_dtype_id(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def _describe(numel: int, dtype_id: int) -> str:
    dtype = _DTYPES_BY_ID.get(dtype_id)
    return f"{numel} x {str(dtype).replace('torch.', '') if dtype else f'dtype {dtype_id}'}"


class _Claim:
    """A receive waiting for its message: from ``peer``, or from any source (``peer`` None)."""

    __slots__ = ("seq", "peer", "tensor", "out", "dt", "work", "timeout", "matched")

    def __init__(self, seq: int, peer: Optional[int], tensor: torch.Tensor, out: np.ndarray,
                 dt: Optional[str], work: Work, timeout: float) -> None:
        self.seq = seq
        self.peer = peer
        self.tensor = tensor
        self.out = out
        self.dt = dt
        self.work = work
        self.timeout = timeout
        self.matched = False


class _Inbound:
    """The receiving end of one peer's messages to this rank."""

    IDLE, PROBING, STASHED = range(3)
    __slots__ = ("state", "header", "arrival", "waiting")

    def __init__(self) -> None:
        # IDLE: no header receive of undecided owner outstanding; PROBING: one is; STASHED: one
        # arrived and nobody has claimed it yet (its payload is still to be received).
        self.state = _Inbound.IDLE
        self.header: Tuple[int, int] = (0, 0)
        self.arrival = 0
        self.waiting: Deque[_Claim] = collections.deque()  # non-empty only while PROBING


class _PointToPoint:
    """Point-to-point messages of one group, with receives from any source.

    The daemon matches the sends and receives between two ranks in FIFO order, each with a known
    peer. Every message here is two sends: a header (element count, dtype id) and the payload.

    - A receive from a known peer whose channel has nothing undecided posts the header and the
      payload receives at once (no extra round trip), and checks the header when both are in.
    - A receive from any source posts a header receive (a "probe") on every peer's channel that
      has none outstanding. The first header to arrive goes to the earliest receive waiting for
      it (from that peer, or from any); its payload receive is posted next, into that receive's
      tensor. A header nobody waits for any more is kept (stashed) for the next receive from
      that peer or from any.
    - A probe's daemon deadline is the longest there is (46 days): the daemon aborts the
      communicator when a send or receive outlives its deadline, and a peer may never send
      again. A receive waiting on a probe is bounded instead by a timer of its own (the
      operation's timeout), which fails that receive, not the communicator.

    A header that does not match the receiving tensor fails that receive with both sizes named;
    its payload is still received (and dropped), so that the channel stays in step.
    """

    def __init__(self, group: "ProcessGroupRailyard") -> None:
        self.group = group
        self.lock = threading.Lock()
        self.seq = itertools.count()
        self.arrivals = itertools.count(1)
        self.inbound = {p: _Inbound() for p in range(group.size()) if p != group.rank()}
        self.any: Deque[_Claim] = collections.deque()

    # -- sending -------------------------------------------------------------------------------

    def send(self, t: torch.Tensor, dst: int, timeout: float) -> List["railyard.Work"]:
        src, dt = _as_numpy(t.contiguous(), None)
        header = np.array([t.numel(), _dtype_id(t.dtype)], dtype=np.int64)
        comm = self.group.comm
        first = comm.send(header, dst, async_op=True, timeout=timeout)
        return [first, comm.send(src, dst, dtype=dt, async_op=True, timeout=timeout)]

    # -- receiving -----------------------------------------------------------------------------

    def _peer(self, src: int) -> _Inbound:
        ch = self.inbound.get(src)
        if ch is None:
            raise ValueError(f"railyard: recv from rank {src}: not a peer of rank "
                             f"{self.group.rank()} in a group of {self.group.size()}")
        return ch

    def recv(self, claim: _Claim) -> None:
        assert claim.peer is not None
        with self.lock:
            ch = self._peer(claim.peer)
            if ch.state == _Inbound.IDLE:  # nothing undecided ahead: header and payload at once
                self._post_both(claim)
                return
            if ch.state == _Inbound.STASHED:
                self._deliver(claim.peer, claim, *ch.header)
                return
            ch.waiting.append(claim)
        self._arm(claim)

    def recv_any(self, claim: _Claim) -> None:
        with self.lock:
            if not self.inbound:
                raise ValueError("railyard: recv from any source in a group of one rank")
            stashed = [p for p, ch in self.inbound.items() if ch.state == _Inbound.STASHED]
            if stashed:
                p = min(stashed, key=lambda q: self.inbound[q].arrival)
                self._deliver(p, claim, *self.inbound[p].header)
                return
            self.any.append(claim)
            for p, ch in self.inbound.items():
                if ch.state == _Inbound.IDLE:
                    self._probe(p)
        self._arm(claim)

    # The rest runs under self.lock.

    def _post_both(self, claim: _Claim) -> None:
        peer = claim.peer
        header = np.zeros(_HEADER_WORDS, dtype=np.int64)
        comm = self.group.comm
        want = (claim.tensor.numel(), _dtype_id(claim.tensor.dtype))

        def check() -> None:
            got = (int(header[0]), int(header[1]))
            if got != want:
                raise ValueError(f"railyard: recv from rank {peer}: it sent "
                                 f"{_describe(*got)}, the receiving tensor holds "
                                 f"{_describe(*want)}")
            claim.work._source = peer

        claim.matched = True
        claim.work._post = _then(check, claim.work._post)
        first = comm.recv(header, peer, async_op=True, timeout=claim.timeout)
        claim.work._expect([first, comm.recv(claim.out, peer, dtype=claim.dt, async_op=True,
                                             timeout=claim.timeout)])

    def _probe(self, p: int) -> None:
        ch = self.inbound[p]
        header = np.zeros(_HEADER_WORDS, dtype=np.int64)
        ch.state = _Inbound.PROBING
        try:
            rw = self.group.comm.recv(header, p, async_op=True, timeout=_MAX_TIMEOUT)
        except Exception as e:
            ch.state = _Inbound.IDLE
            self._fail_waiting(p, e)
            return
        rw.add_done_callback(lambda w: _p2p_worker.submit(lambda: self._arrived(p, w, header)))

    def _arrived(self, p: int, rw: "railyard.Work", header: np.ndarray) -> None:
        with self.lock:
            ch = self.inbound[p]
            ch.state = _Inbound.IDLE
            error = rw.exception()
            if error is not None:  # the communicator failed or closed: so do its receives
                self._fail_waiting(p, error)
                return
            claim = self._next_claim(p)
            if claim is None:
                ch.state = _Inbound.STASHED
                ch.header = (int(header[0]), int(header[1]))
                ch.arrival = next(self.arrivals)
                return
            self._deliver(p, claim, int(header[0]), int(header[1]))
            if ch.waiting or self.any:
                self._probe(p)

    def _next_claim(self, p: int) -> Optional[_Claim]:
        """The earliest receive still waiting for peer ``p``'s next message."""
        ch = self.inbound[p]
        for queue in (ch.waiting, self.any):
            while queue and queue[0].matched:  # timed out meanwhile
                queue.popleft()
        mine = ch.waiting[0] if ch.waiting else None
        anyone = self.any[0] if self.any else None
        if mine is None and anyone is None:
            return None
        if anyone is None or (mine is not None and mine.seq < anyone.seq):
            return ch.waiting.popleft()
        return self.any.popleft()

    def _deliver(self, p: int, claim: _Claim, numel: int, dtype_id: int) -> None:
        """Posts the payload receive of peer ``p``'s message whose header has arrived."""
        ch = self.inbound[p]
        ch.state = _Inbound.IDLE
        claim.matched = True
        comm = self.group.comm
        want = (claim.tensor.numel(), _dtype_id(claim.tensor.dtype))
        try:
            if (numel, dtype_id) == want:
                claim.work._source = p
                claim.work._expect([comm.recv(claim.out, p, dtype=claim.dt, async_op=True,
                                              timeout=claim.timeout)])
                return
            # Not for this tensor: receive it anyway (the channel stays in step), fail the recv.
            # (A dtype this torch does not know cannot be received; the next message from that
            # peer then fails too, as a mismatch.)
            sender = _DTYPES_BY_ID.get(dtype_id)
            if sender is not None:
                arr, dt = _as_numpy(torch.empty(numel, dtype=sender), None)
                comm.recv(arr, p, dtype=dt, async_op=True, timeout=claim.timeout)
            claim.work._complete(ValueError(
                f"railyard: recv{'' if claim.peer is not None else ' from any source'}: rank "
                f"{p} sent {_describe(numel, dtype_id)}, the receiving tensor holds "
                f"{_describe(*want)}"))
        except Exception as e:
            claim.work._complete(e)

    def _fail_waiting(self, p: int, error: BaseException) -> None:
        ch = self.inbound[p]
        for claim in list(ch.waiting) + list(self.any):
            if not claim.matched:
                claim.matched = True
                claim.work._complete(error)
        ch.waiting.clear()
        self.any.clear()

    def _arm(self, claim: _Claim) -> None:
        def expire() -> None:
            with self.lock:
                if claim.matched:
                    return
                claim.matched = True  # dropped from its queue when next looked at
            who = (f"rank {claim.peer} sent nothing" if claim.peer is not None else
                   f"none of ranks {', '.join(map(str, sorted(self.inbound)))} sent anything")
            claim.work._complete(_timed_out(claim.timeout, f"recv of rank {self.group.rank()} "
                                            f"on communicator {self.group.comm.comm_id}: {who}"))

        _p2p_worker.call_at(time.monotonic() + claim.timeout, expire)


def _then(first: Callable[[], None],
          then: Optional[Callable[[], None]]) -> Callable[[], None]:
    def both() -> None:
        first()
        if then is not None:
            then()
    return both


class ProcessGroupRailyard(dist.ProcessGroup):
    """A ``torch.distributed`` process group whose collectives run in railyardd.

    Created by ``dist.init_process_group("railyard", ...)`` / ``dist.new_group(...,
    backend="railyard")`` through :func:`create_process_group`; see the module docstring.

    Attributes:
        comm: the :class:`railyard.Comm` of this group (its ``client`` is the session).
    """

    def __init__(self, store: Any, rank: int, world_size: int,
                 timeout: timedelta = timedelta(minutes=30),
                 client: Optional["railyard.Client"] = None,
                 device_tensors: Optional[DeviceTensors] = None) -> None:
        super().__init__(rank, world_size)
        self.client = client if client is not None else _shared_client()
        # Tensors that are not host memory (cuda ones by default; tests give a fake).
        self._devices = device_tensors if device_tensors is not None else _cuda_tensors
        seconds = _seconds(timeout, "timeout")
        self._op_timeout = min(max(seconds or 0.0, 0.001), _MAX_TIMEOUT)
        # Every init of this store's group gets its own key (re-initialization reuses group
        # names): the n-th init of each rank reads the n-th id.
        generation = (store.add(_INIT_COUNT_KEY, 1) - 1) // world_size
        key = f"{_STORE_KEY}/{generation}"
        if rank == 0:
            comm_id = self.client.new_comm_id()
            store.set(key, comm_id)
        else:
            comm_id = store.get(key).decode()
        self.comm = self.client.comm(comm_id, rank, world_size, timeout=self._op_timeout)
        self._p2p = _PointToPoint(self)
        _groups.add(self)

    def getBackendName(self) -> str:  # noqa: N802 - the name C++ calls
        return BACKEND

    def __repr__(self) -> str:
        return f"<ProcessGroupRailyard rank {self.rank()} of {self.size()} {self.comm.comm_id}>"

    def shutdown(self) -> None:
        """Leaves the communicator: the daemon releases it. ``dist.destroy_process_group`` calls
        it (this module wraps that function: PyTorch 1.13 does not tell Python groups)."""
        try:
            self.comm.close()
        except railyard.RailyardError:
            pass

    # -- plumbing ------------------------------------------------------------------------------

    def _timeout(self, opts: Any) -> float:
        """The timeout of an operation: its options' where set, else the group's."""
        t = getattr(opts, "timeout", None)
        if isinstance(t, timedelta) and t >= timedelta(0):  # unset: -1 ms
            return min(max(t.total_seconds(), 0.001), _MAX_TIMEOUT)
        return self._op_timeout

    def _start(self, outputs: List[torch.Tensor], io: _Io,
               launch: Callable[[Dict[str, Any]],
                                Union["railyard.Work", List["railyard.Work"]]],
               post: Optional[Callable[[], None]] = None, opts: Any = None,
               timeout: Optional[float] = None, stream: Any = None) -> Work:
        """Launches an operation: ``launch(kw)`` submits it (``kw``: async_op and timeout for the
        railyard calls: ``timeout``, else the one of ``opts``, else the group's; and ``stream``
        for device tensors) and returns its railyard work(s). On host tensors ``post`` and the
        copies back run once the operation has completed; on device tensors they are enqueued on
        ``stream`` now, behind the operation."""
        def finish() -> None:
            if post is not None:
                post()
            io.finish()

        kw = {"async_op": True, "timeout": self._timeout(opts) if timeout is None else timeout}
        if stream is not None:
            kw["stream"] = stream
        work = Work(outputs, finish if stream is None else None, kw["timeout"])
        try:
            rws = launch(kw)
        except BaseException:
            with _live_lock:
                _live_works.pop(id(work), None)
            raise
        if stream is not None:
            self._devices.on_stream(stream, finish)
        work._expect(rws if isinstance(rws, list) else [rws])
        return work

    def _stream(self, tensors: Sequence[torch.Tensor], what: str) -> Any:
        """None when ``tensors`` are host memory; for device tensors, the stream their operation
        is put in order on. Host and device tensors in one operation: ValueError."""
        on_device = [self._devices.owns(t) for t in tensors]
        if not any(on_device):
            return None
        if not all(on_device):
            raise ValueError(f"railyard: {what} mixes CPU and device tensors")
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(f"railyard: {what} has tensors on several devices "
                             f"({', '.join(sorted(str(d) for d in devices))}); one process "
                             "drives one device per operation")
        return self._devices.stream(tensors[0])

    def _io(self, stream: Any) -> _Io:
        return _Io() if stream is None else _DeviceIo(self._devices, stream)

    def _array(self, t: torch.Tensor, red: Optional[str], stream: Any
               ) -> Tuple[Union[np.ndarray, "railyard.DeviceArray"], Optional[str]]:
        """The array a railyard call takes for contiguous ``t``, and its ``dtype=``."""
        if stream is None:
            return _as_numpy(t, red)
        return _as_device_array(self._devices.array(self.client, t), t, red)

    def _empty(self, shape: Tuple[int, ...], dtype: torch.dtype, like: torch.Tensor,
               stream: Any) -> torch.Tensor:
        if stream is None:
            return torch.empty(shape, dtype=dtype)
        return self._devices.empty(shape, dtype, like)

    def _flat(self, tensors: Sequence[torch.Tensor], stream: Any) -> torch.Tensor:
        """``tensors`` laid end to end in one new 1-D tensor (on a device: copied by stream
        work)."""
        if stream is None:
            return torch.cat([t.detach().reshape(-1) for t in tensors])
        flat = self._devices.empty((sum(t.numel() for t in tensors),), tensors[0].dtype,
                                   tensors[0])

        def copy() -> None:
            offset = 0
            with torch.no_grad():
                for t in tensors:
                    flat[offset:offset + t.numel()].copy_(t.reshape(-1))
                    offset += t.numel()

        self._devices.on_stream(stream, copy)
        return flat

    def _done(self, outputs: List[Any]) -> Work:
        """A work that has already completed (an operation with nothing to move)."""
        work = Work(outputs)
        work._complete(None)
        return work

    def _one(self, tensors: Sequence[torch.Tensor], what: str,
             on_devices: bool = False) -> torch.Tensor:
        if len(tensors) != 1:
            raise ValueError(f"railyard: {what} takes exactly one tensor per process, got "
                             f"{len(tensors)}")
        return _check_tensor(tensors[0], what, self._devices if on_devices else None)

    # -- collectives (signatures of c10d::ProcessGroup) ----------------------------------------

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        if len(tensors) == 1:
            work = self._small_allreduce(tensors[0], opts)
            if work is not None:
                return work
        if len(tensors) == 1 and isinstance(tensors[0], torch.Tensor) and \
                tensors[0].layout != torch.strided:
            return self._sparse_allreduce(tensors[0], opts)
        t = self._one(tensors, "all_reduce", on_devices=True)
        red = _red_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        stream = self._stream([t], "all_reduce")
        io = self._io(stream)
        arr, dt = self._array(io.output(t), red, stream)
        return self._start([t], io, lambda kw: self.comm.all_reduce(arr, red, dtype=dt, **kw),
                           opts=opts, stream=stream)

    def _small_allreduce(self, t: Any, opts: Any) -> Optional[Work]:
        """A small contiguous CPU tensor's all_reduce, submitted straight onto the session rings
        (railyard.Comm._start_in_place: one staging copy each way, no numpy view, no per-operation
        objects but this Work). ``None`` where it does not apply; the general path runs then."""
        if (type(t) is not torch.Tensor or t.device.type != "cpu" or
                t.layout != torch.strided or not t.is_contiguous() or self._devices.owns(t)):
            return None
        dtype = _WIRE_DTYPES.get(t.dtype)
        count = t.numel()
        nbytes = count * t.element_size()
        red = _WIRE_RED_OPS.get(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if dtype is None or red is None or not 0 < nbytes <= _SMALL_BYTES:
            return None
        timeout = self._timeout(opts)
        work = Work([t], None, timeout)
        rw = None
        try:
            rw = self.comm._start_in_place(_ALL_REDUCE, dtype, red, count, 0, t.data_ptr(),
                                           nbytes, _timeout_ms(timeout), work._complete)
        finally:
            if rw is None:  # not submitted (raised, or not for the lean path): forget the work
                with _live_lock:
                    _live_works.pop(id(work), None)
        if rw is None:
            return None
        work._rw = rw
        return work

    def allreduce_compressed(self, tensor: torch.Tensor, compression: str,
                             key: Optional[int] = None, op: str = "avg",
                             timeout: Optional[float] = None) -> Work:
        """All-reduce of ``tensor`` in place whose inter-node steps run under ``compression``
        (docs/compression.md; float32, float16 and bfloat16; other dtypes run exact), with error feedback under
        ``key`` unless it is None. What :func:`compression_hook` submits per DDP bucket."""
        t = _check_tensor(tensor, "all_reduce")
        io = _Io()
        buf = io.output(t)
        arr, dt = _as_numpy(buf, op)
        return self._start([t], io, lambda kw: self.comm.all_reduce(
            arr, op, dtype=dt, compression=compression, compression_key=key, **kw),
            timeout=timeout)

    def _sparse_allreduce(self, t: torch.Tensor, opts: Any) -> Work:
        """Sum of sparse COO tensors, as gloo does it: every rank gathers every rank's indices
        and values (one all_gather of the sizes, one all_to_all_v of the bytes) and coalesces
        their concatenation (duplicate indices add up). Waits for the sizes before returning, so
        that the operation's two collectives keep their place among the group's."""
        red = _red_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if red != "sum":
            raise ValueError(f"railyard: all_reduce of a sparse tensor supports SUM only, got "
                             f"{red.upper()}")
        if t.layout != torch.sparse_coo:
            raise ValueError(f"railyard: sparse all_reduce needs a COO tensor, got {t.layout}")
        if t.device.type != "cpu":
            raise ValueError(f"railyard: all_reduce tensor is on {t.device}; the railyard "
                             "backend handles CPU tensors only")
        n = self.size()
        local = t.detach().coalesce()
        indices = local.indices().contiguous()
        values = local.values().contiguous()
        sparse_dim = t.sparse_dim()
        shape_id = zlib.crc32(repr((tuple(t.shape), sparse_dim, str(t.dtype))).encode())
        meta = np.array([local._nnz(), shape_id], dtype=np.int64)
        metas = np.zeros((n, 2), dtype=np.int64)
        timeout = self._timeout(opts)
        try:
            self.comm.all_gather(meta, out=metas, timeout=timeout)
        except railyard.RailyardError as e:
            raise _worded(e, timeout).with_traceback(None) from None
        others = [r for r in range(n) if metas[r, 1] != shape_id]
        if others:  # every rank sees it: none goes on to the second collective
            raise ValueError(f"railyard: sparse all_reduce: ranks {others} have tensors of "
                             f"another shape, sparse_dim or dtype than this rank's "
                             f"{tuple(t.shape)}, sparse_dim {sparse_dim}, {t.dtype}")
        nnz = [int(c) for c in metas[:, 0]]
        row_bytes = sparse_dim * 8 + int(np.prod(values.shape[1:], dtype=np.int64)) * \
            values.element_size()
        mine = np.concatenate([indices.numpy().reshape(-1).view(np.uint8),
                               _raw_bytes(values)])
        gathered = np.empty(sum(nnz) * row_bytes, dtype=np.uint8)

        def post() -> None:
            idx, vals, offset = [], [], 0
            for c in nnz:
                chunk = gathered[offset:offset + c * row_bytes]
                idx.append(_from_raw_bytes(chunk[:c * sparse_dim * 8], torch.int64)
                           .reshape(sparse_dim, c))
                vals.append(_from_raw_bytes(chunk[c * sparse_dim * 8:], values.dtype)
                            .reshape((c,) + tuple(values.shape[1:])))
                offset += c * row_bytes
            total = torch.sparse_coo_tensor(torch.cat(idx, 1), torch.cat(vals), t.shape,
                                            dtype=t.dtype).coalesce()
            with torch.no_grad():
                t.copy_(total)

        if not gathered.size:  # every rank's tensor is empty: nothing to move
            work = Work([t], post)
            work._complete(None)
            return work
        send = mine if mine.size else np.zeros(1, dtype=np.uint8)
        return self._start([t], _Io(), lambda kw: self.comm.all_to_all_v(
            send, [mine.size] * n, [c * row_bytes for c in nnz], out=gathered,
            send_displs=[0] * n, **kw), post, opts)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        red = _red_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if not tensors:
            raise ValueError("railyard: allreduce_coalesced needs at least one tensor")
        for t in tensors:
            _check_tensor(t, "all_reduce_coalesced", self._devices)
            if t.dtype != tensors[0].dtype:
                raise ValueError("railyard: allreduce_coalesced tensors must share a dtype")
        stream = self._stream(tensors, "all_reduce_coalesced")
        flat = self._flat(tensors, stream)
        arr, dt = self._array(flat, red, stream)

        def post() -> None:
            offset = 0
            with torch.no_grad():
                for t in tensors:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

        return self._start(list(tensors), _Io(),
                           lambda kw: self.comm.all_reduce(arr, red, dtype=dt, **kw), post, opts,
                           stream=stream)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        t = self._one(tensors, "broadcast", on_devices=True)
        root = opts.rootRank if opts is not None else 0
        stream = self._stream([t], "broadcast")
        io = self._io(stream)
        arr, dt = self._array(io.output(t), None, stream)
        return self._start([t], io, lambda kw: self.comm.broadcast(arr, root, dtype=dt, **kw),
                           opts=opts, stream=stream)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        t = self._one(tensors, "reduce", on_devices=True)
        red = _red_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        root = opts.rootRank if opts is not None else 0
        stream = self._stream([t], "reduce")
        io = self._io(stream)
        arr, dt = self._array(io.output(t), red, stream)
        return self._start([t], io, lambda kw: self.comm.reduce(arr, root, red, dtype=dt, **kw),
                           opts=opts, stream=stream)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,
                        opts: Any = None) -> Work:
        _check_tensor(output, "all_gather output", self._devices)
        _check_tensor(input, "all_gather input", self._devices)
        if output.dtype != input.dtype or output.numel() != input.numel() * self.size():
            raise ValueError(f"railyard: all_gather output must have world_size * "
                             f"{input.numel()} elements of {input.dtype}, got "
                             f"{output.numel()} of {output.dtype}")
        stream = self._stream([output, input], "all_gather")
        io = self._io(stream)
        src, _ = self._array(io.input(input), None, stream)
        out, dt = self._array(io.output(output), None, stream)
        return self._start([output], io, lambda kw: self.comm.all_gather(
            src, out=out, dtype=dt, **kw), opts=opts, stream=stream)

    def allgather(self, output_tensors: List[List[torch.Tensor]],
                  input_tensors: List[torch.Tensor], opts: Any = None) -> Work:
        t = self._one(input_tensors, "all_gather", on_devices=True)
        if len(output_tensors) != 1 or len(output_tensors[0]) != self.size():
            raise ValueError(f"railyard: all_gather needs one list of {self.size()} output "
                             "tensors")
        outs = output_tensors[0]
        for o in outs:
            _check_tensor(o, "all_gather output", self._devices)
            if o.numel() != t.numel() or o.dtype != t.dtype:
                raise ValueError("railyard: all_gather outputs must match the input's size and "
                                 "dtype")
        stream = self._stream([t] + list(outs), "all_gather")
        gathered = self._empty((self.size(),) + tuple(t.shape), t.dtype, t, stream)
        src, _ = self._array(self._io(stream).input(t), None, stream)
        out, dt = self._array(gathered, None, stream)

        def post() -> None:
            with torch.no_grad():
                for r, o in enumerate(outs):
                    o.copy_(gathered[r].view_as(o))

        return self._start(list(outs), _Io(), lambda kw: self.comm.all_gather(
            src, out=out, dtype=dt, **kw), post, opts, stream=stream)

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]],
                            input_list: List[torch.Tensor], opts: Any = None) -> Work:
        """Every rank's ``input_list`` into ``output_lists[rank]``: one all_gather of the inputs
        laid end to end (every rank passes tensors of the same sizes, in the same order)."""
        n = self.size()
        if not input_list:
            raise ValueError("railyard: all_gather_coalesced needs at least one input tensor")
        for t in input_list:
            _check_tensor(t, "all_gather_coalesced input")
            if t.dtype != input_list[0].dtype:
                raise ValueError(f"railyard: all_gather_coalesced inputs must share a dtype, got "
                                 f"{input_list[0].dtype} and {t.dtype}")
        if len(output_lists) != n:
            raise ValueError(f"railyard: all_gather_coalesced needs {n} output lists (one per "
                             f"rank), got {len(output_lists)}")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_list):
                raise ValueError(f"railyard: all_gather_coalesced output list {r} has "
                                 f"{len(outs)} tensors, the input list {len(input_list)}")
            for i, (o, t) in enumerate(zip(outs, input_list)):
                _check_tensor(o, "all_gather_coalesced output")
                if o.numel() != t.numel() or o.dtype != t.dtype:
                    raise ValueError(f"railyard: all_gather_coalesced output [{r}][{i}] holds "
                                     f"{o.numel()} x {o.dtype}, its input {t.numel()} x "
                                     f"{t.dtype}")
        flat = torch.cat([t.detach().reshape(-1) for t in input_list])
        outputs = [list(outs) for outs in output_lists]  # the future's value, as gloo's
        if flat.numel() == 0:
            return self._done(outputs)
        gathered = torch.empty((n, flat.numel()), dtype=flat.dtype)
        src, _ = _as_numpy(flat, None)
        out, dt = _as_numpy(gathered, None)

        def post() -> None:
            with torch.no_grad():
                for r, outs in enumerate(output_lists):
                    offset = 0
                    for o in outs:
                        o.copy_(gathered[r, offset:offset + o.numel()].view_as(o))
                        offset += o.numel()

        return self._start(outputs, _Io(), lambda kw: self.comm.all_gather(
            src, out=out, dtype=dt, **kw), post, opts)

    def gather(self, output_tensors: List[List[torch.Tensor]],
               input_tensors: List[torch.Tensor], opts: Any = None) -> Work:
        t = self._one(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        gathered = torch.empty((self.size(),) + tuple(t.shape), dtype=t.dtype)
        src, _ = _as_numpy(t.contiguous(), None)
        out, dt = _as_numpy(gathered, None)
        outs = output_tensors[0] if self.rank() == root else []
        if self.rank() == root and len(outs) != self.size():
            raise ValueError(f"railyard: gather needs {self.size()} output tensors on the root")

        def post() -> None:
            with torch.no_grad():
                for r, o in enumerate(outs):
                    o.copy_(gathered[r].view_as(o))

        return self._start(list(outs), _Io(), lambda kw: self.comm.all_gather(
            src, out=out, dtype=dt, **kw), post, opts)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,
                             opts: Any = None) -> Work:
        _check_tensor(output, "reduce_scatter output", self._devices)
        _check_tensor(input, "reduce_scatter input", self._devices)
        red = _red_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if output.dtype != input.dtype or input.numel() != output.numel() * self.size():
            raise ValueError(f"railyard: reduce_scatter input must have world_size * "
                             f"{output.numel()} elements of {output.dtype}, got "
                             f"{input.numel()} of {input.dtype}")
        stream = self._stream([output, input], "reduce_scatter")
        io = self._io(stream)
        src, dt = self._array(io.input(input), red, stream)
        out, _ = self._array(io.output(output), red, stream)
        return self._start([output], io, lambda kw: self.comm.reduce_scatter(
            src, red, out=out, dtype=dt, **kw), opts=opts, stream=stream)

    def reduce_scatter(self, output_tensors: List[torch.Tensor],
                       input_tensors: List[List[torch.Tensor]], opts: Any = None) -> Work:
        t = self._one(output_tensors, "reduce_scatter", on_devices=True)
        red = _red_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if len(input_tensors) != 1 or len(input_tensors[0]) != self.size():
            raise ValueError(f"railyard: reduce_scatter needs one list of {self.size()} input "
                             "tensors")
        for i in input_tensors[0]:
            _check_tensor(i, "reduce_scatter input", self._devices)
            if i.numel() != t.numel() or i.dtype != t.dtype:
                raise ValueError("railyard: reduce_scatter inputs must match the output's size "
                                 "and dtype")
        stream = self._stream([t] + list(input_tensors[0]), "reduce_scatter")
        stacked = self._flat(input_tensors[0], stream)
        io = self._io(stream)
        src, dt = self._array(stacked, red, stream)
        out, _ = self._array(io.output(t), red, stream)
        return self._start([t], io, lambda kw: self.comm.reduce_scatter(
            src, red, out=out, dtype=dt, **kw), opts=opts, stream=stream)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: List[int], input_split_sizes: List[int],
                      opts: Any = None) -> Work:
        _check_tensor(output, "all_to_all output", self._devices)
        _check_tensor(input, "all_to_all input", self._devices)
        if output.dtype != input.dtype:
            raise ValueError("railyard: all_to_all input and output dtypes differ")
        stream = self._stream([output, input], "all_to_all")
        io = self._io(stream)
        src, dt = self._array(io.input(input), None, stream)
        out, _ = self._array(io.output(output), None, stream)
        n = self.size()
        if not output_split_sizes and not input_split_sizes:
            if src.size != out.size or src.size % n:
                raise ValueError(f"railyard: all_to_all_single needs equal input and output "
                                 f"sizes divisible by {n}")
            return self._start([output], io, lambda kw: self.comm.all_to_all(
                src, out=out, dtype=dt, **kw), opts=opts, stream=stream)
        # Split sizes count rows (dim 0); counts for the daemon are elements (or bytes).
        def counts(t: torch.Tensor, arr: Any, splits: List[int]) -> List[int]:
            if not splits:
                if t.shape[0] % n:
                    raise ValueError(f"railyard: dim 0 ({t.shape[0]}) not divisible by {n}")
                splits = [t.shape[0] // n] * n
            if len(splits) != n or sum(splits) != (t.shape[0] if t.dim() else 1):
                raise ValueError(f"railyard: split sizes {splits} do not split dim 0 "
                                 f"({t.shape[0] if t.dim() else 1}) in {n}")
            per_row = arr.size // max(t.shape[0] if t.dim() else 1, 1)
            return [s * per_row for s in splits]

        sc = counts(input, src, list(input_split_sizes))
        rc = counts(output, out, list(output_split_sizes))
        return self._start([output], io, lambda kw: self.comm.all_to_all_v(
            src, sc, rc, out=out, dtype=dt, **kw), opts=opts, stream=stream)

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> Work:
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"railyard: all_to_all needs {n} input and {n} output tensors")
        for t in list(input_tensors) + list(output_tensors):
            _check_tensor(t, "all_to_all")
            if t.dtype != input_tensors[0].dtype:
                raise ValueError("railyard: all_to_all tensors must share a dtype")
        flat_in = torch.cat([t.detach().reshape(-1) for t in input_tensors])
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)
        src, dt = _as_numpy(flat_in, None)
        out, _ = _as_numpy(flat_out, None)
        scale = src.size // max(flat_in.numel(), 1) if flat_in.numel() else 1
        sc = [t.numel() * scale for t in input_tensors]
        rc = [t.numel() * scale for t in output_tensors]

        def post() -> None:
            offset = 0
            with torch.no_grad():
                for t in output_tensors:
                    t.copy_(flat_out[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

        return self._start(list(output_tensors), _Io(), lambda kw: self.comm.all_to_all_v(
            src, sc, rc, out=out, dtype=dt, **kw), post, opts)

    def scatter(self, output_tensors: List[torch.Tensor],
                input_tensors: List[List[torch.Tensor]], opts: Any = None) -> Work:
        t = self._one(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        n = self.size()
        if self.rank() == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != n:
                raise ValueError(f"railyard: scatter needs {n} input tensors on the root")
            flat_in = torch.cat([i.detach().reshape(-1) for i in input_tensors[0]])
        else:
            flat_in = torch.empty(0, dtype=t.dtype)
        io = _Io()
        src, dt = _as_numpy(flat_in, None)
        out, _ = _as_numpy(io.output(t), None)
        scale = out.size // max(t.numel(), 1) if t.numel() else 1
        c = t.numel() * scale
        sc = [c] * n if self.rank() == root else [0] * n
        rc = [c if p == root else 0 for p in range(n)]
        if src.size == 0:  # no send buffer needed, but the array must exist
            src = np.empty(1, dtype=out.dtype)
        return self._start([t], io, lambda kw: self.comm.all_to_all_v(
            src, sc, rc, out=out, dtype=dt, **kw), opts=opts)

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Work:
        t = self._one(tensors, "send")
        return self._start([t], _Io(), lambda kw: self._p2p.send(t, dst, kw["timeout"]))

    def _claim(self, tensors: List[torch.Tensor], src: Optional[int], what: str,
               timeout: Optional[float] = None) -> _Claim:
        t = self._one(tensors, what)
        io = _Io()
        out, dt = _as_numpy(io.output(t), None)
        seconds = self._op_timeout if timeout is None else timeout
        work = Work([t], io.finish, seconds)
        return _Claim(next(self._p2p.seq), src, t, out, dt, work, seconds)

    def _post(self, claim: _Claim) -> Work:
        try:
            (self._p2p.recv if claim.peer is not None else self._p2p.recv_any)(claim)
        except BaseException:
            with _live_lock:
                _live_works.pop(id(claim.work), None)
            raise
        return claim.work

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Work:
        return self._post(self._claim(tensors, src, "recv"))

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Work:
        """Receives the first message any peer sends (``Work._source_rank()`` names it)."""
        return self._post(self._claim(tensors, None, "recv"))

    def barrier(self, opts: Any = None) -> Work:
        return self._start([], _Io(), lambda kw: self.comm.barrier(**kw), opts=opts)

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """A barrier that names the ranks that did not reach it, as gloo's does (same words):
        every other rank sends to rank 0 and waits for its answer; rank 0 waits up to
        ``timeout`` (default: the group's) for them, then answers each. Rank 0 raises naming
        the first rank that did not arrive (every such rank with ``wait_all_ranks``); a missing
        rank's receive times out in the daemon, which aborts the communicator, so the ranks
        that did arrive fail too instead of waiting."""
        seconds = _seconds(timeout, "monitored_barrier timeout")
        seconds = self._op_timeout if seconds is None else min(seconds, _MAX_TIMEOUT)
        ms = int(seconds * 1000)
        rank, n = self.rank(), self.size()
        token = [torch.tensor([rank], dtype=torch.int64)]
        if rank != 0:
            try:
                sent = self.send(token, 0)
                got = self.recv([torch.zeros(1, dtype=torch.int64)], 0)
                sent.wait()
                got.wait()
            except Exception as e:
                raise RuntimeError(
                    f"Rank {rank} successfully reached monitoredBarrier, but received errors "
                    "while waiting for send/recv from rank 0. Please check rank 0 logs for "
                    f"faulty rank.\n Original exception: \n{e}") from e
            return
        start = time.monotonic()

        def wait_loop(works: Dict[int, Work]) -> None:
            processed: List[int] = []
            failed: List[int] = []
            for r, work in works.items():
                remaining = seconds - (time.monotonic() - start)
                if not wait_all_ranks and remaining <= 0:
                    raise RuntimeError(
                        f"Rank 0 timed out in monitoredBarrier after {ms} ms.\n" +
                        (f"Successfully processed ranks: {', '.join(map(str, processed))}"
                         if processed else "No ranks successfully processed in "
                                           "monitoredBarrier."))
                try:
                    work.wait(seconds if wait_all_ranks else remaining)
                    processed.append(r)
                except Exception as e:
                    error = f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {ms} ms"
                    if not wait_all_ranks:
                        raise RuntimeError(f"{error}\n Original exception: \n{e}") from e
                    failed.append(r)
            if failed:
                raise RuntimeError(f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed to "
                                   f"pass monitoredBarrier in {ms} ms")

        if seconds <= 0:  # nothing to wait with: posting receives would only abort the group
            raise RuntimeError(f"Rank 0 timed out in monitoredBarrier after {ms} ms.\n"
                               "No ranks successfully processed in monitoredBarrier.")
        recvs = {}
        for r in range(1, n):
            recvs[r] = self._post(self._claim([torch.zeros(1, dtype=torch.int64)], r,
                                              "monitored_barrier", seconds))
        wait_loop(recvs)
        # Every rank has arrived: release them (this is a true barrier: all pass or none do).
        sends = {}
        for r in range(1, n):
            t = token[0]
            sends[r] = self._start([t], _Io(), lambda kw, r=r: self._p2p.send(t, r, kw["timeout"]),
                                   timeout=seconds)
        wait_loop(sends)

    # -- shared tensors ------------------------------------------------------------------------

    def empty(self, *size: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A tensor in shared memory registered with this group's daemon: collectives on it
        (or on contiguous views of it) copy nothing."""
        return empty(*size, dtype=dtype, client=self.client)


def empty(*size: Any, dtype: torch.dtype = torch.float32,
          client: Optional["railyard.Client"] = None) -> torch.Tensor:
    """A CPU tensor in railyard shared memory: collectives of the railyard backend on it (or on
    contiguous views of it) are zero-copy. Uses the process's shared session unless ``client``
    is given."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    client = client if client is not None else _shared_client()
    probe = torch.empty(0, dtype=dtype)
    if dtype == torch.bfloat16:
        return torch.from_numpy(client.empty(size, np.int16)).view(torch.bfloat16)
    np_dtype = probe.numpy().dtype if dtype != torch.bool else np.dtype(np.bool_)
    return torch.from_numpy(client.empty(size, np_dtype))


def _railyard_group(group: Any) -> "ProcessGroupRailyard":
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(pg, ProcessGroupRailyard):
        return pg
    get_backend = getattr(pg, "_get_backend", None)  # torch >= 2.0 wraps backends
    if get_backend is not None:
        backend = get_backend(torch.device("cpu"))
        if isinstance(backend, ProcessGroupRailyard):
            return backend
    raise ValueError(f"railyard.torch.compression_hook needs a railyard process group, got "
                     f"{type(pg).__name__}")


def compression_hook(codec: str = "int8", *, error_feedback: bool = True, group: Any = None,
                     key_base: int = 0) -> Callable[[Any, Any], torch.futures.Future]:
    """A ``DistributedDataParallel`` communication hook whose bucket all-reduces compress their
    inter-node steps with ``codec`` ("fp16", "bf16", "int8", "int8:B", "topk:R" or "auto";
    docs/compression.md) and average, like DDP's own allreduce::

        ddp.register_comm_hook(None, railyard.torch.compression_hook("int8"))

    With ``error_feedback`` (the default) the daemon keeps a residual per bucket, keyed by
    ``key_base + bucket.index()`` (give each DDP model of one process group its own key_base),
    which keeps the compression unbiased over steps. The state passed to ``register_comm_hook``
    may be the railyard process group (default: ``group``, else the default group). Applies
    across nodes to float32 gradients; elsewhere the all-reduce is exact."""
    if not isinstance(codec, str) or not codec:
        raise ValueError(f"railyard: compression_hook needs a codec name, got {codec!r}")

    def hook(state: Any, bucket: Any) -> torch.futures.Future:
        pg = _railyard_group(state if state is not None else group)
        tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
        key = key_base + bucket.index() if error_feedback else None
        work = pg.allreduce_compressed(tensor, codec, key)
        return work.get_future().then(lambda fut: fut.value()[0])

    # DDP checks a hook's annotations (register_comm_hook): real objects, not strings.
    hook.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    return hook


def create_process_group(store: Any, rank: int, world_size: int,
                         timeout: timedelta) -> ProcessGroupRailyard:
    """The creator registered with ``torch.distributed.Backend.register_backend``."""
    return ProcessGroupRailyard(store, rank, world_size, timeout)


_groups: "weakref.WeakSet[ProcessGroupRailyard]" = weakref.WeakSet()
_cuda_tensors = CudaTensors()


def _destroy_process_group(group: Any = None) -> None:
    """``torch.distributed.destroy_process_group``, then the daemon-side communicators of the
    railyard groups it destroyed are released (every group when ``group`` is None)."""
    if group is None or group is dist.GroupMember.WORLD:
        doomed = list(_groups)  # every group goes, the default one included
    else:
        doomed = [group] if isinstance(group, ProcessGroupRailyard) else []
    _torch_destroy_process_group(group)
    for g in doomed:
        g.shutdown()


_torch_destroy_process_group = dist.distributed_c10d.destroy_process_group


def _monitored_barrier(group: Any = dist.GroupMember.WORLD, timeout: Any = None,
                       wait_all_ranks: bool = False) -> None:
    """``torch.distributed.monitored_barrier``, which PyTorch 1.13 refuses for any backend but
    gloo, for railyard groups too (:meth:`ProcessGroupRailyard.monitored_barrier`; ``timeout``
    None: the group's). Other groups, and ranks outside ``group``, go to PyTorch's own."""
    c10d = dist.distributed_c10d
    if not c10d._rank_not_in_group(group) and c10d.is_initialized():
        pg = c10d._get_default_group() if group is None or group is c10d.GroupMember.WORLD \
            else group
        if isinstance(pg, ProcessGroupRailyard):
            return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
    return _torch_monitored_barrier(group, timeout, wait_all_ranks)


_torch_monitored_barrier = dist.distributed_c10d.monitored_barrier


def _register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, create_process_group)
    if dist.distributed_c10d.destroy_process_group is not _destroy_process_group:
        dist.distributed_c10d.destroy_process_group = _destroy_process_group
        dist.destroy_process_group = _destroy_process_group
    if dist.distributed_c10d.monitored_barrier is not _monitored_barrier:
        dist.distributed_c10d.monitored_barrier = _monitored_barrier
        dist.monitored_barrier = _monitored_barrier


_register()
