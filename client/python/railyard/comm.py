"""Communicators: :class:`Comm` (this process's rank in one; every collective) and the staging
of arrays that are not in shared memory (:class:`_Staged`).
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from . import _ring, _shrink, _staging
from ._comm_ids import derived_comm_id
from ._device import DeviceArray
from ._generated import common_pb2
from ._request import _Request
from ._util import invalid as _invalid
from .errors import FailedPreconditionError, RailyardError, UnimplementedError
from .wire import RedOpLike, ReduceOp, dtype_number, red_op_number
from .wire import timeout_ms as _timeout_ms
from .work import Work, _HostOp

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

__all__ = ["Comm", "OpResult"]

ArrayLike = Union[np.ndarray, DeviceArray]


def _copy_in(slot: _staging.Slot, arr: np.ndarray) -> None:
    """Copies ``arr`` to the start of a staging slot."""
    mapping, offset = slot.mapping, slot.offset
    if arr.flags.c_contiguous:
        mapping[offset:offset + arr.nbytes] = arr  # one memcpy through the buffer protocol
        return
    staged = np.frombuffer(mapping, dtype=arr.dtype, count=arr.size,
                           offset=offset).reshape(arr.shape)
    np.copyto(staged, arr, casting="no")


def _copy_out(slot: _staging.Slot, out: np.ndarray) -> None:
    """Copies the start of a staging slot into ``out``."""
    if out.flags.c_contiguous:
        try:
            target = memoryview(out).cast("B")
        except (TypeError, ValueError):
            pass  # a buffer format memoryview cannot cast to bytes: numpy below
        else:
            with target, slot.view(out.nbytes) as source:
                target[:] = source
            return
    staged = np.frombuffer(slot.mapping, dtype=out.dtype, count=out.size,
                           offset=slot.offset).reshape(out.shape)
    np.copyto(out, staged, casting="no")


class _Staged:
    """Per-operation bookkeeping of the staging buffers used for non-shared arrays."""

    __slots__ = ("client", "entries")

    def __init__(self, client: Client) -> None:
        self.client = client
        # (slot, array to copy the result into or None, the array staged)
        self.entries: List[Tuple[_staging.Slot, Optional[np.ndarray], np.ndarray]] = []

    def ref(self, arr: ArrayLike, *, copy_in: bool, copy_out: bool) -> Tuple[int, int]:
        if isinstance(arr, DeviceArray):
            return arr.ref()  # the daemon reads and writes it where it is
        if copy_out and not arr.flags.writeable:
            raise _invalid("the output array is read-only")
        loc = self.client._locate(arr)
        if loc is not None:
            return loc
        slot = self.client._staging.acquire(max(arr.nbytes, 1))
        if copy_in and arr.nbytes:
            _copy_in(slot, arr)
        self.entries.append((slot, arr if copy_out else None, arr))
        return slot.buffer_id, slot.offset

    def ref_in_place(self, arr: ArrayLike, send: Tuple[int, int]) -> Tuple[int, int]:
        """``arr``, already referenced as the send array at ``send``, is the output too."""
        if isinstance(arr, DeviceArray):
            return send
        if not arr.flags.writeable:
            raise _invalid("the output array is read-only")
        for i, (slot, out, arr_seen) in enumerate(self.entries):
            if arr_seen is arr:
                self.entries[i] = (slot, arr, arr_seen)  # staged: copy the result back
        return send

    def finish(self, ok: bool) -> None:
        for slot, out, _ in self.entries:
            if ok and out is not None and out.nbytes:
                _copy_out(slot, out)
            self.client._staging.release(slot)
        self.entries = []


OpResult = Union[np.ndarray, Work, None]

_SEND = common_pb2.COLLECTIVE_OP_SEND
_RECV = common_pb2.COLLECTIVE_OP_RECV


def _disjoint(send: Optional[ArrayLike], recv: Optional[ArrayLike]) -> bool:
    """True when an operation's output memory (``recv``) shares none with its input's
    (``send``): running it again after a daemon crash reads intact inputs (a staged array's copy
    lies in a staging slot of its own, so the arrays themselves decide). Device arrays: by their
    registration and offsets, as the daemon sees them."""
    if send is None or recv is None:
        return True
    if send is recv:
        return False
    if isinstance(send, DeviceArray) or isinstance(recv, DeviceArray):
        if not (isinstance(send, DeviceArray) and isinstance(recv, DeviceArray)):
            return True
        if send._reg is not recv._reg:
            return True
        return (send.offset + send.nbytes <= recv.offset or
                recv.offset + recv.nbytes <= send.offset)
    return not np.may_share_memory(send, recv)


class Comm:
    """This process's rank in a communicator. Create it with :meth:`Client.comm`.

    Every collective takes numpy arrays. Arrays from :meth:`Client.empty` (and contiguous views
    of them) are zero-copy; any other array is accepted too and is copied into a shared staging
    buffer and back, which is slower (two extra copies, and a registration the first time a size
    is seen). With ``async_op=True`` a collective returns a :class:`Work` whose ``wait()`` gives
    the result; otherwise it waits and returns the result itself (the output array).

    Errors in the arguments raise :class:`InvalidArgumentError` at once; failures reported by the
    daemon raise from the call (or from ``Work.wait``). ``timeout`` (seconds) bounds how long the
    daemon waits for the other ranks' matching call (default: the daemon's ``--op_timeout``);
    ``algo`` forces an algorithm (default ``$RAILYARD_ALGO``; all ranks must agree).
    ``all_reduce`` also takes ``compression`` (default ``$RAILYARD_COMPRESSION``: ``"none"``,
    ``"fp16"``, ``"bf16"``, ``"int8"``, ``"topk:0.01"`` or ``"auto"``; docs/compression.md) and
    ``compression_key``, which turns on error feedback under that key. ``stream`` (every
    collective) orders the operation on an accelerator stream, as NCCL does: it starts once the
    stream's earlier work is done, the stream's later work waits for it, and the call returns at
    once (``async_op=True`` needed; docs/gpu.md, "Stream ordering").

    A communicator made with ``on_failure="shrink"`` outlives the loss of ranks (a dead node, a
    killed process): the ``wait`` of an operation that failed because ranks are gone (an
    ``async_op=False`` call waits too) first asks the daemons which ranks are gone and joins the
    survivors' communicator in this one's place, then raises the operation's error, which names
    the lost ranks and nodes (its ``lost_ranks`` and ``lost_nodes``; ``shrunk`` is True on the
    one error whose wait moved the communicator). The next call runs on the shrunk communicator:
    ``rank``, ``nranks``, ``comm_id`` and ``lost_ranks`` say what it is now
    (docs/fabric-failures.md).
    """

    def __init__(self, client: Client, comm_id: str, handle: int, rank: int, nranks: int,
                 nnodes: int, on_failure: str = "abort",
                 shrink_timeout: Optional[float] = None) -> None:
        self.client = client
        self.comm_id = comm_id
        self.handle = handle
        self.rank = rank
        self.nranks = nranks
        self.nnodes = nnodes
        self.local_rank: Optional[int] = None
        # What the client keeps to rejoin it after a reconnect (None: not one it joined).
        self._state = client._comms.get(handle)
        self._children = 0  # shrink and grow calls so far: each child's id is derived from it
        self.on_failure = on_failure
        self.shrink_timeout = shrink_timeout  # joining the survivors' communicator (None: daemon's)
        # The ranks (numbered as they were then) and nodes the last automatic shrink dropped.
        self.lost_ranks: List[int] = []
        self.lost_nodes: List[str] = []
        self._generation = 0  # automatic shrinks so far
        self._shrinking = threading.Lock()

    def _adopt(self, other: "Comm") -> None:
        """Becomes ``other`` (the survivors' communicator an automatic shrink joined)."""
        self.comm_id, self.handle, self.rank = other.comm_id, other.handle, other.rank
        self.nranks, self.nnodes, self._state = other.nranks, other.nnodes, other._state
        self._children = 0
        other.handle = 0  # this object owns it now

    def __repr__(self) -> str:
        return (f"<railyard.Comm rank {self.rank} of {self.nranks} ({self.nnodes} node(s)) "
                f"{self.comm_id}>")

    def close(self) -> None:
        """Leaves the communicator (``DestroyComm``); other ranks' pending operations fail."""
        if self.handle and not self.client.closed:
            handle, self.handle = self.handle, 0
            self.client._destroy_comm(handle)
        self.handle = 0

    def shrink(self, exclude: Sequence[int], timeout: Optional[float] = None) -> "Comm":
        """A communicator of this one's ranks but ``exclude`` (as ``ncclCommShrink``), the others
        renumbered in order. Every surviving rank calls it with the same list, in the same order
        as its other ``shrink``/``grow`` calls; the excluded ranks do not take part (they may be
        dead). Its comm id is derived from this one's alike on every rank (in C++ too), so none is
        handed around and none of this communicator's traffic can match the new one's. This
        communicator stays as it is (close it when done)."""
        gone = set()
        for r in exclude:
            if not isinstance(r, int) or not 0 <= r < self.nranks:
                raise _invalid(f"shrink: excluded rank {r!r} not in [0, {self.nranks})")
            gone.add(r)
        if self.rank in gone:
            raise _invalid(f"shrink: rank {self.rank} is in its own exclude list")
        if len(gone) == self.nranks:
            raise _invalid("shrink: every rank excluded")
        # The coordinator's node may be among the excluded (dead): the daemon names the
        # survivors' (a daemon from before CommCensus: the parent's).
        try:
            coordinator = _shrink.census(self, exclude=sorted(gone)).coordinator
        except UnimplementedError:
            coordinator = ""
        self._children += 1
        child, newrank, newn = self._shrunk(self._children, sorted(gone), coordinator)
        return self.client.comm(child, newrank, newn, timeout,
                                on_failure=self.on_failure, shrink_timeout=self.shrink_timeout)

    def _shrunk(self, child: int, gone: List[int], coordinator: str) -> Tuple[str, int, int]:
        """The id, this rank's number and the size of this communicator's child-th child
        without the ranks ``gone`` (ascending), its id naming ``coordinator`` ("": this one's);
        shrink and the automatic shrink (_shrink.after_failure) derive it alike."""
        child_id = derived_comm_id(self.comm_id,
                                   f"shrink/{child}/" + ",".join(str(r) for r in gone),
                                   coordinator)
        return (child_id, self.rank - sum(1 for g in gone if g < self.rank),
                self.nranks - len(gone))

    def grow_id(self, new_nranks: int) -> str:
        """The comm id new ranks join with when this communicator grows to ``new_nranks`` (as
        ``ncclCommGrow``): ``client.comm(id, rank, new_nranks)`` with ranks ``nranks`` to
        ``new_nranks - 1``; hand it to them by whatever means the job has."""
        if not isinstance(new_nranks, int) or new_nranks <= self.nranks:
            raise _invalid(f"grow to {new_nranks!r} ranks: not more than {self.nranks}")
        return derived_comm_id(self.comm_id, f"grow/{self._children + 1}/{new_nranks}")

    def grow(self, new_nranks: int, timeout: Optional[float] = None) -> "Comm":
        """Every existing rank's part of growing to ``new_nranks`` (same rank numbers), in the
        same order as its other ``shrink``/``grow`` calls: returns once all have joined."""
        child = self.grow_id(new_nranks)
        self._children += 1
        return self.client.comm(child, self.rank, new_nranks, timeout,
                                on_failure=self.on_failure, shrink_timeout=self.shrink_timeout)

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------------

    def _like(self, x: ArrayLike, shape: Tuple[int, ...]) -> np.ndarray:
        """A new output array: shared when ``x`` is, else ordinary memory."""
        if isinstance(x, DeviceArray):
            raise _invalid("pass out= for a device array: this client does not allocate device "
                           "memory")
        if self.client.is_shared(x):
            return self.client.empty(shape, x.dtype)
        return np.empty(shape, x.dtype)

    @staticmethod
    def _check_array(name: str, arr: Any) -> ArrayLike:
        if not isinstance(arr, (np.ndarray, DeviceArray)):
            raise _invalid(f"{name} must be a numpy array or a railyard.DeviceArray, not "
                           f"{type(arr).__name__}")
        return arr

    def _run(self, op: int, *, dtype: int, count: int = 0, red_op: int = 0, root: int = 0,
             send: Optional[np.ndarray] = None, recv: Optional[np.ndarray] = None,
             result: OpResult = None, async_op: bool = False, timeout: Optional[float] = None,
             algo: Optional[str] = None, stream: Any = None, **extra: Any) -> OpResult:
        if stream is not None and not async_op:
            raise _invalid("an operation ordered on a stream returns at once: pass async_op=True "
                           "and keep the Work (its wait() waits on the host and says how it "
                           "ended)")
        if not self.handle:
            raise FailedPreconditionError(grpc.StatusCode.FAILED_PRECONDITION,
                                          "communicator closed")
        client = self.client
        if client._forked:
            # Before staging: the staging buffers are shared with the parent and the daemon.
            raise client._session_error()  # type: ignore[misc]
        state = self._state
        if state is not None and state.broken is not None:
            raise state.broken.with_traceback(None)  # it could not be joined after a reconnect
        request = _Request(self.handle, op, dtype, red_op, count, root, _timeout_ms(timeout),
                           algo if algo is not None else client.default_algo, **extra)
        staged = _Staged(client)
        try:
            if send is not None:
                request.send = staged.ref(send, copy_in=True, copy_out=False)
            if recv is not None:
                if recv is send:
                    request.recv = staged.ref_in_place(recv, request.send)
                else:
                    request.recv = staged.ref(recv, copy_in=False, copy_out=True)
        except BaseException:
            staged.finish(False)
            raise
        slot = None
        if stream is not None:
            if staged.entries:
                staged.finish(False)
                raise _invalid("an operation ordered on a stream takes arrays from client.empty "
                               "or device arrays: this one would be copied into shared memory "
                               "now, before the stream has produced it")
            slot = client._stream_slot(stream)
            request.stream_sync = (slot.buffer_id, slot.offset, slot.value)
        work = Work(result, staged.finish if staged.entries else None, slot)
        if op != _SEND and op != _RECV:
            work._collective_of = state
        work._rerun_safe = _disjoint(send, recv)
        if self.on_failure == "shrink":
            work._shrink_of = (self, self._generation)
        client._submit(request, work)
        if async_op:
            return work
        return work.wait()

    def _start_in_place(self, op: int, dtype: int, red_op: int, count: int, root: int, ptr: int,
                        nbytes: int, timeout_ms: int,
                        on_done: Callable[[Optional[RailyardError]], None]
                        ) -> Optional[_HostOp]:
        """Submits ``op`` in place on ``nbytes`` of host memory at ``ptr`` (wire numbers
        throughout; the caller checked them and keeps the memory alive until ``on_done``). The
        lean path for small operations from a caller that is not numpy (the torch backend):
        ``None`` where it does not apply (no session rings, a client-wide algorithm or
        compression, a closed communicator, a forked process), and the general path, which says
        what is wrong where anything is, runs instead."""
        client = self.client
        rings = client._rings
        state = self._state
        if (rings is None or not self.handle or client._forked or client.default_algo or
                client.default_compression or nbytes <= 0 or
                (state is not None and state.broken is not None)):
            return None
        slot = client._staging.acquire(nbytes)
        try:
            ctypes.memmove(slot.address, ptr, nbytes)
            request_id = next(client._request_ids)
            buffer_id, offset = slot.buffer_id, slot.offset
            entry = _ring.ENTRY.pack(request_id, self.handle, count, buffer_id, offset,
                                     buffer_id, offset, op, dtype, red_op, root, timeout_ms, 0, 0,
                                     0, b"", b"", 0)
        except BaseException:
            client._staging.release(slot)  # nothing was submitted: the slot is free
            raise
        op_ = _HostOp(client, rings, slot, ptr, nbytes, on_done, entry,
                      state if op != _SEND and op != _RECV else None)
        client._publish(rings, request_id, entry, op_)
        return op_

    def _dtype(self, dtype: Any, *arrays: Optional[np.ndarray]) -> int:
        arrays_ = [a for a in arrays if a is not None]
        first = arrays_[0].dtype
        for a in arrays_[1:]:
            if a.dtype != first:
                raise _invalid(f"arrays of different dtypes: {first} and {a.dtype}")
        try:
            return dtype_number(first, dtype)
        except ValueError as e:
            raise _invalid(str(e)) from None

    @staticmethod
    def _red(op: RedOpLike) -> int:
        try:
            return red_op_number(op)
        except ValueError as e:
            raise _invalid(str(e)) from None

    def _check_root(self, root: int, what: str = "root") -> int:
        if not 0 <= int(root) < self.nranks:
            raise _invalid(f"{what} {root} out of range for {self.nranks} ranks")
        return int(root)

    # -- collectives ---------------------------------------------------------------------------

    def all_reduce(self, x: ArrayLike, op: RedOpLike = ReduceOp.SUM, *,
                   out: Optional[ArrayLike] = None, async_op: bool = False,
                   timeout: Optional[float] = None, algo: Optional[str] = None,
                   dtype: Any = None, compression: Optional[str] = None,
                   compression_key: Optional[int] = None, stream: Any = None) -> OpResult:
        """Reduces ``x`` element-wise over all ranks; every rank gets the result.

        Args:
            x: this rank's contribution (any shape; same size and dtype on every rank).
            op: ``"sum"`` (default), ``"prod"``, ``"min"``, ``"max"``, ``"avg"`` or a
                :class:`ReduceOp`.
            out: where the result goes (same size as ``x``); default ``x`` itself (in place).
            dtype: only ``"bfloat16"``, for 2-byte arrays holding bfloat16 bits.
            compression: the inter-node codec (default ``$RAILYARD_COMPRESSION``, else none):
                float32/float16/bfloat16 sum/avg across nodes only, elsewhere exact. All
                ranks must agree.
            compression_key: error feedback under this key (an int in [0, 2**64), one per
                tensor or bucket that recurs); ``None``: no feedback.

        Returns:
            ``out`` (or ``x``), or a :class:`Work` with ``async_op=True``.
        """
        x = self._check_array("x", x)
        out = x if out is None else self._check_array("out", out)
        if out.size != x.size:
            raise _invalid(f"all_reduce: out has {out.size} elements, x has {x.size}")
        extra = self._compression(compression, compression_key)
        return self._run(common_pb2.COLLECTIVE_OP_ALL_REDUCE, dtype=self._dtype(dtype, x, out),
                         count=x.size, red_op=self._red(op), send=x, recv=out, result=out,
                         async_op=async_op, timeout=timeout, algo=algo, stream=stream, **extra)

    def _compression(self, compression: Optional[str],
                     compression_key: Optional[int]) -> Dict[str, Any]:
        """The request fields of a compression setting (docs/compression.md)."""
        extra: Dict[str, Any] = {
            "compression": (compression if compression is not None
                            else self.client.default_compression)}
        if compression_key is not None:
            key = int(compression_key)
            if not 0 <= key < 1 << 64:
                raise _invalid(f"compression_key {compression_key} is not in [0, 2**64)")
            extra["error_feedback"] = True
            extra["compression_key"] = key
        return extra

    def reduce_scatter(self, x: ArrayLike, op: RedOpLike = ReduceOp.SUM, *,
                       out: Optional[ArrayLike] = None, async_op: bool = False,
                       timeout: Optional[float] = None, algo: Optional[str] = None,
                       dtype: Any = None, compression: Optional[str] = None,
                       compression_key: Optional[int] = None, stream: Any = None) -> OpResult:
        """Reduces ``x`` over all ranks and gives rank ``r`` the ``r``-th of ``nranks`` equal
        chunks of the result (in C order).

        Args:
            x: ``nranks * c`` elements on every rank.
            out: ``c`` elements; default a new array of shape ``x.shape[1:]`` when
                ``x.shape[0] == nranks``, else of shape ``(c,)`` (shared when ``x`` is).
            compression, compression_key: as for :meth:`all_reduce` (each rank's chunk is
                compressed on its way to its owner only).

        Returns:
            ``out``, or a :class:`Work` with ``async_op=True``.
        """
        x = self._check_array("x", x)
        if x.size % self.nranks:
            raise _invalid(f"reduce_scatter: x has {x.size} elements, not a multiple of "
                           f"{self.nranks} ranks")
        count = x.size // self.nranks
        if out is None:
            shape = x.shape[1:] if x.ndim >= 1 and x.shape[0] == self.nranks else (count,)
            out = self._like(x, shape)
        out = self._check_array("out", out)
        if out.size != count:
            raise _invalid(f"reduce_scatter: out has {out.size} elements, expected {count} "
                           f"(x.size / nranks)")
        return self._run(common_pb2.COLLECTIVE_OP_REDUCE_SCATTER,
                         dtype=self._dtype(dtype, x, out), count=count, red_op=self._red(op),
                         send=x, recv=out, result=out, async_op=async_op, timeout=timeout,
                         algo=algo, stream=stream, **self._compression(compression,
                                                                       compression_key))

    def all_gather(self, x: ArrayLike, *, out: Optional[ArrayLike] = None,
                   async_op: bool = False, timeout: Optional[float] = None,
                   algo: Optional[str] = None, dtype: Any = None,
                   stream: Any = None) -> OpResult:
        """Gathers every rank's ``x``: ``out[r]`` is rank ``r``'s ``x``.

        Args:
            x: ``c`` elements on every rank.
            out: ``nranks * c`` elements; default a new array of shape ``(nranks, *x.shape)``
                (shared when ``x`` is). Rank ``r``'s data lands at elements ``[r*c, (r+1)*c)``.

        Returns:
            ``out``, or a :class:`Work` with ``async_op=True``.
        """
        x = self._check_array("x", x)
        if out is None:
            out = self._like(x, (self.nranks,) + x.shape)
        out = self._check_array("out", out)
        if out.size != x.size * self.nranks:
            raise _invalid(f"all_gather: out has {out.size} elements, expected "
                           f"{x.size * self.nranks} (nranks * x.size)")
        return self._run(common_pb2.COLLECTIVE_OP_ALL_GATHER, dtype=self._dtype(dtype, x, out),
                         count=x.size, send=x, recv=out, result=out, async_op=async_op,
                         timeout=timeout, algo=algo, stream=stream)

    def broadcast(self, x: ArrayLike, root: int = 0, *, async_op: bool = False,
                  timeout: Optional[float] = None, algo: Optional[str] = None,
                  dtype: Any = None, stream: Any = None) -> OpResult:
        """Copies root's ``x`` into ``x`` on every rank (in place).

        Returns:
            ``x``, or a :class:`Work` with ``async_op=True``.
        """
        x = self._check_array("x", x)
        root = self._check_root(root)
        return self._run(common_pb2.COLLECTIVE_OP_BROADCAST, dtype=self._dtype(dtype, x),
                         count=x.size, root=root, send=x if self.rank == root else None, recv=x,
                         result=x, async_op=async_op, timeout=timeout, algo=algo, stream=stream)

    def reduce(self, x: ArrayLike, root: int = 0, op: RedOpLike = ReduceOp.SUM, *,
               out: Optional[ArrayLike] = None, async_op: bool = False,
               timeout: Optional[float] = None, algo: Optional[str] = None,
               dtype: Any = None, stream: Any = None) -> OpResult:
        """Reduces ``x`` over all ranks into ``out`` (default ``x``) on ``root`` only; the other
        ranks' ``out`` is left untouched.

        Returns:
            ``out`` (or ``x``), or a :class:`Work` with ``async_op=True``.
        """
        x = self._check_array("x", x)
        root = self._check_root(root)
        out = x if out is None else self._check_array("out", out)
        if out.size != x.size:
            raise _invalid(f"reduce: out has {out.size} elements, x has {x.size}")
        return self._run(common_pb2.COLLECTIVE_OP_REDUCE, dtype=self._dtype(dtype, x, out),
                         count=x.size, red_op=self._red(op), root=root, send=x,
                         recv=out if self.rank == root else None, result=out,
                         async_op=async_op, timeout=timeout, algo=algo, stream=stream)

    def all_to_all(self, x: ArrayLike, *, out: Optional[ArrayLike] = None,
                   async_op: bool = False, timeout: Optional[float] = None,
                   algo: Optional[str] = None, dtype: Any = None,
                   stream: Any = None) -> OpResult:
        """Rank ``r`` sends the ``p``-th of its ``nranks`` equal chunks of ``x`` to rank ``p``
        and receives rank ``p``'s ``r``-th chunk as the ``p``-th chunk of ``out``.

        Args:
            x: ``nranks * c`` elements.
            out: ``nranks * c`` elements; default a new array shaped like ``x``.

        Returns:
            ``out``, or a :class:`Work` with ``async_op=True``.
        """
        x = self._check_array("x", x)
        if x.size % self.nranks:
            raise _invalid(f"all_to_all: x has {x.size} elements, not a multiple of "
                           f"{self.nranks} ranks")
        if out is None:
            out = self._like(x, x.shape)
        out = self._check_array("out", out)
        if out.size != x.size:
            raise _invalid(f"all_to_all: out has {out.size} elements, x has {x.size}")
        return self._run(common_pb2.COLLECTIVE_OP_ALL_TO_ALL, dtype=self._dtype(dtype, x, out),
                         count=x.size // self.nranks, send=x, recv=out, result=out,
                         async_op=async_op, timeout=timeout, algo=algo, stream=stream)

    def all_to_all_v(self, x: ArrayLike, send_counts: Sequence[int],
                     recv_counts: Sequence[int], *, out: Optional[ArrayLike] = None,
                     send_displs: Optional[Sequence[int]] = None,
                     recv_displs: Optional[Sequence[int]] = None, async_op: bool = False,
                     timeout: Optional[float] = None, algo: Optional[str] = None,
                     dtype: Any = None, stream: Any = None) -> OpResult:
        """All-to-all with per-peer sizes: ``send_counts[p]`` elements of ``x`` starting at
        ``send_displs[p]`` go to rank ``p``, and ``recv_counts[p]`` elements from rank ``p``
        land in ``out`` at ``recv_displs[p]`` (counts and displacements in elements).

        Rank ``j``'s ``send_counts[i]`` must equal rank ``i``'s ``recv_counts[j]``.
        Displacements default to the running sums of the counts; ``out`` defaults to a new flat
        array just large enough.

        Returns:
            ``out``, or a :class:`Work` with ``async_op=True``.
        """
        x = self._check_array("x", x)

        def vec(name: str, values: Optional[Sequence[int]],
                counts: Optional[List[int]] = None) -> List[int]:
            if values is None:
                assert counts is not None
                return [0] + list(itertools.accumulate(counts))[:-1]
            v = [int(c) for c in values]
            if len(v) != self.nranks or any(c < 0 for c in v):
                raise _invalid(f"all_to_all_v: {name} needs {self.nranks} non-negative entries, "
                               f"got {list(values)}")
            return v

        sc = vec("send_counts", send_counts)
        rc = vec("recv_counts", recv_counts)
        sd = vec("send_displs", send_displs, sc)
        rd = vec("recv_displs", recv_displs, rc)
        send_need = max((d + c for d, c in zip(sd, sc)), default=0)
        recv_need = max((d + c for d, c in zip(rd, rc)), default=0)
        if send_need > x.size:
            raise _invalid(f"all_to_all_v: x has {x.size} elements, counts/displs need "
                           f"{send_need}")
        if out is None:
            out = self._like(x, (recv_need,))
        out = self._check_array("out", out)
        if recv_need > out.size:
            raise _invalid(f"all_to_all_v: out has {out.size} elements, counts/displs need "
                           f"{recv_need}")
        return self._run(common_pb2.COLLECTIVE_OP_ALL_TO_ALL_V, dtype=self._dtype(dtype, x, out),
                         send=x, recv=out, result=out, async_op=async_op, timeout=timeout,
                         algo=algo, stream=stream, send_counts=sc, send_displs=sd,
                         recv_counts=rc, recv_displs=rd)

    def send(self, x: ArrayLike, peer: int, *, async_op: bool = False,
             timeout: Optional[float] = None, dtype: Any = None,
             stream: Any = None) -> OpResult:
        """Sends ``x`` to rank ``peer``, which calls :meth:`recv` with the same size and dtype.
        Pairs match in FIFO order per (sender, receiver), independently of collectives.

        Returns:
            ``x``, or a :class:`Work` with ``async_op=True``.
        """
        x = self._check_array("x", x)
        peer = self._check_root(peer, "peer")
        return self._run(common_pb2.COLLECTIVE_OP_SEND, dtype=self._dtype(dtype, x), count=x.size,
                         root=peer, send=x, result=x, async_op=async_op, timeout=timeout,
                         stream=stream)

    def recv(self, x: ArrayLike, peer: int, *, async_op: bool = False,
             timeout: Optional[float] = None, dtype: Any = None,
             stream: Any = None) -> OpResult:
        """Receives into ``x`` what rank ``peer`` sends with :meth:`send`.

        Returns:
            ``x``, or a :class:`Work` with ``async_op=True``.
        """
        x = self._check_array("x", x)
        peer = self._check_root(peer, "peer")
        return self._run(common_pb2.COLLECTIVE_OP_RECV, dtype=self._dtype(dtype, x), count=x.size,
                         root=peer, recv=x, result=x, async_op=async_op, timeout=timeout,
                         stream=stream)

    def barrier(self, *, async_op: bool = False, timeout: Optional[float] = None,
                stream: Any = None) -> OpResult:
        """Returns once every rank has entered the barrier.

        Returns:
            ``None``, or a :class:`Work` with ``async_op=True``.
        """
        return self._run(common_pb2.COLLECTIVE_OP_BARRIER, dtype=common_pb2.DATA_TYPE_UNSPECIFIED,
                         async_op=async_op, timeout=timeout, stream=stream)
