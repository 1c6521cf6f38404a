"""The session rings: the shared-memory fast path (docs/local-api.md, "Rings").

Speaks the bytes of ``proto/railyard/v1/ring.h``: a submission ring this process writes and the
daemon reads, a completion ring the daemon writes and this process reads, futex doorbells on
both. Stores from Python reach memory in program order only on a TSO machine (x86-64), which is
where :func:`supported` says the fast path may be used; elsewhere the client stays on gRPC.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import struct
import threading
import time
import weakref
from typing import Any, Callable, List, Optional, Tuple

from . import _memfd
from ._generated import common_pb2
from ._generated import layouts as _h

try:  # the hot path in C++ (client/python/native/ringcore.cc), where it was built
    from . import _ringcore as _native
except ImportError:  # pragma: no cover - a build without it: the Python twin below
    _native = None

# The layout of ring.h, from the header itself (gen_stubs.py generates railyard._layouts).
MAGIC = _h.RING_MAGIC
VERSION = _h.RING_VERSION
HEADER_BYTES = _h.RING_HEADER_BYTES
SQ_ENTRY = _h.RING_SQ_ENTRY_BYTES
CQ_ENTRY = _h.RING_CQ_ENTRY_BYTES
CQ_MESSAGE_OFFSET = _h.RING_CQ_MESSAGE_OFFSET
CQ_MESSAGE_BYTES = _h.RING_CQ_MESSAGE_BYTES
ALGO_BYTES = _h.RING_ALGO_BYTES
COMPRESSION_BYTES = _h.RING_COMPRESSION_BYTES
FLAG_GROUP_NEXT = _h.RING_FLAG_GROUP_NEXT
FLAG_ERROR_FEEDBACK = _h.RING_FLAG_ERROR_FEEDBACK
FLAG_STREAM_SYNC = _h.RING_FLAG_STREAM_SYNC
DEFAULT_SQ_ENTRIES = _h.RING_DEFAULT_SQ_ENTRIES
DEFAULT_CQ_ENTRIES = _h.RING_DEFAULT_CQ_ENTRIES
#: A completion's flags word: the daemon hands the request back untaken (it is handing its node
#: over to a new railyardd); not an outcome, the request is to be submitted again.
CQ_FLAG_MOVED = _h.RING_CQ_FLAG_MOVED
#: How long after a submission or a foreground wait the background reader leaves the completion
#: ring to the submitting thread; meanwhile it reads the ring only every READER_DOZE_S (a
#: completion nobody declared interest in, see Rings.background_wanted, may wait that long).
READER_GRACE_S = 0.002
READER_DOZE_S = 0.05

OFF_SQ_TAIL = _h.RING_OFF_SQ_TAIL
OFF_SQ_HEAD = _h.RING_OFF_SQ_HEAD
OFF_SQ_DOORBELL = _h.RING_OFF_SQ_DOORBELL
OFF_DAEMON_SLEEPING = _h.RING_OFF_DAEMON_SLEEPING
OFF_CQ_TAIL = _h.RING_OFF_CQ_TAIL
OFF_CQ_HEAD = _h.RING_OFF_CQ_HEAD
OFF_CQ_DOORBELL = _h.RING_OFF_CQ_DOORBELL
OFF_CLIENT_WAITERS = _h.RING_OFF_CLIENT_WAITERS

ALL_TO_ALL_V = common_pb2.COLLECTIVE_OP_ALL_TO_ALL_V

# request_id, comm_handle, count, send buffer, send offset, recv buffer, recv offset, op, dtype,
# red_op, root, timeout_ms, flags, ext_slots, vec_len, algo (16 bytes), compression (16 bytes),
# compression_key.
ENTRY = struct.Struct("<QQQQQQQIIIiIIII16s16sQ")
_CQ_HEAD = struct.Struct("<QQiII")  # request_id, seq, code, message_len, flags
# The stream-sync extension slot: words.buffer_id, words.offset, value (the rest zero).
_SYNC = struct.Struct("<QQI")
# The header's first words: magic, version, sq_entries, cq_entries.
_GEOMETRY = struct.Struct("<IIII")


_FIELD = re.compile(r"(\d*)([a-zA-Z?])")


def field_offsets(fmt: str) -> List[int]:
    """Where each field of a little-endian struct format (no padding) starts; ``16s`` is one."""
    out, at = [], 0
    for count, code in _FIELD.findall(fmt.lstrip("<")):
        n = int(count or 1)
        for _ in range(1 if code == "s" else n):
            out.append(at)
            at += n if code == "s" else struct.calcsize("<" + code)
    return out


def _check_layout() -> None:
    """The struct formats above against ring.h's offsets (a format cannot come from the header):
    an error at import, not corrupt entries, where the header moved a field."""
    want = {
        ENTRY: [_h.RING_SQ_REQUEST_ID, _h.RING_SQ_COMM_HANDLE, _h.RING_SQ_COUNT,
                _h.RING_SQ_SEND_BUFFER, _h.RING_SQ_SEND_OFFSET, _h.RING_SQ_RECV_BUFFER,
                _h.RING_SQ_RECV_OFFSET, _h.RING_SQ_OP, _h.RING_SQ_DTYPE, _h.RING_SQ_RED_OP,
                _h.RING_SQ_ROOT, _h.RING_SQ_TIMEOUT_MS, _h.RING_SQ_FLAGS, _h.RING_SQ_EXT_SLOTS,
                _h.RING_SQ_VEC_LEN, _h.RING_SQ_ALGO, _h.RING_SQ_COMPRESSION,
                _h.RING_SQ_COMPRESSION_KEY],
        _CQ_HEAD: [_h.RING_CQ_REQUEST_ID, _h.RING_CQ_SEQ, _h.RING_CQ_CODE,
                   _h.RING_CQ_MESSAGE_LEN, _h.RING_CQ_FLAGS],
        _SYNC: [_h.RING_SYNC_BUFFER, _h.RING_SYNC_OFFSET, _h.RING_SYNC_VALUE],
        _GEOMETRY: [_h.RING_OFF_MAGIC, _h.RING_OFF_VERSION, _h.RING_OFF_SQ_ENTRIES,
                    _h.RING_OFF_CQ_ENTRIES],
    }
    for s, offsets in want.items():
        got = field_offsets(s.format)
        if got != offsets:
            raise ImportError(f"railyard._ring: struct {s.format!r} lays its fields at {got}, "
                              f"proto/railyard/v1/ring.h at {offsets}")
    if ENTRY.size != SQ_ENTRY or _CQ_HEAD.size > CQ_MESSAGE_OFFSET or _SYNC.size > SQ_ENTRY:
        raise ImportError(f"railyard._ring: entry structs of {ENTRY.size}, {_CQ_HEAD.size} and "
                          f"{_SYNC.size} bytes do not fit ring.h's {SQ_ENTRY}-byte submission "
                          f"entry and {CQ_MESSAGE_OFFSET}-byte completion header")


_check_layout()

_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1

# A spinning waiter's yield, paced by what yields cost (proto/railyard/v1/spin_yield.h has the
# reasons and the measurements): a thread whose yields of over _YIELD_LONG_S lost more than a
# quarter of the last _YIELD_WINDOW_S stops yielding for _YIELD_QUIET_S.
_YIELD_LONG_S = _h.YIELD_LONG_NS / 1e9
_YIELD_WINDOW_S = _h.YIELD_WINDOW_NS / 1e9
_YIELD_QUIET_S = _h.YIELD_QUIET_NS / 1e9


class _YieldPacer(threading.local):
    """YieldPacer of spin_yield.h, one per thread."""

    def __init__(self) -> None:
        self.window_start = 0.0
        self.lost = 0.0
        self.quiet_until = 0.0

    def should_yield(self, now: float) -> bool:
        return now >= self.quiet_until

    def yielded(self, before: float, after: float) -> bool:
        """Records a yield from ``before`` to ``after``; True when it starts a quiet period."""
        if after - self.window_start > _YIELD_WINDOW_S:
            self.window_start = after
            self.lost = 0.0
        if after - before > _YIELD_LONG_S:
            self.lost += after - before
        if self.lost <= _YIELD_WINDOW_S / 4:
            return False
        self.quiet_until = after + _YIELD_QUIET_S
        self.window_start = self.quiet_until
        self.lost = 0.0
        return True


_yield_pacer = _YieldPacer()


def _spin_yield() -> bool:
    """False, without yielding, while this thread's yields are paused: stop spinning, sleep."""
    before = time.monotonic()
    if not _yield_pacer.should_yield(before):
        return False
    os.sched_yield()
    _yield_pacer.yielded(before, time.monotonic())
    return True


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = None


def native() -> bool:
    """True when the rings' hot path runs in C++ (``railyard._ringcore``, built with the package;
    ``RAILYARD_PY_NATIVE=0`` keeps the pure-Python one, read when a session opens its rings)."""
    return _native is not None and os.environ.get("RAILYARD_PY_NATIVE", "1") != "0"


def supported() -> bool:
    """The fast path needs x86-64 Linux (TSO store order, the futex syscall number above)."""
    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")


def _syscall():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall


def ring_bytes(sq_entries: int, cq_entries: int) -> int:
    return HEADER_BYTES + sq_entries * SQ_ENTRY + cq_entries * CQ_ENTRY


def ext_slots_for(vec_len: int) -> int:
    return (32 * vec_len + SQ_ENTRY - 1) // SQ_ENTRY


class RingError(Exception):
    pass


class ForkedError(RingError):
    """This process is a fork of the one that mapped the rings: it must not touch them (they are
    shared with its parent and the daemon; a child's entry or read would corrupt the parent's)."""


_live_rings: "weakref.WeakSet[Rings]" = weakref.WeakSet()


def _after_fork_in_child() -> None:  # pragma: no cover - runs in forked children
    for rings in list(_live_rings):
        rings._forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


class Rings:
    """This process's end of one session's rings. Thread-safe.

    ``on_completion(request_id, code, message, seq, flags)`` runs for every completion read, on
    the thread that read it, with no lock of this class held (``flags``: :data:`CQ_FLAG_MOVED`).
    """

    def __init__(self, job: str, on_completion: Callable[[int, int, str, int, int], None],
                 spin_us: int, sq_entries: int = DEFAULT_SQ_ENTRIES,
                 cq_entries: int = DEFAULT_CQ_ENTRIES) -> None:
        self.sq_entries = sq_entries
        self.cq_entries = cq_entries
        self.spin_s = spin_us / 1e6
        self._on_completion = on_completion
        self.mapping, self.fd = _memfd.create(job, ring_bytes(sq_entries, cq_entries))
        _GEOMETRY.pack_into(self.mapping, 0, MAGIC, VERSION, sq_entries, cq_entries)
        m = self.mapping
        self._sq_tail = ctypes.c_uint64.from_buffer(m, OFF_SQ_TAIL)
        self._sq_head = ctypes.c_uint64.from_buffer(m, OFF_SQ_HEAD)
        self._sq_doorbell = ctypes.c_uint32.from_buffer(m, OFF_SQ_DOORBELL)
        self._daemon_sleeping = ctypes.c_uint32.from_buffer(m, OFF_DAEMON_SLEEPING)
        self._cq_tail = ctypes.c_uint64.from_buffer(m, OFF_CQ_TAIL)
        self._cq_head = ctypes.c_uint64.from_buffer(m, OFF_CQ_HEAD)
        self._cq_doorbell = ctypes.c_uint32.from_buffer(m, OFF_CQ_DOORBELL)
        self._client_waiters = ctypes.c_uint32.from_buffer(m, OFF_CLIENT_WAITERS)
        self._sq_doorbell_addr = ctypes.addressof(self._sq_doorbell)
        self._cq_doorbell_addr = ctypes.addressof(self._cq_doorbell)
        self._futex = _syscall()
        self._sq_lock = threading.Lock()
        self._cq_lock = threading.Lock()
        self._waiters_lock = threading.Lock()
        self._fence_lock = threading.Lock()  # see _ring_doorbell
        self._tail = 0  # our sq_tail
        self._head = 0  # our cq_head
        self._cq_base = HEADER_BYTES + sq_entries * SQ_ENTRY
        self._closed = False
        self._forked = False  # set in a forked child (_after_fork_in_child)
        _live_rings.add(self)
        # Threads waiting in the foreground (Work.wait): the background reader stays out of
        # their way (it does not ask the daemon to wake it while they read the ring).
        self._foreground = 0
        # ... and until _foreground_until (time.monotonic()), READER_GRACE_S after the last
        # submission or foreground wait: a thread that loops over operations spends much of its
        # time between its waits (the torch backend's all_reduce ~60 %), and a reader that asks
        # the daemon to wake it there costs a wake system call in the daemon and a thread switch
        # and GIL hand-off here per operation (torch, world size 1: 26 us per all_reduce without
        # it, 39 us with it). Meanwhile the reader dozes on its own bell and reads the ring each
        # READER_DOZE_S; background_wanted() ends the grace for a completion someone waits for
        # off this thread (a callback, a torch future). The doze is long because every wake
        # costs more than its own switch: until the reader gets the GIL, each time the working
        # thread drops it (torch's C++ calls, ctypes) the reader is woken and put back to sleep
        # (2 ms dozes: ~0.16 of the reader's switches per all_reduce, 8 per doze).
        self._foreground_until = 0.0
        self._reader_bell = ctypes.c_uint32(0)  # 1 once closed
        self._reader_bell_addr = ctypes.addressof(self._reader_bell)
        self._reader_dozing = False
        self._reader: Optional[threading.Thread] = None
        # The C++ hot path (publish, drain, wait_until), where built: it keeps its own indices,
        # the foreground count and grace, and its closed flag; the Python twin's are unused then.
        self._core = (_native.RingCore(m, sq_entries, cq_entries, float(spin_us),
                                       on_completion, READER_GRACE_S) if native() else None)

    # -- the futex --------------------------------------------------------------------------

    def _wait(self, addr: int, expected: int, seconds: float) -> None:
        ts = _Timespec(int(seconds), int((seconds - int(seconds)) * 1e9))
        self._futex(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAIT, ctypes.c_uint32(expected),
                    ctypes.byref(ts), None, 0)

    def _wake(self, addr: int, n: int) -> None:
        self._futex(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAKE, n, None, None, 0)

    def _add_waiter(self, delta: int) -> None:
        if self._core is not None:
            self._core.add_waiter(delta)  # atomic, as the C++ wait's own
            return
        with self._waiters_lock:
            self._client_waiters.value = (self._client_waiters.value + delta) & 0xFFFFFFFF

    # -- submissions ------------------------------------------------------------------------

    @staticmethod
    def encode(out: bytearray, request_id: int, comm_handle: int, op: int, dtype: int,
               red_op: int, count: int, root: int, send: tuple, recv: tuple, timeout_ms: int,
               algo: str, group_next: bool, vectors: Optional[tuple] = None,
               compression: str = "", error_feedback: bool = False,
               compression_key: int = 0,
               stream_sync: Optional[Tuple[int, int, int]] = None) -> None:
        """Appends one entry (and its extension slots: AllToAllv's vectors, then the stream
        sync's (buffer id, offset, value)) to ``out``."""
        algo_b = algo.encode()
        if len(algo_b) >= ALGO_BYTES:
            raise ValueError(f"algorithm name {algo!r} is longer than {ALGO_BYTES - 1} "
                             "characters")
        compression_b = compression.encode()
        if len(compression_b) >= COMPRESSION_BYTES:
            raise ValueError(f"compression {compression!r} is longer than "
                             f"{COMPRESSION_BYTES - 1} characters")
        flags = (FLAG_GROUP_NEXT if group_next else 0) | (FLAG_ERROR_FEEDBACK if error_feedback
                                                           else 0)
        if stream_sync is not None:
            flags |= FLAG_STREAM_SYNC
        vec_len = len(vectors[0]) if vectors else 0
        vec_slots = ext_slots_for(vec_len) if op == ALL_TO_ALL_V else 0
        ext = vec_slots + (1 if stream_sync is not None else 0)
        out += ENTRY.pack(request_id, comm_handle, count, send[0], send[1] if send[0] else 0,
                           recv[0], recv[1] if recv[0] else 0, op, dtype, red_op, root,
                           timeout_ms, flags, ext, vec_len if op == ALL_TO_ALL_V else 0, algo_b,
                           compression_b, compression_key if error_feedback else 0)
        if vec_slots:
            flat = b"".join(struct.pack(f"<{vec_len}Q", *v) for v in vectors)
            out += flat + bytes(vec_slots * SQ_ENTRY - len(flat))
        if stream_sync is not None:
            out += _SYNC.pack(*stream_sync) + bytes(SQ_ENTRY - _SYNC.size)

    def publish(self, entries: bytes, owner: Any = None) -> None:
        """Publishes whole entries at once (a group), waiting for room while reading
        completions. Raises :class:`RingError` once closed or when they can never fit.

        ``owner``, if given, gets the first entry's slot as ``owner._slot`` before the daemon
        can see the entries (a reconnect tells from it, against :meth:`consumed_head`, whether
        a dead daemon had taken them)."""
        self._check_owner()
        need = len(entries) // SQ_ENTRY
        if need > self.sq_entries:
            raise RingError(f"submission of {need} ring slots does not fit the ring's "
                            f"{self.sq_entries}")
        core = self._core
        if core is not None:
            if not core.publish(entries, owner):
                self._publish_when_room(core, entries, owner)
            return
        started = time.monotonic()
        with self._sq_lock:
            while True:
                head = self._check_in_step(self._tail)
                if self._tail + need - head <= self.sq_entries:
                    break
                if self._closed:
                    raise RingError("the session has ended")
                # Full: the daemon takes entries only while their completions fit.
                self._sq_lock.release()
                try:
                    self._await_room(started)
                finally:
                    self._sq_lock.acquire()
            if self._closed:
                raise RingError("the session has ended")
            if owner is not None:
                owner._slot = self._tail
            m = self.mapping
            base = HEADER_BYTES
            for i in range(need):
                slot = (self._tail + i) & (self.sq_entries - 1)
                m[base + slot * SQ_ENTRY:base + (slot + 1) * SQ_ENTRY] = \
                    entries[i * SQ_ENTRY:(i + 1) * SQ_ENTRY]
            self._tail += need
            self._sq_tail.value = self._tail  # after the entries: TSO keeps the order
            self._ring_doorbell()
        self._foreground_until = time.monotonic() + READER_GRACE_S

    def _publish_when_room(self, core, entries: bytes, owner: Any) -> None:
        """The C++ path's full ring: waits for room until the entries fit."""
        started = time.monotonic()
        while not core.publish(entries, owner):
            if core.closed:
                raise RingError("the session has ended")
            self._check_in_step(core.sq_tail)
            self._await_room(started)

    def consumed_head(self) -> int:
        """The daemon's head, clamped to what this client published: entries at slots below it
        were taken by the daemon (it copies an entry out, and moves its head past it, before it
        acts on it), the rest never were. Meaningful once :meth:`close` and
        :meth:`fence_submissions` have returned (nothing is published any more)."""
        if self._core is not None:
            return self._core.consumed_head
        return min(self._sq_head.value, self._tail)

    def fence_submissions(self) -> None:
        """After :meth:`close`: returns once no :meth:`publish` is writing entries (every entry
        published has its owner's slot; later publishes fail). The C++ path publishes under the
        GIL, which close() took."""
        with self._sq_lock:
            pass

    def _check_in_step(self, tail: int) -> int:
        """The daemon's head; raises :class:`RingError` when it is where no entry this client
        published can have put it: something else wrote the ring's tail word, and the ring
        would never have room again (or take our entries)."""
        head = self._sq_head.value
        if head > tail or tail - head > self.sq_entries:
            raise RingError(f"the submission ring is out of step: the daemon's head is at {head}, "
                            f"this client published up to {tail}; something other than this "
                            "client library wrote the ring's tail. Reconnect for new rings")
        return head

    def _await_room(self, started: float) -> None:
        """One wait for room in a full submission ring. Only a completion read makes room (the
        daemon takes an entry once its completion fits), and the read that makes it wakes the
        daemon (drain), so nothing here pokes it: a poke per spin woke its ring thread thousands
        of times a second while a deep queue waited on the network. Reads completions; else
        yields the CPU for the spin time after ``started``; else naps 50 us until 2 ms have
        passed (in a stream of small operations room comes within microseconds, and a client
        asleep on the doorbell makes the daemon ring it, a system call, per completion batch);
        else sleeps on the completion doorbell (10 ms at most: a lost wake-up costs that)."""
        if self.drain() > 0:
            return
        waited = time.monotonic() - started
        # time.sleep(0) is a ~90 us system call here: spin by yielding, then sleep
        if waited < self.spin_s and _spin_yield():
            return
        if waited < 2e-3:
            time.sleep(50e-6)
            return
        self._add_waiter(1)
        try:
            ring = self._cq_doorbell.value
            if self.drain() == 0 and not self._closed:
                self._wait(self._cq_doorbell_addr, ring, 0.01)
        finally:
            self._add_waiter(-1)

    def _check_owner(self) -> None:
        if self._forked:
            raise ForkedError("the session's rings belong to the process this one was forked from")

    def _ring_doorbell(self) -> None:
        """Bumps the submission doorbell and wakes the daemon's thread if it sleeps on it.

        The daemon sets its sleeping flag, then reads the doorbell and the tail before it sleeps
        on the doorbell; we store the tail and the doorbell, then read the flag. Each side needs
        a store-load fence between the two (else both may read the other's old value and the
        entry waits for the daemon's 1 s backstop). Python has no fence, but taking and
        releasing a lock is an atomic read-modify-write, a full fence on x86-64 (which this
        module requires, see :func:`supported`): ~0.1 us, where the wake system call it saves
        when the daemon is awake costs 10-20 us on a paravirtualised guest."""
        self._sq_doorbell.value = (self._sq_doorbell.value + 1) & 0xFFFFFFFF
        with self._fence_lock:
            pass
        if self._daemon_sleeping.value:
            self._wake(self._sq_doorbell_addr, 1)

    def _poke_daemon(self) -> None:
        """Wakes the daemon if it waits for completion-ring room (entries wait for it)."""
        if self._core is not None:
            self._core.poke()  # its doorbell add is atomic; this twin's is not
            return
        if self._sq_head.value != self._sq_tail.value:
            self._ring_doorbell()

    # -- completions ------------------------------------------------------------------------

    def drain(self, blocking: bool = True) -> int:
        """Reads the completions there are and hands each to ``on_completion``."""
        self._check_owner()
        if self._core is not None:
            return self._core.drain()
        if not self._cq_lock.acquire(blocking):
            return 0
        got = []
        try:
            if self._closed:
                return 0
            tail = self._cq_tail.value
            m = self.mapping
            while self._head != tail:
                off = self._cq_base + (self._head & (self.cq_entries - 1)) * CQ_ENTRY
                request_id, seq, code, length, flags = _CQ_HEAD.unpack_from(m, off)
                message = ""
                if code != 0:
                    length = min(length, CQ_MESSAGE_BYTES)
                    start = off + CQ_MESSAGE_OFFSET
                    message = bytes(m[start:start + length]).decode("utf-8", "replace")
                got.append((request_id, code, message, seq, flags))
                self._head += 1
            if got:
                self._cq_head.value = self._head
        finally:
            self._cq_lock.release()
        if got:
            self._poke_daemon()
            for c in got:
                self._on_completion(*c)
        return len(got)

    def wait_until(self, done: Callable[[], bool], deadline: Optional[float]) -> bool:
        """Reads completions on this thread until ``done()`` or the deadline (monotonic):
        spins for the spin time, then sleeps on the completion doorbell."""
        self._check_owner()
        if self._core is not None:
            return self._core.wait_until(done, deadline)
        with self._waiters_lock:
            self._foreground += 1
        try:
            spin_end = time.monotonic() + self.spin_s
            spins = 0
            while not done():
                if self._closed:
                    return done()
                if self.drain(blocking=False):
                    continue
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return done()
                if now < spin_end:
                    spins += 1
                    # The daemon's thread we wait for may share our core (~1 us). Where
                    # yields lose the core to busy neighbours, sleep instead.
                    if spins % 8 != 0 or _spin_yield():
                        continue
                self._add_waiter(1)
                try:
                    ring = self._cq_doorbell.value
                    if self.drain() == 0 and not done() and not self._closed:
                        left = 0.1 if deadline is None else max(0.0, min(0.1, deadline - now))
                        self._wait(self._cq_doorbell_addr, ring, left)
                finally:
                    self._add_waiter(-1)
            return True
        finally:
            with self._waiters_lock:
                self._foreground -= 1
                self._foreground_until = time.monotonic() + READER_GRACE_S

    def background_wanted(self) -> None:
        """A completion is awaited off the submitting thread: the reader asks the daemon to
        wake it from now on (until the next submission or foreground wait)."""
        self._foreground_until = 0.0
        if self._core is not None:
            self._core.foreground_until = 0.0
        if self._reader_dozing:
            self._wake(self._reader_bell_addr, 1)

    def start_reader(self) -> None:
        """A background thread that reads completions nobody waits for in the foreground (for
        callbacks: ``Work.add_done_callback``, torch futures)."""
        self._reader = threading.Thread(target=self._read, name="railyard-ring", daemon=True)
        self._reader.start()

    def _waiting_in_foreground(self) -> bool:
        core = self._core
        return bool(core.foreground if core is not None else self._foreground)

    def _in_grace(self) -> bool:
        core = self._core
        until = core.foreground_until if core is not None else self._foreground_until
        return time.monotonic() < until

    def _read(self) -> None:
        while not self._closed:
            if self._waiting_in_foreground() or self._in_grace():
                # Doze on our own bell, not on the completion doorbell: every completion bumps
                # that, so a wait there returns whenever one lands between reading it and
                # sleeping, and each return takes the GIL from the thread doing the work.
                self._reader_dozing = True
                try:
                    self._wait(self._reader_bell_addr, 0, READER_DOZE_S)
                finally:
                    self._reader_dozing = False
                if not self._waiting_in_foreground() and not self._closed:
                    self.drain(blocking=False)  # completions nobody is waiting for
                continue
            self._add_waiter(1)
            try:
                ring = self._cq_doorbell.value
                if self.drain() == 0 and not self._closed and not self._waiting_in_foreground():
                    self._wait(self._cq_doorbell_addr, ring, 1.0)
            finally:
                self._add_waiter(-1)

    def close(self) -> None:
        """Wakes every waiter; later :meth:`publish` calls fail (the session has ended)."""
        if self._forked:
            return  # the parent's: nothing here to wake, nothing to close for it
        self._closed = True
        if self._core is not None:
            self._core.close()
        with self._cq_lock:
            pass  # a drain in progress has finished
        self._cq_doorbell.value = (self._cq_doorbell.value + 1) & 0xFFFFFFFF
        self._wake(self._cq_doorbell_addr, 1 << 30)
        self._reader_bell.value = 1
        self._wake(self._reader_bell_addr, 1)
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(5.0)

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
