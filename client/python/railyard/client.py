"""Sessions, shared buffers, communicators and collectives over the daemon's local API.

See docs/local-api.md for the protocol. In short: :func:`connect` opens the ``Connect`` stream
(whose first event names the session) and a thread reads it; every collective is a ``Submit``
whose outcome arrives later on that stream as a ``Completion`` keyed by the request id chosen
here, so the waiter is registered before the request is sent.
"""

from __future__ import annotations

import atexit
import bisect
import collections
import ctypes
import itertools
import math
import os
import stat
import struct
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import grpc
import grpc.experimental
import numpy as np

from . import _fd_channel, _memfd, _ring, _staging, _streams
from ._device import DeviceArray, _Registration
from ._types import RedOpLike, ReduceOp, dtype_number, red_op_number
from .errors import (
    CancelledError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    RailyardError,
    UnavailableError,
    error_from_code,
    error_from_rpc,
)

try:
    from .v1 import common_pb2, local_pb2, local_pb2_grpc
except ImportError as _e:  # pragma: no cover - only in an unbuilt source tree
    raise ImportError(
        "railyard's generated gRPC stubs (railyard.v1.*_pb2) are missing: use the copy the build "
        "places in <build>/python (cmake target railyard_python), or `pip install "
        "./client/python`, or run client/python/gen_stubs.py") from _e

__all__ = ["Client", "Comm", "Work", "connect", "init_from_env", "DEFAULT_SOCKET"]

#: Socket used when neither ``socket=`` nor ``$RAILYARD_SOCKET`` is given.
DEFAULT_SOCKET = "/run/railyard/railyard.sock"
from ._version import VERSION as _VERSION  # generated from CMakeLists.txt
# Deadline of every unary RPC but InitComm (seconds).
_RPC_TIMEOUT = 30.0
# InitComm: its own timeout plus this margin, or this much when the daemon's default applies.
_INIT_MARGIN = 5.0
_INIT_DEFAULT_DEADLINE = 600.0
_DEFAULT_SPIN_US = 50  # RAILYARD_SPIN_US when unset (see Client.__init__)
_DEFAULT_KEEPALIVE_MS = 5000  # RAILYARD_KEEPALIVE_MS when unset (see _keepalive_options)
_MIN_KEEPALIVE_MS = 1000

_SINGLE_THREADED_UNARY_STREAM = getattr(getattr(grpc.experimental, "ChannelOptions", None),
                                        "SingleThreadedUnaryStream",
                                        "SingleThreadedUnaryStream")

ArrayLike = Union[np.ndarray, DeviceArray]
Shape = Union[int, Sequence[int]]


def _env(name: str, fallback: Optional[str] = None) -> Optional[str]:
    value = os.environ.get(name)
    return value if value else fallback


def _check_socket(path: str) -> None:
    """A clear error before gRPC's generic one when the socket is obviously not there."""
    if len(path.encode()) >= 108:
        raise InvalidArgumentError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"socket path {path} is {len(path.encode())} bytes; Unix sockets allow at most 107")
    try:
        st = os.stat(path)
    except OSError as e:
        hint = (" (is railyardd running? the socket is set by its --socket flag and by "
                "RAILYARD_SOCKET for clients)") if isinstance(e, FileNotFoundError) else ""
        raise UnavailableError(grpc.StatusCode.UNAVAILABLE,
                               f"railyardd not reachable at {path}: {e.strerror}{hint}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise UnavailableError(grpc.StatusCode.UNAVAILABLE,
                               f"railyardd not reachable at {path}: not a Unix socket")


def _keepalive_options() -> List[Tuple[str, int]]:
    """HTTP/2 keepalive on the session's channel (``RAILYARD_KEEPALIVE_MS``, default 5000; 0:
    off): a daemon that answers no ping for that long (stopped, wedged) ends the session, and
    with it every wait, with UNAVAILABLE, as a daemon that exits does."""
    value = _env("RAILYARD_KEEPALIVE_MS", "") or str(_DEFAULT_KEEPALIVE_MS)
    try:
        ms = int(value)
        if ms != 0 and not _MIN_KEEPALIVE_MS <= ms <= 0x7FFFFFFF:
            raise ValueError
    except ValueError:
        raise _invalid(f"RAILYARD_KEEPALIVE_MS={value}: expected 0 (off) or milliseconds in "
                       f"[{_MIN_KEEPALIVE_MS}, 2147483647] (gRPC pings at most once a "
                       "second)") from None
    if ms == 0:
        return []
    # max_pings_without_data 0: the session's stream is quiet while operations go over the
    # rings, and gRPC would otherwise stop pinging after two pings without data.
    return [("grpc.keepalive_time_ms", ms), ("grpc.keepalive_timeout_ms", ms),
            ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]


def _check_integrity(integrity: str) -> str:
    if integrity not in ("", "none", "crc32c"):
        raise _invalid(f"integrity {integrity!r}: expected 'none' or 'crc32c'")
    return integrity


def _timeout_ms(timeout: Optional[float]) -> int:
    if timeout is None:
        return 0
    ms = int(math.ceil(float(timeout) * 1000.0))
    if ms <= 0 or ms > 0xFFFFFFFF:
        raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"timeout {timeout} s out of range")
    return ms


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, message)


def _address(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


def _sleep_until_done(work: Any, deadline: Optional[float]) -> bool:
    """Sleeps until ``work._done`` (True) or the ``time.monotonic()`` deadline (False).

    For a work whose completion is a ``_done`` flag, set under ``work._lock``, that sets
    ``work._event`` too once one exists: the Event (~2 us to make) is made only here, for a thread
    that must sleep (this client's Work and the torch backend's)."""
    with work._lock:
        if work._done:
            return True
        if work._event is None:
            work._event = threading.Event()
        event = work._event
    return event.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))


class _OnRings:
    """What a work submitted on the session rings (``_rings``, or None: over gRPC) does to wait
    for its completion (``_done``) on the calling thread: shared by :class:`Work` and the lean
    path's :class:`_HostOp`."""

    __slots__ = ()
    _rings: Optional[_ring.Rings]
    _done: bool

    def _drive(self, deadline: Optional[float]) -> None:
        """Reads the session's completion ring on this thread until done or the deadline
        (``time.monotonic()``)."""
        rings = self._rings
        if rings is not None and not self._done:
            try:
                rings.wait_until(lambda: self._done, deadline)
            except _ring.ForkedError:
                raise FailedPreconditionError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"this operation was submitted by the process that process {os.getpid()} "
                    f"was forked from; it cannot wait for it: {_SPAWN_HINT}") from None

    def _poll(self) -> None:
        rings = self._rings
        if rings is not None and not rings._forked:
            rings.drain(blocking=False)

    def _wanted_in_background(self) -> None:
        """Someone off the submitting thread waits for this work (a callback, a torch future):
        the session's background reader reads its completion promptly."""
        rings = self._rings
        if rings is not None:
            rings.background_wanted()


class Work(_OnRings):
    """An operation in flight, returned by every collective called with ``async_op=True``.

    The outcome is final once :meth:`is_completed` is true; :meth:`wait` may be called any number
    of times and returns (or raises) the same thing each time. Results of arrays that are not in
    shared memory have been copied out by the time the operation counts as completed.
    """

    # Completion is the _done flag (read without a lock: it is set last, after _error and
    # _seq). A threading.Event (~2 us to make) exists only once a thread must block for it:
    # a thread on the session rings reads them itself until _done instead.
    __slots__ = ("_done", "_event", "_lock", "_error", "_result", "_finish", "_callbacks",
                 "_seq", "_rings", "_stream_slot", "__weakref__")

    def __init__(self, result: Any = None,
                 finish: Optional[Callable[[bool], None]] = None,
                 stream_slot: Optional[_streams.Slot] = None) -> None:
        self._done = False
        self._event: Optional[threading.Event] = None
        self._lock = threading.Lock()
        self._error: Optional[RailyardError] = None
        self._result = result
        self._finish = finish
        self._callbacks: Optional[List[Callable[["Work"], None]]] = None
        self._seq: Optional[int] = None
        self._rings: Optional[_ring.Rings] = None  # set when submitted on the session rings
        # Ordered on a stream (stream=): the stream waits for done, which a failure stores here
        # when the daemon may not have (refused before it, the session gone).
        self._stream_slot = stream_slot

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Waits until the operation completes and returns its result (the output array).

        Args:
            timeout: seconds to wait; ``None`` waits until the daemon answers (its own
                ``--op_timeout`` bounds every operation; a daemon that stops answering ends the
                session, and this wait, with UNAVAILABLE within two keepalive periods,
                ``RAILYARD_KEEPALIVE_MS``, default 5000).

        Raises:
            DeadlineExceededError: not complete within ``timeout``; the operation keeps running in
                the daemon and can be waited on again.
            RailyardError: the operation failed (the subclass matches the daemon's code).
        """
        if not self._done:
            deadline = None if timeout is None else time.monotonic() + timeout
            self._drive(deadline)
            if not self._done and not _sleep_until_done(self, deadline):
                raise DeadlineExceededError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"operation not complete after {timeout} s (it keeps running in the daemon; "
                    "wait again or give up)")
        if self._error is not None:
            raise self._error.with_traceback(None)
        return self._result

    def is_completed(self) -> bool:
        """True once the operation has completed, successfully or not. Reads the session's
        completions on this thread when it has not (a loop that polls is not kept waiting for
        the background reader)."""
        if not self._done:
            self._poll()
        return self._done

    def exception(self) -> Optional[RailyardError]:
        """The error of a completed, failed operation; ``None`` while running or on success."""
        return self._error if self._done else None

    @property
    def seq(self) -> Optional[int]:
        """Sequence number the daemon gave the operation on its communicator (collectives) or
        its (peer, direction) channel (send/recv); ``None`` until known."""
        return self._seq

    def add_done_callback(self, fn: Callable[["Work"], None]) -> None:
        """Calls ``fn(work)`` once the operation completes (at once if it already has).

        Callbacks run on the client's event thread: they must be quick and must not wait for
        other Railyard operations.
        """
        if self._on_done(fn):
            self._wanted_in_background()  # nobody may wait: the reader must read it promptly

    def _on_done(self, fn: Callable[["Work"], None]) -> bool:
        """``add_done_callback`` for a caller that waits for the work itself (no prompt read by
        the background reader needed); True when ``fn`` was queued, False when it ran."""
        with self._lock:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return True
        fn(self)
        return False

    def _complete(self, error: Optional[RailyardError], seq: Optional[int] = None) -> None:
        with self._lock:
            if self._done or self._finish is False:
                return
            finish, self._finish = self._finish, False  # False: completing (ignore repeats)
        if finish:
            try:
                finish(error is None)
            except Exception as e:  # pragma: no cover - copy-out cannot normally fail
                if error is None:
                    error = RailyardError(grpc.StatusCode.INTERNAL, f"copying the result: {e}")
        if error is not None and self._stream_slot is not None:
            self._stream_slot.release()
        with self._lock:
            self._error = error
            if seq is not None:
                self._seq = seq
            self._done = True
            if self._event is not None:
                self._event.set()
            callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for fn in callbacks:
                try:
                    fn(self)
                except Exception:  # pragma: no cover - a callback's bug must not kill the reader
                    import traceback
                    traceback.print_exc()

    def __repr__(self) -> str:
        state = ("running" if not self._done
                 else "ok" if self._error is None else f"failed ({self._error.code.name})")
        return f"<railyard.Work seq={self._seq} {state}>"


class _HostOp(_OnRings):
    """An operation whose send and receive are one host region (``nbytes`` at ``ptr``, kept alive
    by the caller), staged through a shared buffer and submitted as one ring entry: the lean path
    of :meth:`Comm._start_in_place` (the torch backend's small all_reduce), with none of the
    general path's per-operation objects. Completion (on whichever thread reads it) copies the
    result back, returns the staging buffer and calls ``on_done(error)``; the daemon is done
    with the buffer by then, whatever the outcome."""

    __slots__ = ("_client", "_rings", "_slot", "_ptr", "_nbytes", "_on_done", "_done")

    def __init__(self, client: "Client", rings: _ring.Rings, slot: _staging.Slot, ptr: int,
                 nbytes: int, on_done: Callable[[Optional[RailyardError]], None]) -> None:
        self._client = client
        self._rings = rings
        self._slot = slot
        self._ptr = ptr
        self._nbytes = nbytes
        self._on_done: Optional[Callable[[Optional[RailyardError]], None]] = on_done
        self._done = False

    def _complete(self, error: Optional[RailyardError], seq: Optional[int] = None) -> None:
        # Called once: the client hands a completion to the work it pops from its table.
        if error is None:
            ctypes.memmove(self._ptr, self._slot.address, self._nbytes)
        self._client._staging.release(self._slot)
        # Dropped once called: the caller's work usually holds this op (to drive it), so keeping
        # its callback would make a reference cycle per operation, which only the garbage
        # collector frees. Enough of them start full collections (35-45 ms with torch loaded).
        on_done, self._on_done = self._on_done, None
        self._done = True
        if on_done is not None:
            on_done(error)


class _Request:
    """One operation's SubmitRequest fields. The ring path encodes them straight into a ring
    entry; only the gRPC fallback builds the protobuf message (:meth:`proto`)."""

    __slots__ = ("comm_handle", "op", "dtype", "red_op", "count", "root", "timeout_ms", "algo",
                 "compression", "error_feedback", "compression_key", "vectors", "send", "recv",
                 "request_id", "stream_sync")

    def __init__(self, comm_handle: int, op: int, dtype: int, red_op: int, count: int,
                 root: int, timeout_ms: int, algo: str, compression: str = "",
                 error_feedback: bool = False, compression_key: int = 0,
                 send_counts: Optional[List[int]] = None,
                 send_displs: Optional[List[int]] = None,
                 recv_counts: Optional[List[int]] = None,
                 recv_displs: Optional[List[int]] = None) -> None:
        if not isinstance(algo, str):
            raise TypeError(f"algo must be a str, not {type(algo).__name__}")
        if not isinstance(compression, str):
            raise TypeError(f"compression must be a str, not {type(compression).__name__}")
        self.comm_handle = comm_handle
        self.op = op
        self.dtype = dtype
        self.red_op = red_op
        self.count = count
        self.root = root
        self.timeout_ms = timeout_ms
        self.algo = algo
        self.compression = compression
        self.error_feedback = error_feedback
        self.compression_key = compression_key
        self.vectors: Optional[Tuple[List[int], ...]] = None
        if send_counts is not None:
            self.vectors = (send_counts, send_displs or [], recv_counts or [], recv_displs or [])
        self.send: Optional[Tuple[int, int]] = None  # (buffer id, offset)
        self.recv: Optional[Tuple[int, int]] = None
        self.request_id = 0
        self.stream_sync: Optional[Tuple[int, int, int]] = None  # (buffer id, offset, value)

    def proto(self, session_id: str) -> Any:
        r = local_pb2.SubmitRequest(
            session_id=session_id, request_id=self.request_id, comm_handle=self.comm_handle,
            op=self.op, dtype=self.dtype, red_op=self.red_op, count=self.count, root=self.root,
            timeout_ms=self.timeout_ms, algo=self.algo, compression=self.compression,
            error_feedback=self.error_feedback, compression_key=self.compression_key)
        for field, ref in ((r.send, self.send), (r.recv, self.recv)):
            if ref is not None:
                field.buffer_id, field.offset = ref
        if self.stream_sync is not None:
            r.stream_sync.words.buffer_id, r.stream_sync.words.offset, r.stream_sync.value = \
                self.stream_sync
        if self.vectors is not None:
            r.send_counts.extend(self.vectors[0])
            r.send_displs.extend(self.vectors[1])
            r.recv_counts.extend(self.vectors[2])
            r.recv_displs.extend(self.vectors[3])
        return r


class _Region:
    """A registered shared buffer's address range, for finding arrays that lie inside it."""

    __slots__ = ("start", "end", "ref", "buffer_id")

    def __init__(self, start: int, end: int, mapping: _memfd.Mapping, buffer_id: int) -> None:
        self.start = start
        self.end = end
        self.ref = weakref.ref(mapping)
        self.buffer_id = buffer_id


_live_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # pragma: no cover - exit path
    for client in list(_live_clients):
        try:
            if client._pid == os.getpid():
                client.close()
        except Exception:
            pass


#: The process whose clients opened gRPC channels (None: none yet). gRPC's channels, threads and
#: polling state do not survive fork(): a child forked after it must not use them, nor (unless
#: GRPC_ENABLE_FORK_SUPPORT is on) open new ones, which would hang.
_grpc_pid: Optional[int] = None

_SPAWN_HINT = ("gRPC does not survive fork(): start worker processes with the \"spawn\" start "
               "method (multiprocessing.set_start_method(\"spawn\") or "
               "torch.multiprocessing.spawn) and connect in the worker")


def _after_fork_in_child() -> None:  # pragma: no cover - runs in forked children
    # The parent's sessions are the parent's: the child must never disconnect them at exit, nor
    # touch what they share with the parent and the daemon (rings, staging buffers).
    for client in list(_live_clients):
        client._forked = True
    _live_clients.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _check_forked_grpc() -> None:
    global _grpc_pid
    pid = os.getpid()
    if _grpc_pid is not None and _grpc_pid != pid and \
            os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "").lower() not in ("1", "true"):
        raise FailedPreconditionError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"railyard.connect in process {pid}, forked from process {_grpc_pid} after that "
            f"process connected to railyardd: {_SPAWN_HINT}")
    _grpc_pid = pid


class Client:
    """A session with the node's railyardd. Create it with :func:`connect`.

    Thread-safe. Close it with :meth:`close` (or use it as a context manager); a process that
    exits without closing leaves the daemon to notice the broken stream, which it does at once.
    """

    def __init__(self, socket: Optional[str] = None, job: Optional[str] = None,
                 token: Optional[str] = None, *, connect_timeout: float = 5.0,
                 integrity: Optional[str] = None,
                 stream_ops: Optional[_streams.StreamOps] = None) -> None:
        self.socket: str = socket or _env("RAILYARD_SOCKET", DEFAULT_SOCKET)
        self.job: str = job or _env("RAILYARD_JOB", "default")
        token = token if token is not None else _env("RAILYARD_TOKEN", "")
        self.default_algo: str = _env("RAILYARD_ALGO", "") or ""
        self.default_compression: str = _env("RAILYARD_COMPRESSION", "") or ""
        #: End-to-end check asked for on the inter-node transfers of every communicator this
        #: client joins ("none", "crc32c"; "" leaves the daemon's ``--integrity``).
        self.integrity: str = _check_integrity(
            integrity if integrity is not None else (_env("RAILYARD_INTEGRITY", "") or ""))
        self.session_id: str = ""
        self.node_name: str = ""
        self.daemon_version: str = ""

        self._lock = threading.Lock()
        self._pending: dict = {}
        self._request_ids = itertools.count(1)
        self._connected = threading.Event()
        self._ended = threading.Event()
        self._closing = False
        self._end_error: Optional[RailyardError] = None
        self._regions: List[_Region] = []
        self._region_starts: List[int] = []
        self._to_release: collections.deque = collections.deque()
        # Staging slots for arrays not in shared memory (see _staging).
        self._staging = _staging.Pool(self._allocate)
        self._stream = None
        self._stream_ops = stream_ops
        self._stream_words: Optional[_streams.StreamWords] = None
        self._rings: Optional[_ring.Rings] = None
        self._forked = False  # this object was inherited by a forked child (_after_fork_in_child)
        self._pid = os.getpid()

        _check_forked_grpc()
        _check_socket(self.socket)
        keepalive = _keepalive_options()
        self._keepalive_ms = dict(keepalive).get("grpc.keepalive_time_ms", 0)
        # The side channel first: its ticket names, in Connect, the connection whose peer
        # credentials the daemon records and over which this session's buffers travel.
        try:
            self._fds = _fd_channel.FdChannel(self.socket, connect_timeout)
        except _fd_channel.ChannelError as e:
            code = e.code if e.code != 4 else 14  # no answer: the daemon is not reachable
            raise error_from_code(code, f"railyardd not reachable at {self.socket}: {e.message}"
                                  if code == 14 else e.message) from None
        except OSError as e:
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                   f"railyardd not reachable at {self.socket}: fd side channel "
                                   f"{self.socket}.fd: {e.strerror or e}") from None
        # The Connect stream is read on our own thread: with this option that thread polls the
        # call itself instead of waiting for gRPC's channel thread (one thread hop less for
        # every completion).
        self._channel = grpc.insecure_channel(
            "unix:" + self.socket,
            options=[(_SINGLE_THREADED_UNARY_STREAM, 1)] + keepalive)
        self._stub = local_pb2_grpc.LocalStub(self._channel)
        request = local_pb2.ConnectRequest(job_id=self.job, token=token or "", pid=os.getpid(),
                                           client=f"railyard-python/{_VERSION}",
                                           fd_ticket=self._fds.ticket)
        self._stream = self._stub.Connect(request)
        self._reader = threading.Thread(target=self._read_events, name="railyard-events",
                                        daemon=True)
        self._reader.start()

        self._connected.wait(connect_timeout)
        if not self.session_id:
            if self._ended.is_set():
                error: RailyardError = self._end_error or UnavailableError(
                    grpc.StatusCode.UNAVAILABLE, f"railyardd at {self.socket} closed the session")
            else:
                error = UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                         f"railyardd not reachable at {self.socket}: no answer "
                                         f"within {connect_timeout} s")
            self._shutdown(disconnect=False)
            raise error
        _live_clients.add(self)
        # The fast path: on unless RAILYARD_FASTPATH=0; "1" makes a failure to set it up an error.
        fastpath = _env("RAILYARD_FASTPATH", "") or ""
        if fastpath != "0" and (_ring.supported() or fastpath == "1"):
            # 50 us, not the C++ client's 10: a peer rank in Python spends ~10 us of Python on
            # each operation before its entry reaches the daemon, so a shorter spin would
            # sleep (and be woken by a system call) waiting for it. One rank alone completes
            # within either (4 B all_reduce, one process: 15.5-17.6 us with 10, 20 and 50).
            spin = _env("RAILYARD_SPIN_US", "") or str(_DEFAULT_SPIN_US)
            try:
                spin_us = int(spin)
                if not 0 <= spin_us <= 1000000:
                    raise ValueError
            except ValueError:
                self._shutdown(disconnect=True)
                raise _invalid(f"RAILYARD_SPIN_US={spin}: expected microseconds in "
                               "[0, 1000000]") from None
            try:
                self._open_rings(spin_us)
            except (RailyardError, OSError, ValueError) as e:
                if fastpath == "1":
                    self._shutdown(disconnect=True)
                    raise error_from_code(getattr(e, "code", grpc.StatusCode.INTERNAL),
                                          f"RAILYARD_FASTPATH=1: the session rings could not "
                                          f"be opened: {e}") from None

    def _open_rings(self, spin_us: int) -> None:
        if not _ring.supported():
            raise FailedPreconditionError(grpc.StatusCode.FAILED_PRECONDITION,
                                          "the ring fast path needs x86-64 Linux")
        rings = _ring.Rings(self.job, self._on_ring_completion, spin_us)
        try:
            try:
                handle = self._fds.put(rings.fd, _RPC_TIMEOUT)
            except _fd_channel.ChannelError as e:
                raise error_from_code(e.code, f"OpenRings: {e.message}") from None
            self._call("OpenRings", local_pb2.OpenRingsRequest(
                fd_handle=handle, sq_entries=rings.sq_entries, cq_entries=rings.cq_entries))
        finally:
            rings.close_fd()
        rings.start_reader()
        self._rings = rings

    @property
    def fastpath(self) -> bool:
        """True when operations go over the session rings (``RAILYARD_FASTPATH``)."""
        return self._rings is not None

    def _on_ring_completion(self, request_id: int, code: int, message: str, seq: int) -> None:
        with self._lock:
            work = self._pending.pop(request_id, None)
        if work is not None:
            work._complete(None if code == 0 else error_from_code(code, message), seq)

    # -- session -------------------------------------------------------------------------------

    def _read_events(self) -> None:
        final: Optional[grpc.RpcError] = None
        try:
            for event in self._stream:
                kind = event.WhichOneof("event")
                if kind == "connected":
                    if not self._connected.is_set():
                        self.session_id = event.connected.session_id
                        self.node_name = event.connected.node_name
                        self.daemon_version = event.connected.daemon_version
                        self._connected.set()
                elif kind == "completion":
                    c = event.completion
                    with self._lock:
                        work = self._pending.pop(c.request_id, None)
                    if work is not None:
                        work._complete(None if c.code == 0 else error_from_code(c.code, c.message),
                                       c.seq)
        except grpc.RpcError as e:
            final = e
        except Exception as e:  # pragma: no cover - defensive: never die silently
            final = None
            self._end_error = RailyardError(grpc.StatusCode.INTERNAL, f"event reader: {e!r}")
        # Completions the daemon wrote before the session ended are outcomes, not orphans (a
        # shutdown fails the operations first, then ends the sessions).
        if self._rings is not None:
            try:
                self._rings.drain()
            except Exception:  # pragma: no cover - the mapping is ours; defensive only
                pass
        with self._lock:
            if self._closing:
                end: RailyardError = CancelledError(grpc.StatusCode.CANCELLED,
                                                    "the client disconnected")
            elif self._end_error is not None:
                end = self._end_error
            elif final is None:
                end = UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                       f"railyardd at {self.socket} closed the session")
            elif not self._connected.is_set():
                code = final.code()
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    end = UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                           f"railyardd not reachable at {self.socket}: "
                                           f"{final.details()}")
                else:  # the daemon refused the session (token, job id): its words say why
                    end = error_from_rpc(final)
            elif "keepalive" in (final.details() or ""):
                end = UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                       f"railyardd at {self.socket} stopped answering: no reply "
                                       f"to a keepalive ping within {self._keepalive_ms} ms "
                                       f"(is it stopped or wedged?); the session is over "
                                       f"({final.details()}; RAILYARD_KEEPALIVE_MS sets it)")
            else:
                end = error_from_code(final.code(),
                                      f"railyardd at {self.socket} closed the session: "
                                      f"{final.details()}")
            self._end_error = end
            orphans, self._pending = self._pending, {}
        self._ended.set()
        self._connected.set()  # wakes a connect() still waiting
        if self._rings is not None:
            self._rings.close()
        for work in orphans.values():
            work._complete(end)

    def _session_error(self) -> Optional[RailyardError]:
        # _forked, set by the at-fork hook, not os.getpid(): a system call (~1.4 us on a
        # paravirtualised guest) on every operation.
        if self._forked:
            return FailedPreconditionError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this railyard.Client was connected by process {self._pid}; process "
                f"{os.getpid()} is a fork of it and cannot use its session: {_SPAWN_HINT}")
        if self._closing:
            return FailedPreconditionError(grpc.StatusCode.FAILED_PRECONDITION,
                                           "the client is closed")
        if self._ended.is_set():
            return self._end_error
        return None

    def _rpc_error(self, rpc: str, err: grpc.RpcError) -> RailyardError:
        code = err.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            session = self._session_error()
            if session is not None:
                return session
            return UnavailableError(code, f"{rpc}: railyardd at {self.socket} unavailable: "
                                          f"{err.details()}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and err.details() == "Deadline Exceeded":
            return DeadlineExceededError(code, f"{rpc}: no answer from railyardd at "
                                               f"{self.socket} in time")
        return error_from_rpc(err)

    def _call(self, rpc: str, request: Any, timeout: float = _RPC_TIMEOUT) -> Any:
        error = self._session_error()
        if error is not None:
            raise error
        request.session_id = self.session_id
        try:
            return getattr(self._stub, rpc)(request, timeout=timeout)
        except grpc.RpcError as e:
            raise self._rpc_error(rpc, e) from None

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called or the daemon ended the session."""
        return self._closing or self._ended.is_set()

    def close(self) -> None:
        """Ends the session (``Disconnect``). The daemon leaves this session's communicators and
        unmaps its buffers; arrays from :meth:`empty` stay valid as ordinary memory here.
        Operations still pending fail with :class:`CancelledError`. Idempotent."""
        self._shutdown(disconnect=True)

    def _shutdown(self, disconnect: bool) -> None:
        if self._pid != os.getpid():
            return  # a forked child: the session (and its threads) are the parent's
        with self._lock:
            if self._closing:
                return
            self._closing = True
        _live_clients.discard(self)
        if disconnect and self.session_id and not self._ended.is_set():
            try:
                self._stub.Disconnect(local_pb2.DisconnectRequest(session_id=self.session_id),
                                      timeout=5.0)
            except grpc.RpcError:
                pass  # the session ends either way
        if self._stream is not None:
            self._stream.cancel()
        if self._reader.is_alive() and self._reader is not threading.current_thread():
            self._reader.join(10.0)
        if self._rings is not None:
            self._rings.close()
        self._channel.close()
        self._fds.close()
        with self._lock:
            self._to_release.clear()
        self._staging.close()
        words = self._stream_words
        if words is not None:
            try:
                words.close()  # its streams have passed their waits: every operation has ended
            except Exception:  # noqa: BLE001 - a StreamOps' failure must not stop the close
                pass

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"session {self.session_id[:8]}…"
        return f"<railyard.Client {self.socket} job={self.job} node={self.node_name} {state}>"

    # -- buffers -------------------------------------------------------------------------------

    def _allocate(self, size: int) -> _memfd.Mapping:
        self._flush_releases()
        error = self._session_error()
        if error is not None:
            raise error
        try:
            mapping, fd = _memfd.create(self.job, size)
        except OSError as e:
            from .errors import ResourceExhaustedError
            raise ResourceExhaustedError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                         f"buffer memory of {size} bytes: {e}") from None
        try:
            try:
                handle = self._fds.put(fd, _RPC_TIMEOUT)
            except _fd_channel.ChannelError as e:
                raise error_from_code(e.code, f"RegisterBuffer: {e.message}") from None
            response = self._call("RegisterBuffer", local_pb2.RegisterBufferRequest(
                fd_handle=handle, size_bytes=size))
        finally:
            os.close(fd)  # both mappings keep the memory; it has no name anyone could open
        mapping.buffer_id = response.buffer_id
        start = _address(np.frombuffer(mapping, dtype=np.uint8, count=1))
        mapping.address = start
        region = _Region(start, start + size, mapping, response.buffer_id)
        weakref.finalize(mapping, self._to_release.append, response.buffer_id)
        with self._lock:
            # Drop regions whose mapping is gone (their address range may be reused).
            live = [r for r in self._regions if r.ref() is not None]
            live.append(region)
            live.sort(key=lambda r: r.start)
            self._regions = live
            self._region_starts = [r.start for r in live]
        return mapping

    def _flush_releases(self) -> None:
        while self._to_release:
            try:
                buffer_id = self._to_release.popleft()
            except IndexError:
                break
            if self.closed:
                continue
            try:
                self._call("ReleaseBuffer", local_pb2.ReleaseBufferRequest(buffer_id=buffer_id))
            except RailyardError:
                pass  # the daemon forgets the buffer with the session anyway

    def empty(self, shape: Shape, dtype: Any = np.float32) -> np.ndarray:
        """A new uninitialized array in shared memory registered with the daemon.

        Collectives on arrays from here (or on contiguous views of them) copy no byte between
        this process and the daemon. The memory is released when the last view of it is gone.

        Args:
            shape: the array's shape (an int or a tuple of ints).
            dtype: any numpy dtype (collectives accept the supported ones: float32, float64,
                float16, int8, uint8, int32, uint32, int64, uint64).
        """
        shape_t = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        dt = np.dtype(dtype)
        n = int(np.prod(shape_t, dtype=np.int64))
        if n < 0 or any(s < 0 for s in shape_t):
            raise ValueError(f"negative dimensions in shape {shape_t}")
        mapping = self._allocate(max(n * dt.itemsize, 1))
        return np.frombuffer(mapping, dtype=dt, count=n).reshape(shape_t)

    # -- device memory (docs/gpu.md) -------------------------------------------------------

    def register_device_memory(self, fd: int, nbytes: int, device: int, *,
                               dtype: Any = np.float32, shape: Optional[Shape] = None,
                               ptr: int = 0) -> DeviceArray:
        """Registers ``nbytes`` of a CUDA VMM allocation on ``device``, from its start, by the
        POSIX file descriptor ``cuMemExportToShareableHandle`` gave for it (the caller keeps
        and closes ``fd``; the daemon holds its own reference). Returns a :class:`DeviceArray`
        of ``dtype`` (and ``shape``, default 1-D) that collectives take like a numpy array.
        ``ptr``: the memory's device address in this process (kept as ``DeviceArray.ptr``).
        The buffer is released when no DeviceArray of it is left.

        Raises :class:`InvalidArgumentError` for a descriptor that is not a device allocation
        of that device or is smaller than ``nbytes``, :class:`FailedPreconditionError` when the
        daemon has no devices.
        """
        nbytes, device, layout = self._check_device_args(nbytes, device, dtype, shape)
        self._flush_releases()
        error = self._session_error()
        if error is not None:
            raise error
        try:
            handle = self._fds.put(fd, _RPC_TIMEOUT)
        except _fd_channel.ChannelError as e:
            raise error_from_code(e.code, f"RegisterBuffer: {e.message}") from None
        response = self._call("RegisterBuffer", local_pb2.RegisterBufferRequest(
            fd_handle=handle, size_bytes=nbytes, memory=local_pb2.MEMORY_KIND_CUDA,
            device=device))
        return self._device_array(response.buffer_id, nbytes, device, ptr, layout)

    def register_cuda_ipc(self, handle: bytes, offset: int, nbytes: int, device: int, *,
                          dtype: Any = np.float32, shape: Optional[Shape] = None,
                          ptr: int = 0) -> DeviceArray:
        """Registers ``nbytes`` of device memory that is not a VMM allocation (``cudaMalloc``'s)
        by legacy CUDA IPC: ``handle`` is the 64-byte ``cudaIpcMemHandle_t`` of its allocation,
        ``offset`` where the memory starts in it. Only a daemon started with ``--cuda_ipc``
        takes it (:class:`FailedPreconditionError` otherwise, saying why: such handles are not
        bound to the process that made them; docs/gpu.md). Otherwise as
        :meth:`register_device_memory`.
        """
        nbytes, device, layout = self._check_device_args(nbytes, device, dtype, shape)
        if int(offset) < 0:
            raise _invalid(f"offset {offset} is negative")
        self._flush_releases()
        error = self._session_error()
        if error is not None:
            raise error
        response = self._call("RegisterBuffer", local_pb2.RegisterBufferRequest(
            size_bytes=nbytes, memory=local_pb2.MEMORY_KIND_CUDA, device=device,
            cuda_ipc_handle=bytes(handle), cuda_ipc_offset=int(offset)))
        return self._device_array(response.buffer_id, nbytes, device, ptr, layout)

    @staticmethod
    def _check_device_args(nbytes: int, device: int, dtype: Any, shape: Optional[Shape]
                           ) -> Tuple[int, int, Tuple[np.dtype, Tuple[int, ...]]]:
        """Checked before anything is registered."""
        if int(nbytes) <= 0:
            raise _invalid(f"cannot register {nbytes} bytes of device memory")
        if int(device) < 0:
            raise _invalid(f"device {device} is not a device ordinal")
        try:
            layout = DeviceArray._layout(int(nbytes), dtype, shape)
        except (TypeError, ValueError) as e:
            raise _invalid(str(e)) from None
        return int(nbytes), int(device), layout

    def _device_array(self, buffer_id: int, nbytes: int, device: int, ptr: int,
                      layout: Tuple[np.dtype, Tuple[int, ...]]) -> DeviceArray:
        reg = _Registration(buffer_id, nbytes, device, int(ptr))
        weakref.finalize(reg, self._to_release.append, buffer_id)
        return DeviceArray(reg, 0, layout[0], layout[1])

    def zeros(self, shape: Shape, dtype: Any = np.float32) -> np.ndarray:
        """Like :meth:`empty`, filled with zeros."""
        arr = self.empty(shape, dtype)
        arr.fill(0)
        return arr

    def is_shared(self, arr: np.ndarray) -> bool:
        """True when collectives on ``arr`` are zero-copy (it lies in one of this client's
        shared buffers and is C-contiguous)."""
        return self._locate(arr) is not None

    def _locate(self, arr: np.ndarray) -> Optional[Tuple[int, int]]:
        if not arr.flags.c_contiguous:
            return None
        addr = _address(arr)
        end = addr + arr.nbytes
        with self._lock:
            i = bisect.bisect_right(self._region_starts, addr) - 1
            if i < 0:
                return None
            region = self._regions[i]
            if end <= region.end and region.ref() is not None:
                return region.buffer_id, addr - region.start
        return None

    def _stream_slot(self, stream: Any) -> _streams.Slot:
        """Enqueues on ``stream`` the ready store and done wait of an operation (stream=)."""
        try:
            with self._lock:
                words = self._stream_words
            if words is None:
                made = _streams.make_stream_words(self, self._stream_ops)
                with self._lock:
                    if self._stream_words is None:
                        self._stream_words = made
                    words = self._stream_words
                if words is not made:
                    made.close()
            return words.enqueue(stream)
        except RailyardError as e:
            raise error_from_code(e.code.value[0], f"ordering the operation on its stream: "
                                  f"{e.message}") from None
        except TypeError as e:
            raise _invalid(f"ordering the operation on its stream: {e}") from None
        except Exception as e:  # noqa: BLE001 - a StreamOps' own failure
            raise FailedPreconditionError(grpc.StatusCode.FAILED_PRECONDITION,
                                          f"ordering the operation on its stream: {e}") from None

    # -- communicators -------------------------------------------------------------------------

    def new_comm_id(self) -> str:
        """A fresh communicator id naming this daemon as coordinator (like ncclGetUniqueId).
        Hand it to every rank, which then calls :meth:`comm`."""
        return self._call("CreateCommId", local_pb2.CreateCommIdRequest()).comm_id

    def comm(self, comm_id: str, rank: int, nranks: int,
             timeout: Optional[float] = None, *, integrity: Optional[str] = None) -> "Comm":
        """Joins communicator ``comm_id`` as ``rank`` of ``nranks``; returns once all have joined.

        Args:
            timeout: seconds to wait for the other ranks (``None``: the daemon's
                ``--init_timeout``). Missing ranks raise :class:`DeadlineExceededError` naming
                them.
            integrity: ``"crc32c"`` checks every inter-node chunk end to end (a mismatch fails
                the operation with :class:`DataLossError`); ``"none"``; ``None``: the client's
                ``integrity`` (``$RAILYARD_INTEGRITY``). The strongest any member asks for
                applies.
        """
        if not 0 <= rank < nranks:
            raise _invalid(f"rank {rank} out of range for {nranks} ranks")
        integrity = self.integrity if integrity is None else _check_integrity(integrity)
        ms = _timeout_ms(timeout)
        deadline = _INIT_DEFAULT_DEADLINE if ms == 0 else ms / 1000.0 + _INIT_MARGIN
        response = self._call("InitComm", local_pb2.InitCommRequest(
            comm_id=comm_id, rank=rank, nranks=nranks, timeout_ms=ms, integrity=integrity),
            timeout=deadline)
        return Comm(self, comm_id, response.comm_handle, rank, nranks, response.nnodes)

    def _submit(self, request: _Request, work: Work) -> None:
        """Submits one request: as an entry of the session rings, else over gRPC."""
        rings = self._rings
        if rings is None:
            self._submit_rpc(request, work)
            return
        request_id = next(self._request_ids)
        request.request_id = request_id
        entry = bytearray()
        try:
            if request.vectors is not None and len({len(v) for v in request.vectors}) != 1:
                raise ValueError("AllToAllv: the four vectors need one entry per rank")
            _ring.Rings.encode(
                entry, request_id, request.comm_handle, request.op, request.dtype,
                request.red_op, request.count, request.root, request.send or (0, 0),
                request.recv or (0, 0), request.timeout_ms, request.algo, False,
                request.vectors, request.compression, request.error_feedback,
                request.compression_key, request.stream_sync)
        except (ValueError, struct.error) as e:
            work._complete(_invalid(str(e)))
            return
        work._rings = rings
        self._publish(rings, request_id, entry, work)

    def _publish(self, rings: _ring.Rings, request_id: int, entry: bytes, work: Any) -> None:
        """Registers ``work`` (anything with ``_complete(error, seq)``) for ``request_id`` and
        publishes its ring entry; a session that has ended completes it with the error."""
        if not self._register(request_id, work):
            return  # not published: an entry nobody waits for (or a fork's) never goes out
        try:
            rings.publish(entry)
        except _ring.RingError as e:
            error = self._session_error() or FailedPreconditionError(
                grpc.StatusCode.FAILED_PRECONDITION, str(e))
            with self._lock:
                pending = self._pending.pop(request_id, None)
            if pending is not None:
                pending._complete(error)

    def _register(self, request_id: int, work: Any) -> bool:
        with self._lock:
            error = self._session_error()
            if error is None:
                self._pending[request_id] = work  # before Submit: never an unknown completion
        if error is not None:
            work._complete(error)
            return False
        return True

    def _submit_rpc(self, request: _Request, work: Work) -> None:
        request_id = next(self._request_ids)
        request.request_id = request_id
        message = request.proto(self.session_id)
        if not self._register(request_id, work):
            return
        try:
            response = self._stub.Submit(message, timeout=_RPC_TIMEOUT)
        except grpc.RpcError as e:
            with self._lock:
                self._pending.pop(request_id, None)
            work._complete(self._rpc_error("Submit", e))
            return
        if work._seq is None:
            work._seq = response.seq


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
    """

    def __init__(self, client: Client, comm_id: str, handle: int, rank: int, nranks: int,
                 nnodes: int) -> None:
        self.client = client
        self.comm_id = comm_id
        self.handle = handle
        self.rank = rank
        self.nranks = nranks
        self.nnodes = nnodes
        self.local_rank: Optional[int] = None

    def __repr__(self) -> str:
        return (f"<railyard.Comm rank {self.rank} of {self.nranks} ({self.nnodes} node(s)) "
                f"{self.comm_id}>")

    def close(self) -> None:
        """Leaves the communicator (``DestroyComm``); other ranks' pending operations fail."""
        if self.handle and not self.client.closed:
            handle, self.handle = self.handle, 0
            self.client._call("DestroyComm", local_pb2.DestroyCommRequest(comm_handle=handle))
        self.handle = 0

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
        if (rings is None or not self.handle or client._forked or client.default_algo or
                client.default_compression or nbytes <= 0):
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
        op_ = _HostOp(client, rings, slot, ptr, nbytes, on_done)
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
        return self._run(common_pb2.COLLECTIVE_OP_BARRIER, dtype=0, async_op=async_op,
                         timeout=timeout, stream=stream)


def connect(socket: Optional[str] = None, job: Optional[str] = None,
            token: Optional[str] = None, *, connect_timeout: float = 5.0,
            integrity: Optional[str] = None,
            stream_ops: Optional[_streams.StreamOps] = None) -> Client:
    """Opens a session with the node's railyardd.

    Args:
        socket: the daemon's Unix socket; default ``$RAILYARD_SOCKET``, else
            ``/run/railyard/railyard.sock``.
        job: the job id (``[A-Za-z0-9._-]{1,128}``); default ``$RAILYARD_JOB``, else
            ``"default"``.
        token: the job's shared secret; default ``$RAILYARD_TOKEN``, else empty. The job's
            first session sets it unless the daemon has a ``--job_tokens`` file.
        connect_timeout: seconds to wait for the daemon's answer.
        integrity: end-to-end check asked for on the inter-node transfers of the
            communicators this client joins: ``"none"`` or ``"crc32c"``; default
            ``$RAILYARD_INTEGRITY``, else the daemon's ``--integrity``.
        stream_ops: how collectives given ``stream=`` are put in order on their stream
            (:class:`railyard.StreamOps`); default CUDA's, through ``libcuda.so.1``.

    Raises:
        UnavailableError: no daemon at the socket (the message names it).
        PermissionDeniedError: wrong token for the job.
        InvalidArgumentError: malformed job id or socket path.
    """
    return Client(socket, job, token, connect_timeout=connect_timeout, integrity=integrity,
                  stream_ops=stream_ops)


def init_from_env(client: Optional[Client] = None, *,
                  timeout: Optional[float] = None) -> Comm:
    """Joins the communicator described by the environment, as set by a launcher (torchrun style).

    Reads ``RANK``, ``WORLD_SIZE`` and ``RAILYARD_COMM_ID`` (required) and ``LOCAL_RANK``
    (optional, kept as ``comm.local_rank``); connects with :func:`connect` (so
    ``RAILYARD_SOCKET``, ``RAILYARD_JOB`` and ``RAILYARD_TOKEN`` apply) unless ``client`` is
    given. ``python3 -m railyard.launch`` sets all of these.
    """
    missing = [n for n in ("RANK", "WORLD_SIZE", "RAILYARD_COMM_ID") if not os.environ.get(n)]
    if missing:
        raise _invalid(f"init_from_env: {', '.join(missing)} not set in the environment "
                       "(a launcher such as `python3 -m railyard.launch` sets them)")
    rank = int(os.environ["RANK"])
    nranks = int(os.environ["WORLD_SIZE"])
    if client is None:
        client = connect()
    comm = client.comm(os.environ["RAILYARD_COMM_ID"], rank, nranks, timeout=timeout)
    local = os.environ.get("LOCAL_RANK")
    comm.local_rank = int(local) if local else rank
    return comm
