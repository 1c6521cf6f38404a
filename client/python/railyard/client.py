"""Sessions with the daemon over its local API: :class:`Client` (the session, its event reader,
its rings, shared buffers, device memory, stream ordering, submission), :func:`connect` and
:func:`init_from_env`.

See docs/local-api.md for the protocol. In short: :func:`connect` opens the ``Connect`` stream
(whose first event names the session) and a thread reads it; every collective is a ``Submit``
whose outcome arrives later on that stream as a ``Completion`` keyed by the request id chosen
here, so the waiter is registered before the request is sent. Communicators and their
collectives are in :mod:`railyard.comm`, operations in flight in :mod:`railyard.work`. A session
outlives its daemon: a handover or a restart moves it to the next one (docs/restarts.md; see
:class:`Client`).
"""

from __future__ import annotations

import atexit
import bisect
import collections
import fcntl
import itertools
import os
import re
import stat
import struct
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import grpc
import grpc.experimental
import numpy as np

from . import _fd_channel, _memfd, _pool, _ring, _staging, _streams
from ._device import DeviceArray, _Registration
from ._generated import VERSION as _VERSION  # project(VERSION) of CMakeLists.txt
from ._generated import common_pb2, local_pb2, local_pb2_grpc
from ._generated import layouts as _ring_h
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
_DEFAULT_RECONNECT_S = 60  # RAILYARD_RECONNECT_S when unset (see _reconnect_seconds)
_MAX_RECONNECT_S = 86400
# How long a session is waited for after a handover at least, whatever RAILYARD_RECONNECT_S.
_HANDOVER_WINDOW_S = 60.0
# A reconnect's attempts to open a session: each bounded by this, and this far apart.
_RECONNECT_ATTEMPT_S = 5.0
_RECONNECT_PAUSE_S = 0.05
# The daemon's marker of a request it hands back untaken (a Submit's grpc error details).
_MOVED_DETAILS = b"railyard.dev/moved"
# What the daemon says to a call naming a session it no longer has (one it handed over).
_UNKNOWN_SESSION = "unknown session id"
_NO_ID = 0xFFFFFFFFFFFFFFFF  # an id no daemon gave: what an id of a released object turns into
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_SEND = common_pb2.COLLECTIVE_OP_SEND
_RECV = common_pb2.COLLECTIVE_OP_RECV

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


def _reconnect_seconds() -> int:
    """``RAILYARD_RECONNECT_S``: how long a client whose daemon went away (not a handover) waits
    for the next one before the session ends; 0: it does not wait (the old behaviour)."""
    value = _env("RAILYARD_RECONNECT_S", "") or ""
    if not value:
        return _DEFAULT_RECONNECT_S
    if not re.fullmatch(r"[0-9]{1,6}", value) or int(value) > _MAX_RECONNECT_S:
        raise _invalid(f"RAILYARD_RECONNECT_S={value}: expected seconds in "
                       f"[0, {_MAX_RECONNECT_S}] (how long a client waits for railyardd to come "
                       "back; 0: not at all)")
    return int(value)


def _moved(err: grpc.RpcError) -> bool:
    """True for a Submit the daemon refused because it hands its node over (not an outcome)."""
    try:
        trailing = err.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - an error that is not a call: not the daemon's marker
        return False
    return any(k == "grpc-status-details-bin" and v == _MOVED_DETAILS for k, v in trailing)


def _gone(e: RailyardError) -> bool:
    """True for a call's error that says its session may be gone: UNAVAILABLE (the daemon went
    away), or NOT_FOUND for the session id (the daemon handed it over). Whether it is gone, the
    end of the session's stream tells."""
    return e.code == grpc.StatusCode.UNAVAILABLE or (
        e.code == grpc.StatusCode.NOT_FOUND and _UNKNOWN_SESSION in e.message)


def _comm_and_op(source: Any) -> Tuple[int, int]:
    """The communicator (as its caller holds it) and the operation of a submitted request: a
    ``_Request``, or a ring entry."""
    if isinstance(source, _Request):
        return source.comm_handle, source.op
    return (_U64.unpack_from(source, _ring_h.RING_SQ_COMM_HANDLE)[0],
            _U32.unpack_from(source, _ring_h.RING_SQ_OP)[0])


def _op_name(op: int) -> str:
    try:
        return common_pb2.CollectiveOp.Name(op)
    except ValueError:
        return f"operation {op}"


class _Link:
    """One session with one daemon: its side channel, gRPC channel, ``Connect`` stream and the
    thread reading it, and its rings. A client has one at a time; a handover or a restart
    replaces it (Client, "Reconnects")."""

    __slots__ = ("fds", "channel", "stub", "stream", "reader", "rings", "session_id",
                 "node_name", "daemon_version", "connected", "answered", "ended", "moving", "end")

    def __init__(self) -> None:
        self.fds: Optional[_fd_channel.FdChannel] = None
        self.channel: Any = None
        self.stub: Any = None
        self.stream: Any = None
        self.reader: Optional[threading.Thread] = None
        self.rings: Optional[_ring.Rings] = None
        self.session_id = ""
        self.node_name = ""
        self.daemon_version = ""
        self.connected = False  # the Connected event arrived
        self.answered = threading.Event()  # connected, or the stream ended before
        self.ended = threading.Event()  # the reader saw the stream end (why: end)
        self.moving = False  # the daemon said it hands the node over (SessionEvent.moving)
        self.end: Optional[RailyardError] = None

    def close(self) -> None:
        """Releases its rings, channel and side channel (its stream has ended or is cancelled)."""
        if self.rings is not None:
            self.rings.close()
        if self.channel is not None:
            self.channel.close()
        if self.fds is not None:
            self.fds.close()


class _CommState:
    """A communicator this client joined, to join it again after a reconnect: the handle the
    current daemon gave it, and the sequence number its next collective would have."""

    __slots__ = ("comm_id", "rank", "nranks", "integrity", "handle", "next_seq", "broken",
                 "owed")

    def __init__(self, comm_id: str, rank: int, nranks: int, integrity: str, handle: int,
                 next_seq: int) -> None:
        self.comm_id = comm_id
        self.rank = rank
        self.nranks = nranks
        self.integrity = integrity
        self.handle = handle
        # One past the highest seq of a collective that completed OK (InitComm's first_seq
        # before any): what the daemon's next collective of it is numbered.
        self.next_seq = next_seq
        self.broken: Optional[RailyardError] = None  # it could not be joined again
        # Collectives of it that other ranks failed in a restart and this rank had not submitted
        # yet when it rejoined: the next ones it submits fail alike (see Client._rejoin).
        self.owed = 0

    def owed_error(self, op: int) -> RailyardError:
        return UnavailableError(
            grpc.StatusCode.UNAVAILABLE,
            f"railyardd restarted during this {_op_name(op)} on another rank of communicator "
            f"{self.comm_id}, which could not run it again; the communicator goes on")


class _BufferRecord:
    """A buffer this client registered, to register it again after a reconnect."""

    __slots__ = ("fd", "size", "device", "ipc_handle", "ipc_offset", "parent", "parent_offset",
                 "id")

    def __init__(self, size: int, *, fd: int = -1, device: int = -1, ipc_handle: bytes = b"",
                 ipc_offset: int = 0, parent: int = 0, parent_offset: int = 0) -> None:
        self.fd = fd  # the memfd (or the device allocation's descriptor), kept open; -1: none
        self.size = size
        self.device = device
        self.ipc_handle = ipc_handle
        self.ipc_offset = ipc_offset
        self.parent = parent  # a part of this buffer (its id as callers hold it)
        self.parent_offset = parent_offset
        self.id = 0  # the current daemon's id of it

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Client:
    """A session with the node's railyardd. Create it with :func:`connect`.

    Thread-safe. Close it with :meth:`close` (or use it as a context manager); a process that
    exits without closing leaves the daemon to notice the broken stream, which it does at once.

    Reconnects (docs/restarts.md): when the daemon hands the node over to a new one
    (``railyardd --takeover``), or goes away and a new one comes up on the same socket within
    ``RAILYARD_RECONNECT_S`` seconds (default 60; 0: the session ends with the daemon), the
    client moves its session there without its caller noticing: it registers its buffers again
    (callers keep the ids they hold; the client translates them), reopens its rings, rejoins its
    communicators where their sequence numbers left off and submits again, in the order they
    were submitted, what the old daemon had not taken, had handed back, or (after a crash) had
    taken but can run again from intact inputs. What a dead daemon had taken and cannot run again
    fails with :class:`UnavailableError` saying the daemon restarted during it.
    :attr:`reconnects` counts the moves.
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
        self._token = token or ""

        self._lock = threading.Lock()
        # Changes of the session (a reconnect starts or ends, a gRPC Submit returns).
        self._cond = threading.Condition(self._lock)
        # Operations submitted and not completed, by request id (works: anything with
        # _complete(error, seq) and the fields of work._OnRings).
        self._pending: dict = {}
        self._request_ids = itertools.count(1)
        self._ended = threading.Event()  # the session is over for good (_end_error says why)
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
        self._stream_ops = stream_ops
        self._stream_words: Optional[_streams.StreamWords] = None
        self._forked = False  # this object was inherited by a forked child (_after_fork_in_child)
        self._pid = os.getpid()

        # The session now (a _Link), and its parts the hot paths read.
        self._link: Optional[_Link] = None
        self._stub: Any = None
        self._fds: Optional[_fd_channel.FdChannel] = None
        self._rings: Optional[_ring.Rings] = None
        # What a reconnect needs: the buffers and communicators by the ids callers hold (the
        # first session's daemon's own ids; after a reconnect, ids of this client's, translated
        # to the current daemon's when sent: _translating).
        self._buffers: Dict[int, _BufferRecord] = {}
        self._comms: Dict[int, _CommState] = {}
        self._next_buffer_id = 1
        self._next_comm_id = 1
        self._translating = False
        self._rebuilding = False  # a reconnect is under way: new submissions wait (_unsent)
        self._unsent: set = set()  # request ids to send (again) once the session is rebuilt
        self._moved: set = set()  # request ids the daemon handed back untaken
        self._generation = 0  # reconnects so far
        self._rebuild_thread: Optional[threading.Thread] = None
        self._joining: set = set()  # InitComm calls in flight (close() cancels them)

        self._reconnect_s = _reconnect_seconds()
        _check_forked_grpc()
        _check_socket(self.socket)
        self._keepalive = _keepalive_options()
        self._keepalive_ms = dict(self._keepalive).get("grpc.keepalive_time_ms", 0)
        # The fast path: on unless RAILYARD_FASTPATH=0; "1" makes a failure to set it up an error.
        self._fastpath = _env("RAILYARD_FASTPATH", "") or ""
        self._spin_us: Optional[int] = None
        if self._fastpath != "0" and (_ring.supported() or self._fastpath == "1"):
            # 50 us, not the C++ client's 10: a peer rank in Python spends ~10 us of Python on
            # each operation before its entry reaches the daemon, so a shorter spin would
            # sleep (and be woken by a system call) waiting for it. One rank alone completes
            # within either (4 B all_reduce, one process: 15.5-17.6 us with 10, 20 and 50).
            spin = _env("RAILYARD_SPIN_US", "") or str(_DEFAULT_SPIN_US)
            try:
                self._spin_us = int(spin)
                if not 0 <= self._spin_us <= 1000000:
                    raise ValueError
            except ValueError:
                raise _invalid(f"RAILYARD_SPIN_US={spin}: expected microseconds in "
                               "[0, 1000000]") from None
        link = self._open_link(connect_timeout)
        with self._lock:
            self._install(link)
        _live_clients.add(self)
        if link.ended.is_set():  # it ended before it was the client's: nobody acted on that
            self._on_link_ended(link, link.end or UnavailableError(
                grpc.StatusCode.UNAVAILABLE, f"railyardd at {self.socket} closed the session"))

    # -- session -------------------------------------------------------------------------------

    def _open_link(self, timeout: float) -> _Link:
        """A session with the daemon at the socket now (side channel, Connect, rings), waiting
        up to ``timeout`` seconds for it to answer. Raises what stands in the way, saying why:
        :class:`UnavailableError` naming the socket when no daemon answers there."""
        link = _Link()
        # The side channel first: its ticket names, in Connect, the connection whose peer
        # credentials the daemon records and over which this session's buffers travel.
        try:
            link.fds = _fd_channel.FdChannel(self.socket, max(timeout, 0.001))
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
        link.channel = grpc.insecure_channel(
            "unix:" + self.socket,
            options=[(_SINGLE_THREADED_UNARY_STREAM, 1)] + self._keepalive)
        link.stub = local_pb2_grpc.LocalStub(link.channel)
        request = local_pb2.ConnectRequest(job_id=self.job, token=self._token, pid=os.getpid(),
                                           client=f"railyard-python/{_VERSION}",
                                           fd_ticket=link.fds.ticket)
        link.stream = link.stub.Connect(request)
        link.reader = threading.Thread(target=self._read_events, args=(link,),
                                       name="railyard-events", daemon=True)
        link.reader.start()
        # Waited for in steps: close() during a reconnect must not wait for a whole attempt.
        deadline = time.monotonic() + timeout
        while not link.answered.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
            if self._closing or time.monotonic() >= deadline:
                break
        error: Optional[RailyardError] = None
        if not link.connected:
            if link.ended.is_set() or link.answered.is_set():
                link.ended.wait(5.0)
                error = link.end or UnavailableError(
                    grpc.StatusCode.UNAVAILABLE, f"railyardd at {self.socket} closed the session")
            else:
                error = UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                         f"railyardd not reachable at {self.socket}: no answer "
                                         f"within {timeout:g} s")
        elif self._spin_us is not None:
            try:
                self._open_rings(link)
            except (RailyardError, OSError, ValueError) as e:
                if self._fastpath == "1":
                    error = error_from_code(getattr(e, "code", grpc.StatusCode.INTERNAL),
                                            f"RAILYARD_FASTPATH=1: the session rings could not "
                                            f"be opened: {e}")
        if error is not None:
            self._drop_link(link)
            raise error
        return link

    def _drop_link(self, link: _Link) -> None:
        """Ends a session that is not (or no longer) the client's, and frees what it holds."""
        link.stream.cancel()
        if link.reader is not None and link.reader is not threading.current_thread():
            link.reader.join(10.0)
        link.close()

    def _install(self, link: _Link) -> None:  # under self._lock
        self._link = link
        self._stub = link.stub
        self._fds = link.fds
        self._rings = link.rings
        self.session_id = link.session_id
        self.node_name = link.node_name
        self.daemon_version = link.daemon_version
        self._cond.notify_all()

    def _open_rings(self, link: _Link) -> None:
        if not _ring.supported():
            raise FailedPreconditionError(grpc.StatusCode.FAILED_PRECONDITION,
                                          "the ring fast path needs x86-64 Linux")
        assert self._spin_us is not None
        rings = _ring.Rings(self.job, self._on_ring_completion, self._spin_us)
        try:
            try:
                handle = link.fds.put(rings.fd, _RPC_TIMEOUT)
            except _fd_channel.ChannelError as e:
                raise error_from_code(e.code, f"OpenRings: {e.message}") from None
            try:
                link.stub.OpenRings(local_pb2.OpenRingsRequest(
                    session_id=link.session_id, fd_handle=handle, sq_entries=rings.sq_entries,
                    cq_entries=rings.cq_entries), timeout=_RPC_TIMEOUT)
            except grpc.RpcError as e:
                raise self._rpc_error("OpenRings", e) from None
        finally:
            rings.close_fd()
        rings.start_reader()
        link.rings = rings

    @property
    def fastpath(self) -> bool:
        """True when operations go over the session rings (``RAILYARD_FASTPATH``)."""
        return self._rings is not None

    @property
    def reconnects(self) -> int:
        """How many times the session moved to another railyardd: a handover (``railyardd
        --takeover``) or a restart it waited out (``RAILYARD_RECONNECT_S``). Buffers,
        communicators and operations move with it."""
        return self._generation

    def _on_ring_completion(self, request_id: int, code: int, message: str, seq: int,
                            flags: int = 0) -> None:
        """A completion, from the rings or the Connect stream (both call it)."""
        if flags & _ring.CQ_FLAG_MOVED:
            # Handed back untaken (a handover): not an outcome; the next session runs it.
            with self._lock:
                if request_id in self._pending:
                    self._moved.add(request_id)
            return
        with self._lock:
            work = self._pending.pop(request_id, None)
            if work is not None and code == 0:
                state = work._collective_of
                if state is not None and seq >= state.next_seq:
                    state.next_seq = seq + 1
            if self._moved:
                self._moved.discard(request_id)
        if work is not None:
            work._complete(None if code == 0 else error_from_code(code, message), seq)

    def _read_events(self, link: _Link) -> None:
        final: Optional[grpc.RpcError] = None
        broken: Optional[RailyardError] = None
        try:
            for event in link.stream:
                kind = event.WhichOneof("event")
                if kind == "completion":
                    c = event.completion
                    self._on_ring_completion(c.request_id, c.code, c.message, c.seq, c.flags)
                elif kind == "connected":
                    if not link.connected:
                        link.session_id = event.connected.session_id
                        link.node_name = event.connected.node_name
                        link.daemon_version = event.connected.daemon_version
                        link.connected = True
                        link.answered.set()
                elif kind == "moving":
                    link.moving = True
        except grpc.RpcError as e:
            final = e
        except Exception as e:  # pragma: no cover - defensive: never die silently
            broken = RailyardError(grpc.StatusCode.INTERNAL, f"event reader: {e!r}")
        # Completions the daemon wrote before the session ended are outcomes, not orphans (a
        # shutdown fails the operations first, then ends the sessions; a handover hands back).
        if link.rings is not None:
            try:
                link.rings.drain()
            except Exception:  # pragma: no cover - the mapping is ours; defensive only
                pass
        if self._closing:
            end: RailyardError = CancelledError(grpc.StatusCode.CANCELLED,
                                                "the client disconnected")
        elif broken is not None:
            end = broken
        elif final is None:
            end = UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                   f"railyardd at {self.socket} closed the session")
        elif not link.connected:
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
        link.end = end
        self._on_link_ended(link, end)

    def _on_link_ended(self, link: _Link, end: RailyardError) -> None:
        """A session's stream ended (its reader thread): the client moves to the next daemon
        (a handover, or RAILYARD_RECONNECT_S > 0), or the session is over."""
        with self._lock:
            link.ended.set()
            link.answered.set()
            self._cond.notify_all()
            # Not (or no longer) the session: _open_link's caller or the reconnect sees it.
            if link is not self._link or self._ended.is_set() or self._rebuilding:
                return
            rebuild = (not self._closing and link.connected and
                       (link.moving or self._reconnect_s > 0))
            if rebuild:
                self._rebuilding = True
                window = (max(float(self._reconnect_s), _HANDOVER_WINDOW_S) if link.moving
                          else float(self._reconnect_s))
                thread = threading.Thread(target=self._rebuild_loop,
                                          args=(time.monotonic() + window,),
                                          name="railyard-reconnect", daemon=True)
                self._rebuild_thread = thread
                thread.start()
        if not rebuild:
            self._die(end)

    def _die(self, error: RailyardError) -> None:
        """Ends the session for good: every outstanding operation fails with ``error``."""
        with self._lock:
            if not self._ended.is_set():
                self._end_error = error
                self._ended.set()
            error = self._end_error or error
            self._rebuilding = False
            orphans, self._pending = self._pending, {}
            self._unsent.clear()
            self._moved.clear()
            link = self._link
            self._cond.notify_all()
        if link is not None and link.rings is not None:
            link.rings.close()
        for work in orphans.values():
            work._complete(error)

    # -- reconnects ----------------------------------------------------------------------------

    def _rebuild_loop(self, deadline: float) -> None:
        """Runs on the reconnect thread: sessions again until one holds or the window (the
        ``time.monotonic()`` deadline) closes."""
        me = threading.current_thread()
        try:
            while True:
                with self._lock:
                    if self._closing or self._ended.is_set() or self._rebuild_thread is not me:
                        return
                    old = self._link
                if not self._rebuild_once(old, deadline):
                    return
                with self._lock:
                    if (self._closing or self._ended.is_set() or not self._rebuilding or
                            self._rebuild_thread is not me):
                        return
                # The new session ended already: once more, within the same window.
        except Exception as e:  # pragma: no cover - a bug here must not leave waits hanging
            self._die(RailyardError(grpc.StatusCode.INTERNAL, f"reconnecting to railyardd at "
                                                              f"{self.socket}: {e!r}"))

    def _rebuild_once(self, old: _Link, deadline: float) -> bool:
        """One rebuild of the session on the daemon now at the socket; False: given up (the
        session is over, or the client closed)."""
        if old.reader is not None and old.reader is not threading.current_thread():
            old.reader.join(10.0)
        handover = old.moving
        # 1. What the old daemon took of the rings: its head. Nothing is published on them after
        # close(), and every entry published before has its slot (Rings.publish's owner).
        head = 0
        old_rings = old.rings
        if old_rings is not None:
            try:
                old_rings.drain()
            except Exception:  # pragma: no cover - the mapping is ours; defensive only
                pass
            old_rings.close()
            old_rings.fence_submissions()
            head = old_rings.consumed_head()
        failed: List[Tuple[Any, RailyardError]] = []
        with self._cond:
            # A Submit still under way over gRPC says whether the daemon took it or handed it
            # back (after a crash it fails at once).
            self._cond.wait_for(lambda: not any(
                w._rings is None and w._link is old and w._slot == 0
                for w in self._pending.values()), _RPC_TIMEOUT)
            taken: Dict[int, List[int]] = {}  # by communicator: collectives the daemon took
            for rid in sorted(self._pending):
                work = self._pending[rid]
                if rid in self._unsent:
                    continue
                if rid in self._moved:  # handed back untaken: the next daemon runs it
                    self._moved.discard(rid)
                    self._unsent.add(rid)
                    continue
                # On the rings only what the daemon's head passed was taken; over gRPC what
                # was sent (no head to tell).
                if work._rings is not None:
                    was_taken = work._rings is old_rings and 0 <= work._slot < head
                else:
                    was_taken = work._link is old and work._slot >= 0
                if not was_taken:
                    self._unsent.add(rid)
                    continue
                comm, op = _comm_and_op(work._entry)
                if op not in (_SEND, _RECV):
                    taken.setdefault(comm, []).append(rid)
                    continue
                # A send or receive the daemon had taken may have moved its bytes: not run twice.
                failed.append((work, UnavailableError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"railyardd at {self.socket} restarted during this {_op_name(op)} (it had "
                    "taken it; a send or receive is not run twice, its peer's matching operation "
                    "fails too or times out); the communicator goes on")))
                del self._pending[rid]
            for comm, rids in taken.items():
                if all(self._pending[r]._rerun_safe for r in rids):
                    self._unsent.update(rids)  # run again from their intact inputs
                    continue
                for r in rids:
                    work = self._pending.pop(r)
                    op = _comm_and_op(work._entry)[1]
                    failed.append((work, UnavailableError(
                        grpc.StatusCode.UNAVAILABLE,
                        f"railyardd at {self.socket} restarted during this {_op_name(op)} (it "
                        "had taken it, and running it again is not safe: its output may have "
                        "overwritten its input); the communicator goes on")))
                state = self._comms.get(comm)
                if state is not None:
                    state.next_seq += len(rids)  # their numbers are used up
            # Where each communicator's collectives go on (the seq its next one would have had).
            resume = {vid: state.next_seq for vid, state in self._comms.items()}
        for work, error in failed:
            work._complete(error)
        failed.clear()

        # 2. A session with the daemon at the socket now (a new one, or the same one back).
        link: Optional[_Link] = None
        last: Any = "no attempt"
        while not self._closing:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                link = self._open_link(min(_RECONNECT_ATTEMPT_S, left))
                break
            except RailyardError as e:
                last = e.message
                if e.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT,
                              grpc.StatusCode.UNAUTHENTICATED):
                    break  # the daemon refuses this session: waiting will not change that
            time.sleep(_RECONNECT_PAUSE_S)
        if link is None:
            old.close()
            if not self._closing:
                self._die(UnavailableError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"railyardd at {self.socket} "
                    f"{'handed the node over' if handover else 'went away'} and no daemon took "
                    f"this session back in time (RAILYARD_RECONNECT_S={self._reconnect_s}): "
                    f"{last}"))
            return False
        try:
            return self._rejoin(old, link, deadline, resume)
        except BaseException:
            self._drop_link(link)
            raise

    def _rejoin(self, old: _Link, link: _Link, deadline: float, resume: Dict[int, int]) -> bool:
        """Steps 3-5 of a rebuild on the new session ``link``: buffers, communicators, then the
        operations to send again."""
        # 3. Buffers again, in the order they were registered (a part after its parent).
        with self._lock:
            buffers = list(self._buffers.items())
        new_ids: Dict[int, int] = {}
        for vid, b in buffers:
            request = local_pb2.RegisterBufferRequest(size_bytes=b.size)
            try:
                if b.parent:
                    if b.parent not in new_ids:
                        continue  # its parent is released: so is it (soon)
                    request.parent_buffer_id = new_ids[b.parent]
                    request.parent_offset = b.parent_offset
                elif b.ipc_handle:
                    request.memory = local_pb2.MEMORY_KIND_CUDA
                    request.device = b.device
                    request.cuda_ipc_handle = b.ipc_handle
                    request.cuda_ipc_offset = b.ipc_offset
                else:
                    if b.fd < 0:
                        continue  # released meanwhile
                    if b.device >= 0:
                        request.memory = local_pb2.MEMORY_KIND_CUDA
                        request.device = b.device
                    try:
                        request.fd_handle = link.fds.put(b.fd, _RPC_TIMEOUT)
                    except _fd_channel.ChannelError as e:
                        raise error_from_code(e.code, e.message) from None
                new_ids[vid] = self._register_on(link, request)
            except RailyardError as e:
                # That daemon went away too: the next one, within the window.
                again = (_gone(e) and link.ended.wait(2.0) and time.monotonic() < deadline)
                self._drop_link(link)
                if again:
                    return True
                old.close()
                self._die(error_from_code(e.code, f"reconnecting to railyardd at {self.socket}: "
                                                  f"buffer {vid} could not be registered again: "
                                                  f"{e.message}"))
                return False

        # 4. Communicators again, all at once (every rank of each rejoins: an order could
        # deadlock), each from the sequence number its next collective would have had.
        with self._lock:
            rejoins = [(vid, state) for vid, state in self._comms.items() if state.broken is None]
        left = max(deadline - time.monotonic(), 5.0)
        results: Dict[int, Any] = {}

        def rejoin(vid: int, state: _CommState) -> None:
            try:
                results[vid] = self._init_comm_on(
                    link, state.comm_id, state.rank, state.nranks,
                    min(int(left * 1000), 0xFFFFFFFF), state.integrity, resume.get(vid, 0),
                    left + _INIT_MARGIN)
            except RailyardError as e:
                results[vid] = e

        threads = [threading.Thread(target=rejoin, args=r, daemon=True,
                                    name="railyard-rejoin") for r in rejoins]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self._closing:
            self._drop_link(link)
            return False
        if any(isinstance(r, RailyardError) and _gone(r) for r in results.values()):
            link.ended.wait(2.0)
        if link.ended.is_set():
            self._drop_link(link)
            return True  # that daemon went away too: the next one, within the window

        failed: List[Tuple[Any, RailyardError]] = []
        with self._lock:
            for vid, new_id in new_ids.items():
                if vid in self._buffers:
                    self._buffers[vid].id = new_id
            for vid, state in rejoins:
                result = results.get(vid)
                if not isinstance(result, local_pb2.InitCommResponse):
                    e = result if isinstance(result, RailyardError) else None
                    state.broken = error_from_code(
                        e.code if e is not None else grpc.StatusCode.UNAVAILABLE,
                        f"communicator {state.comm_id} could not be joined again after "
                        f"railyardd at {self.socket} restarted: "
                        f"{e.message if e is not None else 'no answer'}")
                    continue
                state.handle = result.comm_handle
                lost = max(0, result.first_seq - resume.get(vid, 0))
                state.next_seq = result.first_seq
                # Another rank's copy of the collectives in between failed in the restart: so
                # do ours, so that every rank's next collective still meets the others'. Those
                # this rank has not submitted yet fail as it submits them (_register).
                for rid in sorted(self._unsent):
                    if lost == 0:
                        break
                    work = self._pending.get(rid)
                    if work is None:
                        continue
                    comm, op = _comm_and_op(work._entry)
                    if comm != vid or op in (_SEND, _RECV):
                        continue
                    failed.append((work, state.owed_error(op)))
                    del self._pending[rid]
                    self._unsent.discard(rid)
                    lost -= 1
                state.owed = lost
            # Operations on a communicator that is gone fail with why.
            for rid in sorted(self._unsent):
                if rid not in self._pending:
                    self._unsent.discard(rid)
                    continue
                state = self._comms.get(_comm_and_op(self._pending[rid]._entry)[0])
                if state is not None and state.broken is not None:
                    failed.append((self._pending.pop(rid), state.broken))
                    self._unsent.discard(rid)
            self._generation += 1
            self._translating = True
            self._install(link)
        for work, error in failed:
            work._complete(error)
        old.close()
        # 5. What was not taken, was handed back, or is safe to run again: in the order it was
        # submitted, then what was submitted meanwhile.
        self._send_unsent()
        return True

    def _send_unsent(self) -> None:
        """Sends what is marked unsent on the current session, until nothing is; then new
        submissions go straight again."""
        while True:
            with self._lock:
                link = self._link
                if self._closing or self._ended.is_set() or link is None or link.ended.is_set():
                    return  # the session is over, or the new one ended too: the loop goes on
                rids = sorted(self._unsent)
                if not rids:
                    # Under the lock that found nothing: what is submitted from now on goes
                    # straight to the session.
                    self._rebuilding = False
                    self._cond.notify_all()
                    break
            self._send_on(link, rids)
        if link.rings is not None:
            link.rings.background_wanted()  # waiters asleep since the move read no ring

    def _send_on(self, link: _Link, rids: List[int]) -> None:
        """Sends the pending operations ``rids`` (in that order) on ``link``."""
        for rid in rids:
            with self._lock:
                work = self._pending.get(rid)
                if work is None or rid not in self._unsent:
                    self._unsent.discard(rid)
                    continue
                self._unsent.discard(rid)
                self._moved.discard(rid)
                rings = link.rings
                work._rings = rings
                work._link = link
                work._slot = -1
            if rings is None:
                self._submit_rpc_on(link, rid, work)
                continue
            try:
                entry = self._entry_of(work._entry, rid)
            except (ValueError, struct.error) as e:
                with self._lock:
                    self._pending.pop(rid, None)
                work._complete(_invalid(str(e)))
                continue
            try:
                rings.publish(entry, work)
            except _ring.RingError as e:
                self._publish_failed(rid, work, rings, e)

    def _entry_of(self, source: Any, request_id: int) -> bytes:
        """The ring entry of a request (a ``_Request`` or an entry), with the current daemon's
        ids."""
        if isinstance(source, _Request):
            entry = bytearray()
            r = source
            if r.vectors is not None and len({len(v) for v in r.vectors}) != 1:
                raise ValueError("AllToAllv: the four vectors need one entry per rank")
            _ring.Rings.encode(entry, request_id, r.comm_handle, r.op, r.dtype, r.red_op, r.count,
                               r.root, r.send or (0, 0), r.recv or (0, 0), r.timeout_ms, r.algo,
                               False, r.vectors, r.compression, r.error_feedback,
                               r.compression_key, r.stream_sync)
            source = entry
        return self._translated_entry(source) if self._translating else source

    def _translated_entry(self, entry: bytes) -> bytearray:
        """A copy of a ring entry with the current daemon's ids for the ones callers hold (the
        communicator, the buffers, the stream words' buffer)."""
        out = bytearray(entry)
        at = _ring_h.RING_SQ_COMM_HANDLE
        _U64.pack_into(out, at, self._daemon_comm(_U64.unpack_from(out, at)[0]))
        for at in (_ring_h.RING_SQ_SEND_BUFFER, _ring_h.RING_SQ_RECV_BUFFER):
            buffer_id = _U64.unpack_from(out, at)[0]
            if buffer_id:
                _U64.pack_into(out, at, self._daemon_buffer(buffer_id))
        if _U32.unpack_from(out, _ring_h.RING_SQ_FLAGS)[0] & _ring.FLAG_STREAM_SYNC:
            at = (_U32.unpack_from(out, _ring_h.RING_SQ_EXT_SLOTS)[0] * _ring.SQ_ENTRY +
                  _ring_h.RING_SYNC_BUFFER)
            _U64.pack_into(out, at, self._daemon_buffer(_U64.unpack_from(out, at)[0]))
        return out

    def _translated_proto(self, r: Any) -> Any:
        """A SubmitRequest with the current daemon's ids for the ones callers hold."""
        r.comm_handle = self._daemon_comm(r.comm_handle)
        for ref in (r.send, r.recv, r.stream_sync.words):
            if ref.buffer_id:
                ref.buffer_id = self._daemon_buffer(ref.buffer_id)
        return r

    def _daemon_buffer(self, buffer_id: int) -> int:
        record = self._buffers.get(buffer_id)
        return record.id if record is not None else _NO_ID  # unknown: the daemon refuses it

    def _daemon_comm(self, handle: int) -> int:
        state = self._comms.get(handle)
        return state.handle if state is not None else _NO_ID

    def _new_id(self, daemon_id: int, kind: str) -> int:  # under self._lock
        """The id callers will hold for a buffer or communicator the daemon named ``daemon_id``:
        the daemon's own while they are fresh (the first session: nothing to translate); once
        one is not (after a reconnect), ids of this client's, translated on every call."""
        counter = "_next_buffer_id" if kind == "buffer" else "_next_comm_id"
        following = getattr(self, counter)
        vid = daemon_id
        if self._translating or daemon_id < following:
            vid = following
            self._translating = True
        setattr(self, counter, max(following, vid + 1))
        return vid

    # -- the session's state, unary calls ------------------------------------------------------

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

    def _acquire_link(self) -> _Link:
        """The session now, once a reconnect under way is over (bounded); raises when the
        session is over."""
        error = self._session_error()
        if error is not None:
            raise error
        limit = max(float(self._reconnect_s), _HANDOVER_WINDOW_S) + 30.0
        with self._cond:
            if not self._cond.wait_for(lambda: not self._rebuilding or self._closing or
                                       self._ended.is_set(), limit):
                raise UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                       f"railyardd at {self.socket} is being reconnected")
        error = self._session_error()
        if error is not None:
            raise error
        assert self._link is not None
        return self._link

    def _with_link(self, fn: Callable[[_Link], Any]) -> Any:
        """Runs ``fn(link)`` on the session now; again on the next one when the session went
        away meanwhile (UNAVAILABLE, or the daemon no longer knows it, and its stream ended)."""
        attempt = 0
        while True:
            link = self._acquire_link()
            try:
                return fn(link)
            except RailyardError as e:
                attempt += 1
                if not _gone(e) or attempt >= 3 or not link.ended.wait(2.0) or \
                        self._closing or self._ended.is_set():
                    raise

    def _call(self, rpc: str, request: Any, timeout: float = _RPC_TIMEOUT,
              prepare: Optional[Callable[[Any], None]] = None) -> Any:
        """A unary call on the session; ``prepare(request)`` fills in the current daemon's ids
        for the ones callers hold (called again if the call moves to a new session)."""
        def call(link: _Link) -> Any:
            request.session_id = link.session_id
            if prepare is not None and self._translating:
                with self._lock:
                    prepare(request)
            try:
                return getattr(link.stub, rpc)(request, timeout=timeout)
            except grpc.RpcError as e:
                raise self._rpc_error(rpc, e) from None
            except ValueError as e:  # the channel of a session closed meanwhile
                raise UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                       f"{rpc}: railyardd at {self.socket} unavailable: "
                                       f"{e}") from None
        return self._with_link(call)

    def _release_call(self, rpc: str, request: Any,
                      prepare: Optional[Callable[[Any], None]] = None) -> None:
        """A release (ReleaseBuffer, DestroyComm) told once to the daemon of the live session.
        Between sessions, or when that daemon goes away during the call, nothing is left to
        release there (what it held went with the session): never retried on the next one, so
        that a close or a finalizer never waits for the next daemon."""
        with self._lock:
            link = None if self._rebuilding or self._closing or self._ended.is_set() \
                else self._link
            if link is not None:
                request.session_id = link.session_id
                if prepare is not None and self._translating:
                    prepare(request)
        if link is None:
            return
        try:
            getattr(link.stub, rpc)(request, timeout=_RPC_TIMEOUT)
        except grpc.RpcError as e:
            error = self._rpc_error(rpc, e)
            if not _gone(error) and error.code != grpc.StatusCode.CANCELLED:
                raise error from None
        except ValueError:  # the channel of a session closed meanwhile
            pass

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called or the session ended (the daemon went away and
        none took it back: ``RAILYARD_RECONNECT_S``)."""
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
            link = self._link
            rebuild = self._rebuild_thread
            joining = list(self._joining)
            self._cond.notify_all()
        _live_clients.discard(self)
        for call in joining:
            call.cancel()  # a rejoin may wait long for the other ranks
        if (link is not None and disconnect and link.connected and not link.ended.is_set()
                and not self._ended.is_set()):
            try:
                link.stub.Disconnect(local_pb2.DisconnectRequest(session_id=link.session_id),
                                     timeout=5.0)
            except (grpc.RpcError, ValueError):
                pass  # the session ends either way
        if link is not None:
            link.stream.cancel()
            if link.reader is not None and link.reader is not threading.current_thread():
                link.reader.join(10.0)
        if rebuild is not None and rebuild is not threading.current_thread():
            rebuild.join(15.0)
        with self._lock:
            last = self._link
        if last is not None and last is not link:
            last.stream.cancel()
            if last.reader is not None and last.reader is not threading.current_thread():
                last.reader.join(10.0)
        self._die(CancelledError(grpc.StatusCode.CANCELLED, "the client disconnected"))
        for each in {id(link): link, id(last): last}.values():
            if each is not None:
                each.close()
        with self._lock:
            self._to_release.clear()
            records = list(self._buffers.values())
        for record in records:
            record.close()
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

    def _register_on(self, link: _Link, request: Any) -> int:
        """RegisterBuffer on ``link``; the daemon's id."""
        request.session_id = link.session_id
        try:
            return link.stub.RegisterBuffer(request, timeout=_RPC_TIMEOUT).buffer_id
        except grpc.RpcError as e:
            raise self._rpc_error("RegisterBuffer", e) from None
        except ValueError as e:  # the channel of a session closed meanwhile
            raise UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                   f"RegisterBuffer: railyardd at {self.socket} unavailable: "
                                   f"{e}") from None

    def _register_fd(self, fd: int, request: Any) -> int:
        """Passes ``fd`` on the side channel and registers it (``request`` says how); again on
        the next session if the daemon goes away meanwhile. The daemon's id."""
        def register(link: _Link) -> int:
            try:
                request.fd_handle = link.fds.put(fd, _RPC_TIMEOUT)
            except _fd_channel.ChannelError as e:
                raise error_from_code(e.code, f"RegisterBuffer: {e.message}") from None
            return self._register_on(link, request)
        return self._with_link(register)

    def _record_buffer(self, daemon_id: int, record: _BufferRecord) -> int:
        """Keeps what registering the buffer again after a reconnect takes; the id callers hold."""
        record.id = daemon_id
        with self._lock:
            buffer_id = self._new_id(daemon_id, "buffer")
            self._buffers[buffer_id] = record
        return buffer_id

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
            daemon_id = self._register_fd(fd, local_pb2.RegisterBufferRequest(size_bytes=size))
        except BaseException:
            os.close(fd)
            raise
        # The descriptor is kept (the memory has no name anyone could open): a reconnect passes
        # it to the next daemon. It is closed when the buffer is released.
        buffer_id = self._record_buffer(daemon_id, _BufferRecord(size, fd=fd))
        mapping.buffer_id = buffer_id
        start = _address(np.frombuffer(mapping, dtype=np.uint8, count=1))
        mapping.address = start
        weakref.finalize(mapping, self._to_release.append, buffer_id)
        self._add_region(_Region(start, start + size, mapping, buffer_id))
        return mapping

    def _register_part(self, mapping: _memfd.Mapping, offset: int, nbytes: int,
                       owner: object) -> int:
        """Registers ``nbytes`` at ``offset`` of a registered ``mapping`` as a buffer of its own
        (a pooled chunk, see _pool), released once ``owner`` is gone."""
        self._flush_releases()
        parent = mapping.buffer_id

        def register(link: _Link) -> int:
            request = local_pb2.RegisterBufferRequest(parent_offset=offset, size_bytes=nbytes)
            with self._lock:
                request.parent_buffer_id = (self._daemon_buffer(parent) if self._translating
                                            else parent)
            return self._register_on(link, request)

        buffer_id = self._record_buffer(self._with_link(register), _BufferRecord(
            nbytes, parent=parent, parent_offset=offset))
        weakref.finalize(owner, self._to_release.append, buffer_id)
        start = mapping.address + offset
        self._add_region(_Region(start, start + nbytes, owner, buffer_id))
        return buffer_id

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
            if not self.closed:
                try:
                    self._release_call(
                        "ReleaseBuffer", local_pb2.ReleaseBufferRequest(buffer_id=buffer_id),
                        prepare=lambda r, b=buffer_id: setattr(r, "buffer_id",
                                                               self._daemon_buffer(b)))
                except RailyardError:
                    pass  # the daemon forgets the buffer with the session anyway
            with self._lock:
                record = self._buffers.pop(buffer_id, None)
            if record is not None:
                record.close()

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
        and closes ``fd``; the daemon holds its own reference, and so does this client, to
        register it again after a reconnect). Returns a :class:`DeviceArray`
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
            kept = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 0)
        except OSError as e:
            raise _invalid(f"descriptor {fd} of the device memory: {e.strerror or e}") from None
        try:
            daemon_id = self._register_fd(kept, local_pb2.RegisterBufferRequest(
                size_bytes=nbytes, memory=local_pb2.MEMORY_KIND_CUDA, device=device))
        except BaseException:
            os.close(kept)
            raise
        buffer_id = self._record_buffer(daemon_id, _BufferRecord(nbytes, fd=kept, device=device))
        return self._device_array(buffer_id, nbytes, device, ptr, layout)

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
        request = local_pb2.RegisterBufferRequest(
            size_bytes=nbytes, memory=local_pb2.MEMORY_KIND_CUDA, device=device,
            cuda_ipc_handle=bytes(handle), cuda_ipc_offset=int(offset))
        daemon_id = self._with_link(lambda link: self._register_on(link, request))
        buffer_id = self._record_buffer(daemon_id, _BufferRecord(
            nbytes, device=device, ipc_handle=bytes(handle), ipc_offset=int(offset)))
        return self._device_array(buffer_id, nbytes, device, ptr, layout)

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
             timeout: Optional[float] = None, *, integrity: Optional[str] = None,
             on_failure: str = "abort", shrink_timeout: Optional[float] = None) -> "Comm":
        """Joins communicator ``comm_id`` as ``rank`` of ``nranks``; returns once all have joined.

        Args:
            timeout: seconds to wait for the other ranks (``None``: the daemon's
                ``--init_timeout``). Missing ranks raise :class:`DeadlineExceededError` naming
                them.
            integrity: ``"crc32c"`` checks every inter-node chunk end to end (a mismatch fails
                the operation with :class:`DataLossError`); ``"none"``; ``None``: the client's
                ``integrity`` (``$RAILYARD_INTEGRITY``). The strongest any member asks for
                applies.
            on_failure: ``"abort"`` (a failure is the communicator's end, as NCCL's) or
                ``"shrink"``: when ranks are gone (a dead node or process), the survivors go on
                in a communicator without them (:class:`Comm` says how;
                docs/fabric-failures.md).
            shrink_timeout: seconds an automatic shrink waits for the other survivors (``None``:
                the daemon's ``--init_timeout``).
        """
        if not 0 <= rank < nranks:
            raise _invalid(f"rank {rank} out of range for {nranks} ranks")
        if on_failure not in ("abort", "shrink"):
            raise _invalid(f"on_failure {on_failure!r}: expected \"abort\" or \"shrink\"")
        if shrink_timeout is not None and (isinstance(shrink_timeout, bool) or
                                           not isinstance(shrink_timeout, (int, float)) or
                                           not shrink_timeout > 0):
            raise _invalid(f"shrink_timeout {shrink_timeout!r}: expected seconds > 0 or None")
        integrity = self.integrity if integrity is None else _check_integrity(integrity)
        ms = _timeout_ms(timeout)
        deadline = _INIT_DEFAULT_DEADLINE if ms == 0 else ms / 1000.0 + _INIT_MARGIN
        response = self._with_link(lambda link: self._init_comm_on(
            link, comm_id, rank, nranks, ms, integrity, 0, deadline))
        state = _CommState(comm_id, rank, nranks, integrity, response.comm_handle,
                           response.first_seq)
        with self._lock:
            handle = self._new_id(response.comm_handle, "comm")
            self._comms[handle] = state
        return Comm(self, comm_id, handle, rank, nranks, response.nnodes, on_failure,
                    shrink_timeout)

    def _init_comm_on(self, link: _Link, comm_id: str, rank: int, nranks: int, timeout_ms: int,
                      integrity: str, resume_seq: int, deadline: float) -> Any:
        """InitComm on ``link`` (cancelled by close(): a join may wait long for other ranks)."""
        request = local_pb2.InitCommRequest(
            session_id=link.session_id, comm_id=comm_id, rank=rank, nranks=nranks,
            timeout_ms=timeout_ms, integrity=integrity, resume_seq=resume_seq)
        with self._lock:
            if self._closing:
                raise FailedPreconditionError(grpc.StatusCode.FAILED_PRECONDITION,
                                              "the client is closed")
            try:
                call = link.stub.InitComm.future(request, timeout=deadline)
            except ValueError as e:  # the channel of a session closed meanwhile
                raise UnavailableError(grpc.StatusCode.UNAVAILABLE,
                                       f"InitComm: railyardd at {self.socket} unavailable: "
                                       f"{e}") from None
            self._joining.add(call)
        try:
            return call.result()
        except grpc.FutureCancelledError:
            raise CancelledError(grpc.StatusCode.CANCELLED, "the client disconnected") from None
        except grpc.RpcError as e:
            raise self._rpc_error("InitComm", e) from None
        finally:
            with self._lock:
                self._joining.discard(call)

    def _destroy_comm(self, handle: int) -> None:
        """DestroyComm of a communicator this client joined (``Comm.close``)."""
        try:
            self._release_call(
                "DestroyComm", local_pb2.DestroyCommRequest(comm_handle=handle),
                prepare=lambda r: setattr(r, "comm_handle", self._daemon_comm(handle)))
        finally:
            with self._lock:
                self._comms.pop(handle, None)

    # -- submissions ---------------------------------------------------------------------------

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
        work._entry = request
        self._publish(rings, request_id, entry, work)

    def _publish(self, rings: _ring.Rings, request_id: int, entry: bytes, work: Any) -> None:
        """Registers ``work`` (a Work or _HostOp whose ``_rings`` and ``_entry`` are set) for
        ``request_id`` and publishes its ring entry; a session that has ended completes it with
        the error, one being rebuilt holds it (it goes out once the session is back)."""
        if not self._register(request_id, work):
            return  # not published: an entry nobody waits for (or a fork's) never goes out
        if self._translating:
            entry = self._translated_entry(entry)
        try:
            rings.publish(entry, work)
        except _ring.RingError as e:
            self._publish_failed(request_id, work, rings, e)

    def _publish_failed(self, request_id: int, work: Any, rings: _ring.Rings,
                        e: Exception) -> None:
        resend: Optional[_Link] = None
        error: Optional[RailyardError] = None
        with self._lock:
            if self._pending.get(request_id) is not work or work._rings is not rings:
                return  # completed, or sent again on a new session meanwhile
            if (not self._ended.is_set() and not self._closing and
                    (self._rebuilding or rings is not self._rings)):
                # Its session ended under it: never published, it goes to the next session
                # (the reconnect sends it; if that is over already, here and now).
                self._unsent.add(request_id)
                if not self._rebuilding:
                    resend = self._link
            else:
                del self._pending[request_id]
                error = self._session_error() or FailedPreconditionError(
                    grpc.StatusCode.FAILED_PRECONDITION, str(e))
        if resend is not None:
            self._send_on(resend, [request_id])
        elif error is not None:
            work._complete(error)

    def _register(self, request_id: int, work: Any) -> bool:
        """Registers ``work`` for ``request_id`` (before it is sent: its completion is never
        unknown). False: not to be sent now (completed with the session's error, or held while
        the session is rebuilt)."""
        with self._lock:
            error = self._session_error()
            state = work._collective_of
            if error is None and state is not None and state.owed:
                state.owed -= 1  # the other ranks' copy failed in a restart (_rejoin)
                error = state.owed_error(_comm_and_op(work._entry)[1])
            elif error is None:
                self._pending[request_id] = work
                if not self._rebuilding:
                    return True
                self._unsent.add(request_id)  # waits, in its place in the order
                return False
        work._complete(error)
        return False

    def _submit_rpc(self, request: _Request, work: Work) -> None:
        request_id = next(self._request_ids)
        request.request_id = request_id
        link = self._link
        work._entry = request
        work._link = link
        if not self._register(request_id, work):
            return
        self._submit_rpc_on(link, request_id, work)

    def _submit_rpc_on(self, link: _Link, request_id: int, work: Any) -> None:
        source = work._entry
        request = source if isinstance(source, _Request) else _Request.from_entry(source)
        message = request.proto(link.session_id)
        message.request_id = request_id
        with self._lock:
            if self._translating:
                self._translated_proto(message)
            if self._pending.get(request_id) is not work or work._link is not link:
                return  # completed, or sent on a new session meanwhile
            work._slot = 0  # under way: from here the daemon may take it (no ring head to tell)
        try:
            response = link.stub.Submit(message, timeout=_RPC_TIMEOUT)
        except (grpc.RpcError, ValueError) as e:
            self._submit_failed(link, request_id, work, e)
            return
        with self._lock:
            if work._link is link:
                work._slot = 1
                self._cond.notify_all()
        if getattr(work, "_seq", 0) is None:
            work._seq = response.seq

    def _submit_failed(self, link: _Link, request_id: int, work: Any, e: Exception) -> None:
        rpc = isinstance(e, grpc.RpcError)
        code = e.code() if rpc else grpc.StatusCode.UNAVAILABLE
        moved = rpc and _moved(e)
        # The daemon went away (a closed channel, ValueError: a session the client has left).
        gone = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        # The daemon no longer knows the session (it handed it over): it took nothing.
        refused = code == grpc.StatusCode.NOT_FOUND and _UNKNOWN_SESSION in (e.details() or "")
        if (gone or refused) and not moved:
            link.ended.wait(2.0)  # the session went away? its stream's end says so
        if code == grpc.StatusCode.CANCELLED and link.moving:
            # A daemon that handed its sessions over answers nothing more: the call never
            # reached it (what it had taken it finished or handed back on the stream).
            refused = True
        with self._lock:
            if self._pending.get(request_id) is not work or work._link is not link:
                return  # completed, or sent again on a new session meanwhile
            work._slot = 1
            self._cond.notify_all()
            if moved or (refused and link.ended.is_set() and not self._ended.is_set()):
                # Handed back, or never taken: the next session runs it. (A reconnect waits for
                # every Submit under way before it decides what was taken.)
                self._moved.add(request_id)
                return
            if gone and link.ended.is_set() and self._rebuilding:
                return  # the daemon went away meanwhile: the reconnect decides
            del self._pending[request_id]
        if isinstance(e, grpc.RpcError):
            error = self._rpc_error("Submit", e)
        else:
            error = self._session_error() or UnavailableError(
                grpc.StatusCode.UNAVAILABLE, f"Submit: railyardd at {self.socket} unavailable: {e}")
        work._complete(error)


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

    The session outlives its daemon: after a handover (``railyardd --takeover``) or, within
    ``$RAILYARD_RECONNECT_S`` seconds (default 60; 0: the session ends with the daemon), a
    restart, it moves to the next daemon on the socket (:class:`Client`).

    Raises:
        UnavailableError: no daemon at the socket (the message names it).
        PermissionDeniedError: wrong token for the job.
        InvalidArgumentError: malformed job id or socket path, or a ``RAILYARD_*`` setting out
            of range.
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
