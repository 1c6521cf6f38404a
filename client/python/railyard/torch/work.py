"""The railyard backend's ``torch.distributed`` Work, the threads that complete it off the
railyard client's (:class:`Worker`), and the registry that keeps Python works alive for PyTorch's
C++ callers (see the package docstring).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import os
import threading
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import torch

import railyard
from railyard import errors as _errors
from railyard.work import sleep_until_done

_Work = torch._C._distributed_c10d.Work
MAX_TIMEOUT = 4_000_000.0  # seconds (the daemon takes up to 2^32 - 1 ms)


class Worker:
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
# ``Future.then``) never run on, and never block, the railyard client's event thread (the
# point-to-point protocol has a thread of its own: railyard.torch.p2p).
_futures = Worker("railyard-torch-futures")


# Works kept alive until completed and consumed (see the package docstring). A work nobody ever
# waits on (async_op=True, handle dropped) would stay forever: past this many entries, completed
# ones are let go (PyTorch's own C++ callers consume a work right after the call that made it).
live_works: Dict[int, "Work"] = {}
live_lock = threading.Lock()
_LIVE_PRUNE_AT = 4096


def _keep_alive(work: "Work") -> None:
    with live_lock:
        if len(live_works) >= _LIVE_PRUNE_AT:
            for key in [k for k, w in live_works.items() if w._done]:
                del live_works[key]
        live_works[id(work)] = work


def timed_out(seconds: Optional[float], what: str) -> "_errors.DeadlineExceededError":
    after = "" if seconds is None else f" after {seconds:g} s"
    return _errors.DeadlineExceededError(_errors.status_code(4), f"Timed out{after}: {what}")


def worded(error: Optional[BaseException], seconds: Optional[float]) -> Optional[BaseException]:
    """The daemon's deadline errors, worded as PyTorch's backends word theirs ("Timed out")."""
    if isinstance(error, _errors.DeadlineExceededError) and \
            not error.message.startswith("Timed out"):
        worded = timed_out(seconds, error.message)
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
        error = worded(error, self._timeout)
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
            with live_lock:
                live_works.pop(id(self), None)

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
        if not self._done and not sleep_until_done(self, deadline):
            raise timed_out(timeout, "the railyard operation is not complete (it keeps running "
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
