"""railyard._ringcore, the C++ end of the session rings in the Python client, against a daemon
played here on a plain shared mapping: entry order and wrap-around, a full ring, completions
(messages cut and bad UTF-8 replaced, a callback that raises), waits that end at the deadline or
when the session closes, and refused geometry. The whole client runs over it in test_rings.py and
every other Python test; with RAILYARD_PY_NATIVE=0 they run over the pure-Python twin."""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time

import pytest

from railyard import _ring

core_module = pytest.importorskip("railyard._ringcore")
GRACE = _ring.READER_GRACE_S


def test_the_build_has_the_cpp_rings():
    # CMake sets this where it built the module: a build that lost it would fall back silently.
    if os.environ.get("RAILYARD_EXPECT_NATIVE") == "1":
        assert _ring._native is not None
        assert _ring.native() == (os.environ.get("RAILYARD_PY_NATIVE", "1") != "0")


class FakeDaemon:
    """The daemon's side of one session's rings, on an anonymous shared mapping."""

    def __init__(self, sq=8, cq=8):
        self.sq, self.cq = sq, cq
        self.m = mmap.mmap(-1, _ring.ring_bytes(sq, cq))
        self.seen = []
        self.core = core_module.RingCore(self.m, sq, cq, 50.0, self._on_completion, GRACE)
        self.sq_head = 0
        self.cq_tail = 0

    def _on_completion(self, request_id, code, message, seq, flags):
        self.seen.append((request_id, code, message, seq) + ((flags,) if flags else ()))

    def u64(self, off):
        return struct.unpack_from("<Q", self.m, off)[0]

    def u32(self, off):
        return struct.unpack_from("<I", self.m, off)[0]

    def take(self):
        """Takes every published entry (request ids), as the daemon's ring thread does."""
        tail = self.u64(_ring.OFF_SQ_TAIL)
        ids = []
        while self.sq_head != tail:
            off = _ring.HEADER_BYTES + (self.sq_head % self.sq) * _ring.SQ_ENTRY
            ids.append(struct.unpack_from("<Q", self.m, off)[0])
            self.sq_head += 1
        struct.pack_into("<Q", self.m, _ring.OFF_SQ_HEAD, self.sq_head)
        return ids

    def complete(self, request_id, code=0, message=b"", seq=0, length=None, flags=0):
        off = (_ring.HEADER_BYTES + self.sq * _ring.SQ_ENTRY +
               (self.cq_tail % self.cq) * _ring.CQ_ENTRY)
        struct.pack_into("<QQiII", self.m, off, request_id, seq, code,
                         len(message) if length is None else length, flags)
        self.m[off + _ring.CQ_MESSAGE_OFFSET:off + _ring.CQ_MESSAGE_OFFSET + len(message)] = message
        self.cq_tail += 1
        struct.pack_into("<Q", self.m, _ring.OFF_CQ_TAIL, self.cq_tail)
        struct.pack_into("<I", self.m, _ring.OFF_CQ_DOORBELL,
                         (self.u32(_ring.OFF_CQ_DOORBELL) + 1) & 0xFFFFFFFF)


def entry(request_id):
    out = bytearray()
    _ring.Rings.encode(out, request_id, 1, 2, 1, 1, 1, 0, (1, 0), (1, 0), 0, "", False)
    return bytes(out)


def test_entries_go_out_in_order_across_the_wrap_and_a_full_ring_says_so():
    d = FakeDaemon(sq=8)
    sent = []
    for i in range(20):  # two and a half times round the ring
        if not d.core.publish(entry(i)):
            assert len(sent) - d.sq_head == 8  # full: refused, nothing written
            assert d.take() == sent[-8:]
            assert d.core.publish(entry(i))
        sent.append(i)
    waiting = sent[d.sq_head:]
    assert d.take() == waiting == [16, 17, 18, 19]
    assert d.u64(_ring.OFF_SQ_TAIL) == 20 == d.core.sq_tail
    assert d.u32(_ring.OFF_SQ_DOORBELL) == 20  # one ring per publish
    # A group that can never fit at once is refused too, and one of two slots fits.
    assert not d.core.publish(entry(1) * 9)
    assert d.core.publish(entry(30) + entry(31))
    assert d.take() == [30, 31]
    with pytest.raises(ValueError, match="whole 128-byte slots"):
        d.core.publish(b"x" * 100)


def test_completions_reach_the_callback_in_order_with_their_messages():
    d = FakeDaemon(cq=8)
    for i in range(5):
        d.complete(i, seq=100 + i)
    assert d.core.drain() == 5 and d.core.drain() == 0
    assert d.seen == [(i, 0, "", 100 + i) for i in range(5)]
    assert d.u64(_ring.OFF_CQ_HEAD) == 5
    d.seen.clear()
    for i in range(10):  # past the wrap
        d.complete(10 + i, code=3, message=b"bad \xff input")
        if i % 3 == 2:
            d.core.drain()
    d.core.drain()
    assert [s[0] for s in d.seen] == list(range(10, 20))
    assert all(s[1] == 3 and s[2] == "bad \ufffd input" for s in d.seen)
    # A length beyond the slot (the daemon's bytes are not trusted either) is cut there.
    d.seen.clear()
    d.complete(99, code=13, message=b"m" * 8, length=1 << 30)
    d.core.drain()
    assert d.seen[0][0] == 99 and len(d.seen[0][2]) == _ring.CQ_MESSAGE_BYTES


def test_a_moved_completion_carries_its_flag():
    # A request the daemon hands back untaken (a handover) is not an outcome: the flags word
    # says so, for the client to submit it again to the next daemon.
    d = FakeDaemon()
    d.complete(5, code=14, message=b"handed over", seq=0, flags=_ring.CQ_FLAG_MOVED)
    d.complete(6, seq=9)
    assert d.core.drain() == 2
    assert d.seen == [(5, 14, "handed over", 0, _ring.CQ_FLAG_MOVED), (6, 0, "", 9)]


class Owner:
    _slot = -1


def test_publish_tells_its_owner_the_slot_and_the_consumed_head_what_was_taken():
    # After a crash the client tells from each request's slot, against the daemon's head,
    # whether the dead daemon had taken it: the slot is known before the entry is visible.
    d = FakeDaemon(sq=8)
    owners = [Owner() for _ in range(4)]
    for i, o in enumerate(owners[:3]):
        assert d.core.publish(entry(i), o)
    assert [o._slot for o in owners[:3]] == [0, 1, 2]
    assert d.core.consumed_head == 0
    assert d.take() == [0, 1, 2]
    assert d.core.consumed_head == 3
    assert d.core.publish(entry(3) + entry(4), owners[3]) and owners[3]._slot == 3
    assert d.core.publish(entry(5), None) and d.core.sq_tail == 6
    assert d.core.consumed_head == 3
    # An owner that cannot take the slot: nothing is published.
    with pytest.raises(AttributeError):
        d.core.publish(entry(9), object())
    assert d.core.sq_tail == 6
    with pytest.raises(TypeError, match="1 or 2 arguments"):
        d.core.publish()
    # A head beyond what the client published (a daemon's garbage) is clamped to its tail.
    struct.pack_into("<Q", d.m, _ring.OFF_SQ_HEAD, 1000)
    assert d.core.consumed_head == 6


def test_a_callback_that_raises_loses_no_completion():
    m = mmap.mmap(-1, _ring.ring_bytes(8, 8))
    got = []

    def cb(request_id, code, message, seq, flags):
        got.append(request_id)
        if request_id == 1:
            raise RuntimeError("callback bug")

    d = FakeDaemon()
    d.m, d.core = m, core_module.RingCore(m, 8, 8, 50.0, cb, GRACE)
    for i in range(3):
        d.complete(i)
    with pytest.raises(RuntimeError, match="callback bug"):
        d.core.drain()
    assert got == [0, 1, 2] and d.core.drain() == 0


def test_a_wait_ends_at_its_deadline_on_a_completion_or_when_the_session_closes():
    d = FakeDaemon()
    start = time.monotonic()
    assert d.core.wait_until(lambda: False, time.monotonic() + 0.05) is False
    assert 0.05 <= time.monotonic() - start < 2
    assert d.core.foreground == 0 and d.core.foreground_until > start

    done = []
    d._on_completion = lambda *c: done.append(c)
    d.core = core_module.RingCore(d.m, d.sq, d.cq, 0.0, d._on_completion, GRACE)  # sleeps at once

    def later():
        time.sleep(0.05)
        d.complete(7, seq=3)
        # The doorbell's futex word, woken as the daemon wakes a client waiter.
        import ctypes
        word = ctypes.c_uint32.from_buffer(d.m, _ring.OFF_CQ_DOORBELL)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(202, ctypes.byref(word), 1, 1, None, None, 0)
        del word

    t = threading.Thread(target=later)
    t.start()
    assert d.core.wait_until(lambda: bool(done), time.monotonic() + 10) is True
    t.join()
    assert done == [(7, 0, "", 3, 0)]
    # While asleep the waiter counted itself in client_waiters, and uncounted itself after.
    assert d.u32(_ring.OFF_CLIENT_WAITERS) == 0

    t = threading.Thread(target=lambda: (time.sleep(0.05), d.core.close()))
    start = time.monotonic()
    t.start()
    assert d.core.wait_until(lambda: False, None) is False
    t.join()
    assert time.monotonic() - start < 5 and d.core.closed
    assert not d.core.publish(entry(1))  # closed: nothing goes out
    assert d.core.drain() == 0


def test_a_signal_ends_a_wait():
    # Ctrl-C (here an interval timer's handler) must reach a thread waiting in C++ long before
    # its deadline.
    import signal

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted()

    d = FakeDaemon()
    old = signal.signal(signal.SIGALRM, handler)
    start = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(Interrupted):
            d.core.wait_until(lambda: False, time.monotonic() + 10)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - start < 5
    assert d.core.foreground == 0 and d.u32(_ring.OFF_CLIENT_WAITERS) == 0


def test_a_done_that_raises_ends_the_wait_with_its_error():
    d = FakeDaemon()

    def done():
        raise KeyError("done bug")

    with pytest.raises(KeyError):
        d.core.wait_until(done, None)
    assert d.core.foreground == 0


def test_bad_geometry_and_arguments_are_refused():
    m = mmap.mmap(-1, _ring.ring_bytes(8, 8))
    with pytest.raises(ValueError, match="powers of two"):
        core_module.RingCore(m, 12, 8, 0.0, print, GRACE)
    with pytest.raises(ValueError, match="powers of two"):
        core_module.RingCore(m, 8, 4, 0.0, print, GRACE)
    with pytest.raises(ValueError, match="smaller than the rings"):
        core_module.RingCore(m, 16, 8, 0.0, print, GRACE)
    with pytest.raises(TypeError, match="callable"):
        core_module.RingCore(m, 8, 8, 0.0, None, GRACE)
    with pytest.raises(BufferError, match="not writable"):
        core_module.RingCore(b"read-only bytes", 8, 8, 0.0, print, GRACE)
    bare = core_module.RingCore.__new__(core_module.RingCore)  # never initialised: no crash
    for call in (bare.drain, bare.poke, bare.close, lambda: bare.publish(entry(1)),
                 lambda: bare.wait_until(lambda: True, None), lambda: bare.cq_doorbell):
        with pytest.raises(RuntimeError, match="not initialised"):
            call()
    made = core_module.RingCore(m, 8, 8, 0.0, print, GRACE)
    with pytest.raises(RuntimeError, match="already initialised"):
        core_module.RingCore.__init__(made, m, 8, 8, 0.0, print, GRACE)
