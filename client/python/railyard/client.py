"""Sessions with the daemon over its local API: :class:`Client` (the session, its event reader,
its rings, shared buffers, device memory, stream ordering, submission), :func:`connect` and
:func:`init_from_env`.

See docs/local-api.md for the protocol. In short: :func:`connect` opens the ``Connect`` stream
(whose first event names the session) and a thread reads it; every collective is a ``Submit``
whose outcome arrives later on that stream as a ``Completion`` keyed by the request id chosen
here, so the waiter is registered before the request is sent. Communicators and their
collectives are in :mod:`railyard.comm`, operations in flight in :mod:`railyard.work`.
"""

from __future__ import annotations

import atexit
import bisect
import collections
import itertools
import os
import stat
import struct
import threading
import weakref
from typing import Any, List, Optional, Sequence, Tuple, Union

import grpc
import grpc.experimental
import numpy as np

from . import _fd_channel, _memfd, _pool, _ring, _staging, _streams
from ._device import DeviceArray, _Registration
from ._generated import VERSION as _VERSION  # project(VERSION) of CMakeLists.txt
from ._generated import local_pb2, local_pb2_grpc
from ._request import _Request
from ._util import SPAWN_HINT as _SPAWN_HINT
from ._util import invalid as _invalid
from .comm import Comm
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
from .wire import timeout_ms as _timeout_ms
from .work import Work

# Comm and Work are defined in railyard.comm and railyard.work; they stay importable from here.
__all__ = ["Client", "Comm", "Work", "connect", "init_from_env", "DEFAULT_SOCKET"]

#: Socket used when neither ``socket=`` nor ``$RAILYARD_SOCKET`` is given.
DEFAULT_SOCKET = "/run/railyard/railyard.sock"
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


def _address(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


class _Region:
    """A registered shared buffer's address range, for finding arrays that lie inside it."""

    __slots__ = ("start", "end", "ref", "buffer_id")

    def __init__(self, start: int, end: int, mapping: object, buffer_id: int) -> None:
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
        self._region_keys: List[Tuple[int, int]] = []  # (start, -end): the regions' order
        self._region_starts: List[int] = []
        self._regions_live = 0  # regions left by the last pruning
        self._to_release: collections.deque = collections.deque()
        # Staging slots for arrays not in shared memory (see _staging).
        self._staging = _staging.Pool(self._allocate)
        # Small arrays from empty(): chunks of larger registered buffers (see _pool). Off with
        # RAILYARD_POOL_SMALL_BUFFERS=0: each array a buffer of its own, bounds checked exactly.
        self._pool: Optional[_pool.Pool] = (
            None if os.environ.get("RAILYARD_POOL_SMALL_BUFFERS", "1") == "0"
            else _pool.Pool(self._allocate, self._register_part))
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
        weakref.finalize(mapping, self._to_release.append, response.buffer_id)
        self._add_region(_Region(start, start + size, mapping, response.buffer_id))
        return mapping

    def _register_part(self, mapping: _memfd.Mapping, offset: int, nbytes: int,
                       owner: object) -> int:
        """Registers ``nbytes`` at ``offset`` of a registered ``mapping`` as a buffer of its own
        (a pooled chunk, see _pool), released once ``owner`` is gone."""
        self._flush_releases()
        response = self._call("RegisterBuffer", local_pb2.RegisterBufferRequest(
            parent_buffer_id=mapping.buffer_id, parent_offset=offset, size_bytes=nbytes))
        weakref.finalize(owner, self._to_release.append, response.buffer_id)
        start = mapping.address + offset
        self._add_region(_Region(start, start + nbytes, owner, response.buffer_id))
        return response.buffer_id

    def _add_region(self, region: "_Region") -> None:
        with self._lock:
            # Regions whose owner is gone (their address range may be reused) are dropped once
            # the list has doubled since the last time, not on every allocation: a lookup skips
            # them (_locate), and a new region with the same range sorts after the dead one.
            if len(self._regions) >= 2 * self._regions_live + 64:
                self._regions = [r for r in self._regions if r.ref() is not None]
                self._region_keys = [(r.start, -r.end) for r in self._regions]
                self._region_starts = [r.start for r in self._regions]
                self._regions_live = len(self._regions)
            # A part lies inside its slab's region: sorted after it, it is what a lookup finds
            # first.
            key = (region.start, -region.end)
            i = bisect.bisect_right(self._region_keys, key)
            self._regions.insert(i, region)
            self._region_keys.insert(i, key)
            self._region_starts.insert(i, region.start)

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
        Arrays of at most 256 KiB are chunks of larger registered buffers, which go back to
        their pool instead (each registered buffer costs the daemon a mapping, and each job has
        a share of them); ``RAILYARD_POOL_SMALL_BUFFERS=0`` registers each array on its own.

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
        nbytes = max(n * dt.itemsize, 1)
        if self._pool is not None and _pool.pooled(nbytes):
            return self._pool.array(nbytes, dt, n).reshape(shape_t)
        mapping = self._allocate(nbytes)
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
            # The innermost live region holding it: a part before the slab it lies in (parts
            # already gone are skipped, a few at most before the list is pruned).
            for j in range(i, max(i - 64, -1), -1):
                region = self._regions[j]
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
