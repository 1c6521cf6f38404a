"""Point-to-point messages of a process group, with receives from any source: every message is
a header (element count and dtype) and the payload, so that a receive from any source can take
whichever peer's header arrives first (:class:`PointToPoint`).
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
import zlib
from typing import TYPE_CHECKING, Callable, Deque, List, Optional, Tuple

import numpy as np
import torch

import railyard

from .views import as_numpy
from .work import MAX_TIMEOUT, Work, Worker, timed_out

if TYPE_CHECKING:  # pragma: no cover
    from .process_group import ProcessGroupRailyard

# The protocol posts its follow-up receives from a thread of its own (a comm hook that waits on
# the torch futures' thread must not hold them up).
_p2p_worker = Worker("railyard-torch-p2p")


_HEADER_WORDS = 2  # a point-to-point header: [element count, dtype id]


def _dtype_id(dtype: torch.dtype) -> int:
    return zlib.crc32(str(dtype).encode())


_DTYPES_BY_ID = {_dtype_id(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def _describe(numel: int, dtype_id: int) -> str:
    dtype = _DTYPES_BY_ID.get(dtype_id)
    return f"{numel} x {str(dtype).replace('torch.', '') if dtype else f'dtype {dtype_id}'}"


class Claim:
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
        self.waiting: Deque[Claim] = collections.deque()  # non-empty only while PROBING


class PointToPoint:
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
        self.any: Deque[Claim] = collections.deque()

    # -- sending -------------------------------------------------------------------------------

    def send(self, t: torch.Tensor, dst: int, timeout: float) -> List["railyard.Work"]:
        src, dt = as_numpy(t.contiguous(), None)
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

    def recv(self, claim: Claim) -> None:
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

    def recv_any(self, claim: Claim) -> None:
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

    def _post_both(self, claim: Claim) -> None:
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
            rw = self.group.comm.recv(header, p, async_op=True, timeout=MAX_TIMEOUT)
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

    def _next_claim(self, p: int) -> Optional[Claim]:
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

    def _deliver(self, p: int, claim: Claim, numel: int, dtype_id: int) -> None:
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
                arr, dt = as_numpy(torch.empty(numel, dtype=sender), None)
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

    def _arm(self, claim: Claim) -> None:
        def expire() -> None:
            with self.lock:
                if claim.matched:
                    return
                claim.matched = True  # dropped from its queue when next looked at
            who = (f"rank {claim.peer} sent nothing" if claim.peer is not None else
                   f"none of ranks {', '.join(map(str, sorted(self.inbound)))} sent anything")
            claim.work._complete(timed_out(claim.timeout, f"recv of rank {self.group.rank()} "
                                           f"on communicator {self.group.comm.comm_id}: {who}"))

        _p2p_worker.call_at(time.monotonic() + claim.timeout, expire)


def _then(first: Callable[[], None],
          then: Optional[Callable[[], None]]) -> Callable[[], None]:
    def both() -> None:
        first()
        if then is not None:
            then()
    return both
