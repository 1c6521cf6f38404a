"""Operations in flight: :class:`Work` (what ``async_op=True`` returns), the lean path's
:class:`_HostOp`, and how a thread waits for either (:class:`_OnRings`, :func:`sleep_until_done`,
which the torch backend's Work shares).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional

import grpc

from . import _ring, _shrink, _staging, _streams
from ._util import SPAWN_HINT as _SPAWN_HINT
from .errors import DeadlineExceededError, FailedPreconditionError, RailyardError

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

__all__ = ["Work", "sleep_until_done"]


def sleep_until_done(work: Any, deadline: Optional[float]) -> bool:
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
    path's :class:`_HostOp`.

    Both also carry what the client needs to submit them again on a new session after a daemon
    handover or restart (railyard.client, "Reconnects"): ``_entry`` (the request as submitted,
    with the ids the caller holds: a ``_Request`` or an encoded ring entry), ``_link`` (the
    session a gRPC submission went to), ``_slot`` (the submission-ring slot of its entry, -1:
    not published; over gRPC 0 once Submit is under way), ``_rerun_safe`` (its output is other
    memory than its input: running it again after a crash cannot read what it wrote) and
    ``_collective_of`` (the communicator state whose collective sequence it takes a number of;
    None for sends and receives)."""

    __slots__ = ()
    _rings: Optional[_ring.Rings]
    _done: bool

    def _drive(self, deadline: Optional[float]) -> None:
        """Reads the session's completion ring on this thread until done or the deadline
        (``time.monotonic()``). A work the client submits again on a new session (a reconnect)
        gets that session's rings: the wait goes on there."""
        rings = self._rings
        while rings is not None and not self._done:
            try:
                rings.wait_until(lambda: self._done or self._rings is not rings, deadline)
            except _ring.ForkedError:
                raise FailedPreconditionError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"this operation was submitted by the process that process {os.getpid()} "
                    f"was forked from; it cannot wait for it: {_SPAWN_HINT}") from None
            if self._rings is rings:
                return  # done, the deadline, or its session ended (the caller sleeps for it)
            rings = self._rings

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
                 "_seq", "_rings", "_stream_slot", "_entry", "_link", "_slot", "_rerun_safe",
                 "_collective_of", "_shrink_of", "__weakref__")

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
        # For a reconnect (see _OnRings), set as it is submitted.
        self._entry: Any = None
        self._link: Any = None
        self._slot = -1
        self._rerun_safe = False
        self._collective_of: Any = None
        # (Comm, its generation) for a communicator made with on_failure="shrink".
        self._shrink_of: Any = None

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
            if not self._done and not sleep_until_done(self, deadline):
                raise DeadlineExceededError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"operation not complete after {timeout} s (it keeps running in the daemon; "
                    "wait again or give up)")
        if self._error is not None:
            with self._lock:
                shrink, self._shrink_of = self._shrink_of, None
            if shrink is not None:  # first wait of a failed operation of an on_failure="shrink" comm
                self._error = _shrink.after_failure(shrink[0], self._error, shrink[1])
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

    __slots__ = ("_client", "_rings", "_staged", "_ptr", "_nbytes", "_on_done", "_done", "_entry",
                 "_link", "_slot", "_rerun_safe", "_collective_of")

    def __init__(self, client: "Client", rings: _ring.Rings, slot: _staging.Slot, ptr: int,
                 nbytes: int, on_done: Callable[[Optional[RailyardError]], None],
                 entry: bytes, collective_of: Any) -> None:
        self._client = client
        self._rings = rings
        self._staged = slot
        self._ptr = ptr
        self._nbytes = nbytes
        self._on_done: Optional[Callable[[Optional[RailyardError]], None]] = on_done
        self._done = False
        # For a reconnect (see _OnRings). In place in its staging slot: never run twice.
        self._entry = entry
        self._link = None
        self._slot = -1
        self._rerun_safe = False
        self._collective_of = collective_of

    def _complete(self, error: Optional[RailyardError], seq: Optional[int] = None) -> None:
        # Called once: the client hands a completion to the work it pops from its table.
        if error is None:
            ctypes.memmove(self._ptr, self._staged.address, self._nbytes)
        self._client._staging.release(self._staged)
        # Dropped once called: the caller's work usually holds this op (to drive it), so keeping
        # its callback would make a reference cycle per operation, which only the garbage
        # collector frees. Enough of them start full collections (35-45 ms with torch loaded).
        on_done, self._on_done = self._on_done, None
        self._done = True
        if on_done is not None:
            on_done(error)
