"""The session rings from Python (railyard/_ring.py) against a real railyardd: the default path
and the gRPC fallback, garbage a client writes into its own ring, a client killed with
operations in flight, a forked child, and torch's destroy_process_group."""

from __future__ import annotations

import collections
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import railyard
from railyard import _ring


def _session(daemon, client):
    for s in daemon.status().sessions:
        if client.session_id.startswith(s.session_id_prefix):
            return s
    raise AssertionError(f"no session {client.session_id[:8]} in the daemon's status")


def test_rings_are_the_default_and_fastpath_0_is_grpc(daemon, monkeypatch):
    with railyard.connect(daemon.socket, job="rings-default") as c:
        assert c.fastpath
        comm = c.comm(c.new_comm_id(), 0, 1)
        x = c.zeros(5, np.int32)
        x[:] = [1, 2, 3, 4, 5]
        for _ in range(50):
            comm.all_reduce(x)
        assert list(x) == [1, 2, 3, 4, 5]  # one rank: the sum is itself
        s = _session(daemon, c)
        assert s.rings and s.ring_submitted >= 50 and s.ring_completed >= 50
    monkeypatch.setenv("RAILYARD_FASTPATH", "0")
    with railyard.connect(daemon.socket, job="rings-default") as c:
        assert not c.fastpath
        comm = c.comm(c.new_comm_id(), 0, 1)
        x = c.zeros(3, np.float32)
        x[:] = 2.5
        comm.all_reduce(x)
        assert list(x) == [2.5, 2.5, 2.5]
        s = _session(daemon, c)
        assert not s.rings and s.ring_submitted == 0


def test_bad_spin_setting_is_refused(daemon, monkeypatch):
    monkeypatch.setenv("RAILYARD_SPIN_US", "soon")
    with pytest.raises(railyard.InvalidArgumentError, match="RAILYARD_SPIN_US=soon"):
        railyard.connect(daemon.socket, job="rings-spin")


def test_two_ring_sessions_allreduce_and_alltoallv(pair):
    a, b = pair
    assert a.fastpath and b.fastpath
    comm_id = a.new_comm_id()
    comms = [None, None]

    def join(i, c):
        comms[i] = c.comm(comm_id, i, 2)
    threads = [threading.Thread(target=join, args=(i, c)) for i, c in enumerate(pair)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    xs = [a.zeros(6, np.float64), b.zeros(6, np.float64)]
    xs[0][:] = np.arange(6)
    xs[1][:] = 10 * np.arange(6)
    works = [comms[i].all_reduce(xs[i], async_op=True) for i in range(2)]
    for w in works:
        w.wait(30)
    for x in xs:
        assert list(x) == [11.0 * k for k in range(6)]
    # All-to-all-v: its vectors travel in the ring's extension slots.
    send = [np.array([1, 2, 3], np.int32), np.array([4, 5], np.int32)]
    counts = [[1, 2], [1, 1]]  # rank r sends counts[r][p] to p
    displs = [[0, 1], [0, 1]]
    out = [np.zeros(2, np.int32), np.zeros(3, np.int32)]
    rc = [[counts[0][0], counts[1][0]], [counts[0][1], counts[1][1]]]
    rd = [[0, 1], [0, 2]]
    works = [comms[r].all_to_all_v(send[r], counts[r], rc[r], out=out[r],
                                   send_displs=displs[r], recv_displs=rd[r], async_op=True)
             for r in range(2)]
    for w in works:
        w.wait(30)
    assert list(out[0]) == [1, 4]
    assert list(out[1]) == [2, 3, 5]


def _busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_loop_that_waits_for_its_own_operations_costs_the_daemon_no_wake_ups(daemon):
    """A loop like torch's all_reduce: submit, ~40 us of Python, wait. The thread reads its own
    completions, so the background reader must not ask the daemon to wake it for each one (that
    was a futex wake in the daemon and a thread switch and GIL hand-off here, per operation)."""
    with railyard.connect(daemon.socket, job="rings-quiet") as c:
        comm = c.comm(c.new_comm_id(), 0, 1)
        x = c.zeros(1, np.float32)
        x[:] = 3.0
        for _ in range(20):
            comm.all_reduce(x)
        before = _session(daemon, c)
        n = 400
        for _ in range(n):
            w = comm.all_reduce(x, async_op=True)
            _busy(40e-6)
            w.wait(30)
        after = _session(daemon, c)
        assert after.ring_completed - before.ring_completed >= n  # (status reads count too)
        assert list(x) == [3.0]
        # The loop's own thread may sleep now and then (a descheduled daemon thread); the reader
        # must not wake for every one: before, ~0.2-0.5 wakes per operation here (80-200). Under
        # ctest -j2 beside a heavy test, 28 of 400 were seen with the reader behaving: the bound
        # leaves room for that and still fails the old behaviour.
        assert after.ring_client_wakes - before.ring_client_wakes <= n // 8


def test_a_full_ring_waiting_for_its_peer_leaves_the_daemon_asleep(pair, daemon):
    """More operations than the rings hold, whose peer has not come yet: the submitting thread
    blocks for room. It must sleep on the completion doorbell, not wake the daemon's ring thread
    every 50 us (it did: ~3,700 wake-ups a second under a deep queue on the fabric). When the
    peer comes, every operation runs and the waiting submissions go in."""
    a, b = pair
    cid = a.new_comm_id()
    comms = [None, None]
    joins = [threading.Thread(target=lambda i=i, c=c: comms.__setitem__(i, c.comm(cid, i, 2)))
             for i, c in enumerate(pair)]
    for t in joins:
        t.start()
    for t in joins:
        t.join(60)
    assert all(comms), "the two sessions did not form a communicator"
    n = _ring.DEFAULT_CQ_ENTRIES + _ring.DEFAULT_SQ_ENTRIES + 64  # both rings full, and more
    xs = [a.zeros(4, np.float32), b.zeros(4, np.float32)]
    xs[0][:] = 1.0
    xs[1][:] = 2.0
    works = [[], []]

    def submit(i):
        for _ in range(n):
            works[i].append(comms[i].all_reduce(xs[i], railyard.ReduceOp.MAX, async_op=True))

    first = threading.Thread(target=submit, args=(0,))
    first.start()
    deadline = time.monotonic() + 30
    while _session(daemon, a).ring_submitted < _ring.DEFAULT_CQ_ENTRIES:
        assert time.monotonic() < deadline, _session(daemon, a)
        time.sleep(0.05)
    time.sleep(0.2)
    assert first.is_alive() and len(works[0]) < n  # blocked for room
    before = _session(daemon, a).ring_daemon_wakeups
    time.sleep(1.0)
    after = _session(daemon, a).ring_daemon_wakeups
    assert after - before <= 5, (before, after)
    second = threading.Thread(target=submit, args=(1,))
    second.start()
    first.join(60)
    second.join(60)
    assert len(works[0]) == n and len(works[1]) == n
    for w in works[0] + works[1]:
        w.wait(60)
    assert list(xs[0]) == [2.0] * 4 and list(xs[1]) == [2.0] * 4


def _dozing_reader(daemon, monkeypatch, job):
    """A client whose background reader has gone into a 30 s doze (after a few operations the
    thread waited for itself): what it then does promptly is not the reader's doing."""
    monkeypatch.setattr(_ring, "READER_DOZE_S", 30.0)
    c = railyard.connect(daemon.socket, job=job)
    comm = c.comm(c.new_comm_id(), 0, 1)
    x = c.zeros(4, np.int64)
    x[:] = [5, 6, 7, 8]
    for _ in range(3):
        comm.all_reduce(x)
    time.sleep(0.2)  # the reader's grace ends: it sleeps as a waiter on the doorbell
    for _ in range(3):
        comm.all_reduce(x)  # the first completion wakes it, in the grace: it dozes
    return c, comm, x


def test_a_callback_nobody_waits_for_runs_promptly(daemon, monkeypatch):
    """The reader leaves the ring to a thread that submits and waits, but a work with a callback
    and nobody waiting for it is read at once (add_done_callback wakes the reader), not at the
    reader's next look."""
    c, comm, x = _dozing_reader(daemon, monkeypatch, "rings-callback")
    with c:
        done = threading.Event()
        seen = []
        w = comm.all_reduce(x, async_op=True)
        w.add_done_callback(lambda work: (seen.append(work.exception()), done.set()))
        assert done.wait(10), "the callback waited for the reader's doze"
        assert seen == [None] and list(x) == [5, 6, 7, 8]


def test_is_completed_reads_the_ring_itself(daemon, monkeypatch):
    """Polling is_completed() sees the completion without wait() and without the background
    reader."""
    c, comm, x = _dozing_reader(daemon, monkeypatch, "rings-poll")
    with c:
        w = comm.all_reduce(x, async_op=True)
        deadline = time.monotonic() + 10
        while not w.is_completed():
            assert time.monotonic() < deadline, "is_completed() waited for the reader's doze"
        assert w.exception() is None and list(x) == [5, 6, 7, 8]


def _write_behind_the_library(rings, entry):
    """Publishes one submission slot as a client that writes its ring itself would: into the
    slot at the tail, then the tail, then the doorbell. Waits (10 s at most) for room."""
    tail = rings._sq_tail.value
    deadline = time.monotonic() + 10
    while tail + 1 - rings._sq_head.value > rings.sq_entries:
        assert time.monotonic() < deadline, "the daemon stopped taking entries"
        rings.drain(blocking=False)
        time.sleep(0.001)
    at = _ring.HEADER_BYTES + (tail & (rings.sq_entries - 1)) * _ring.SQ_ENTRY
    rings.mapping[at:at + _ring.SQ_ENTRY] = bytes(entry)
    rings._sq_tail.value = tail + 1
    rings._wake(rings._sq_doorbell_addr, 1)


def test_a_ring_entry_decodes_to_the_request_it_encodes():
    # After a reconnect to a session without rings, an operation submitted as a ring entry (the
    # torch backend's lean path) goes over gRPC: from what its entry says.
    from railyard._generated import common_pb2
    from railyard._request import _Request
    r = _Request(7, common_pb2.COLLECTIVE_OP_ALL_TO_ALL_V, 1, 0, 0, 0, 1500, "ring",
                 send_counts=[1, 2], send_displs=[0, 1], recv_counts=[2, 1], recv_displs=[0, 2])
    r.send, r.recv, r.request_id, r.stream_sync = (3, 64), (4, 128), 99, (5, 8, 17)
    entry = bytearray()
    _ring.Rings.encode(entry, 99, 7, r.op, 1, 0, 0, 0, r.send, r.recv, 1500, "ring", False,
                       r.vectors, "", False, 0, r.stream_sync)
    back = _Request.from_entry(entry)
    assert {f: getattr(back, f) for f in _Request.__slots__} == \
        {f: getattr(r, f) for f in _Request.__slots__}
    r = _Request(2, common_pb2.COLLECTIVE_OP_ALL_REDUCE, 1, 1, 16, 0, 0, "", "fp16", True, 42)
    r.send = r.recv = (9, 0)
    entry = bytearray()
    _ring.Rings.encode(entry, 0, 2, r.op, 1, 1, 16, 0, r.send, r.recv, 0, "", False, None,
                       "fp16", True, 42)
    back = _Request.from_entry(entry)
    assert {f: getattr(back, f) for f in _Request.__slots__} == \
        {f: getattr(r, f) for f in _Request.__slots__}


def test_garbage_in_a_clients_own_ring_gets_errors_and_nobody_else_notices(fresh_daemon):
    vandal = railyard.connect(fresh_daemon.socket, job="vandal")
    bystander = railyard.connect(fresh_daemon.socket, job="bystander")
    try:
        comm = bystander.comm(bystander.new_comm_id(), 0, 1)
        x = bystander.zeros(4, np.float32)
        rings = vandal._rings
        rng = np.random.default_rng(7)
        # Random entries, then a tail far beyond the ring, written behind the client library's
        # back.
        for i in range(200):
            slot = bytearray(rng.integers(0, 256, _ring.SQ_ENTRY, dtype=np.uint8).tobytes())
            struct.pack_into("<Q", slot, 0, 10_000_000 + i)
            struct.pack_into("<I", slot, 80, 0)  # no extension slots: one entry each
            _write_behind_the_library(rings, slot)
            x[:] = i
            comm.all_reduce(x)  # the bystander's work goes on, exact
            assert list(x) == [float(i)] * 4
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _session(fresh_daemon, vandal).ring_refused < 200:
            time.sleep(0.01)
        s = _session(fresh_daemon, vandal)
        assert s.ring_submitted == 200 and s.ring_refused == 200
        rings._sq_tail.value = rings._sq_tail.value + 10 ** 12
        rings._wake(rings._sq_doorbell_addr, 1)
        time.sleep(0.1)
        assert _session(fresh_daemon, vandal).ring_refused == 201  # reported once
        x[:] = 3
        comm.all_reduce(x)
        assert list(x) == [3.0] * 4
        assert fresh_daemon.proc.poll() is None
        # The vandal's own library finds its ring out of step (the daemon's head past the tail
        # it published) and says so at once, instead of waiting for room forever.
        mine = vandal.comm(vandal.new_comm_id(), 0, 1)
        start = time.monotonic()
        with pytest.raises(railyard.FailedPreconditionError, match="out of step") as info:
            mine.all_reduce(vandal.zeros(4, np.float32), timeout=5)
        assert time.monotonic() - start < 2.0
        assert "something other than this client library wrote the ring" in info.value.message
    finally:
        vandal.close()
        bystander.close()


def test_mutated_entries_get_errors_naming_the_field_and_never_reach_another_jobs_buffer(
        fresh_daemon, monkeypatch):
    # Valid entries with one to three fields changed (what a buggy or hostile client writes,
    # past the first checks that random bytes stop at), a few raw random ones, and entries that
    # name another job's buffer id: each gets one completion, and an error says what is wrong.
    # A bystander job's operations and its memory stay exact.
    base = 20_000_000
    seen = []
    deliver = railyard.client.Client._on_ring_completion

    def spy(self, request_id, code, message, seq, flags=0):
        if request_id >= base:
            seen.append((request_id, code, message))
        return deliver(self, request_id, code, message, seq, flags)

    monkeypatch.setattr(railyard.client.Client, "_on_ring_completion", spy)
    vandal = railyard.connect(fresh_daemon.socket, job="mutant")
    bystander = railyard.connect(fresh_daemon.socket, job="bystander")
    stop = threading.Event()
    outcome = []
    try:
        bcomm = bystander.comm(bystander.new_comm_id(), 0, 1)
        secret = bystander.zeros(4096, np.uint8)
        secret[:] = 0xAB
        other_job_buffer, _ = bystander._locate(secret)
        vcomm = vandal.comm(vandal.new_comm_id(), 0, 1)
        src, dst = vandal.zeros(4096, np.float32), vandal.zeros(4096, np.float32)
        src_id, src_off = vandal._locate(src)
        dst_id, dst_off = vandal._locate(dst)
        rings = vandal._rings
        rng = random.Random(13)

        # An AllReduce of 1024 float32s, sum (common.proto's numbers), src to dst.
        def entry(comm=vcomm.handle, count=1024, sb=src_id, so=src_off, rb=dst_id, ro=dst_off,
                  op=1, dtype=1, red=1, root=0, tmo=5000, flags=0, ext=0, vlen=0,
                  algo=b"", comp=b"", key=0):
            e = bytearray(_ring.ENTRY.pack(0, comm, count, sb, so, rb, ro, op, dtype, red, root,
                                           tmo, flags, ext, vlen, algo[:16], comp[:16], key))
            return e + bytes(_ring.SQ_ENTRY - len(e))

        fields = {
            "comm": lambda: rng.choice([vcomm.handle + 1, 0, 2 ** 64 - 1]),
            "count": lambda: rng.choice([0, 4097, 8192, 2 ** 62, 2 ** 64 - 1]),
            "sb": lambda: rng.choice([other_job_buffer, dst_id + 100, 0, 2 ** 63]),
            "rb": lambda: rng.choice([other_job_buffer, src_id + 100, 0, 2 ** 63]),
            "so": lambda: rng.choice([2, 16380, 16384, 2 ** 64 - 4]),
            "ro": lambda: rng.choice([2, 16380, 16384, 2 ** 64 - 4]),
            "op": lambda: rng.choice([0, 11, 99, 2 ** 32 - 1]),
            "dtype": lambda: rng.choice([0, 50, 2 ** 32 - 1]),
            "red": lambda: rng.choice([0, 9, 2 ** 31]),
            "root": lambda: rng.choice([1, -1, 2 ** 31 - 1]),
            "flags": lambda: rng.choice([8, 2 ** 32 - 1, _ring.FLAG_ERROR_FEEDBACK]),
            "ext": lambda: rng.choice([1, 5, 2 ** 32 - 1]),
            "vlen": lambda: rng.choice([1, 2 ** 32 - 1]),
            "algo": lambda: rng.choice([b"nccl", b"ring\0x", b"\x01", b"a" * 16]),
            "comp": lambda: rng.choice([b"zstd", b"topk:-1", b"topk:nan", b"c" * 16]),
            "key": lambda: rng.choice([1, 2 ** 64 - 1]),
        }
        batch = [(entry(sb=other_job_buffer), "send buffer"),  # named first, checked below
                 (entry(rb=other_job_buffer), "recv buffer")]
        for i in range(3000):
            if i % 50 == 49:
                raw = bytearray(rng.getrandbits(8) for _ in range(_ring.SQ_ENTRY))
                struct.pack_into("<I", raw, 80, 0)  # one slot
                batch.append((raw, None))
                continue
            changed = rng.sample(sorted(fields), rng.choice([0, 1, 1, 2, 3]))
            batch.append((entry(**{k: fields[k]() for k in changed}), ",".join(changed)))
        # Valid entries end any group a mutated one opened; an entry that claims extension
        # slots takes the ones after it (up to 5 here) as such, so only the last is sure to be
        # an entry of its own.
        batch += [(entry(), "") for _ in range(8)]

        def bystander_loop():
            i = 0
            x = bystander.zeros(64, np.float32)
            while not stop.is_set():
                x[:] = i
                bcomm.all_reduce(x)
                assert np.all(x == i), (i, x[:4])
                i += 1
            outcome.append(i)

        worker = threading.Thread(target=bystander_loop)
        worker.start()
        for n, (e, _) in enumerate(batch):
            struct.pack_into("<Q", e, 0, base + n)
            _write_behind_the_library(rings, e)
        last = base + len(batch) - 1
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (not seen or seen[-1][0] != last):
            rings.drain(blocking=False)
            time.sleep(0.01)
        stop.set()
        worker.join(30)
        assert outcome and outcome[0] > 0, "the bystander's loop failed"
        assert rings._sq_head.value == rings._sq_tail.value  # every slot taken
        s = _session(fresh_daemon, vandal)
        assert s.ring_submitted == s.ring_completed == len(seen), s
        ids = [r for r, _, _ in seen]
        assert len(set(ids)) == len(ids) and set(ids) <= set(range(base, last + 1))
        by_id = {r - base: (code, message) for r, code, message in seen}
        assert by_id[len(batch) - 1] == (0, ""), by_id[len(batch) - 1]
        for n, what in enumerate(("send", "recv")):
            assert by_id[n] == (5, f"{what} buffer {other_job_buffer} is not registered in "
                                   "this session"), by_id[n]
        codes = collections.Counter(code for code, _ in by_id.values())
        print(f"{len(batch)} slots, {len(seen)} entries, status codes {dict(codes)}; the "
              f"bystander ran {outcome[0]} operations meanwhile")
        assert codes[0] >= 300 and codes[3] >= 1000, codes  # valid ones ran; most were refused
        for n, (code, message) in by_id.items():
            assert code not in (2, 13), (batch[n][1], code, message)  # UNKNOWN, INTERNAL
            assert code == 0 or message, (batch[n][1], code)
            if code == 0:
                assert batch[n][1] is not None, "a raw random entry ran"
        assert np.all(secret == 0xAB)
        assert fresh_daemon.proc.poll() is None
        fresh = railyard.connect(fresh_daemon.socket, job="mutant")  # the job is not poisoned
        try:
            y = fresh.zeros(8, np.float32)
            y[:] = 5
            fresh.comm(fresh.new_comm_id(), 0, 1).all_reduce(y)
            assert list(y) == [5.0] * 8
        finally:
            fresh.close()
    finally:
        stop.set()
        vandal.close()
        bystander.close()


_VICTIM = textwrap.dedent("""
    import sys, numpy as np, railyard
    c = railyard.connect(sys.argv[1], job="killed")
    comm = c.comm(sys.argv[2], 0, 2)
    x = c.zeros(1024, np.float32)
    works = [comm.all_reduce(x, async_op=True) for _ in range(8)]
    print("SUBMITTED", flush=True)
    sys.stdin.read()
""")


def test_a_client_killed_with_operations_in_flight_fails_its_peer_promptly(fresh_daemon):
    peer = railyard.connect(fresh_daemon.socket, job="killed")
    try:
        comm_id = peer.new_comm_id()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        victim = subprocess.Popen([sys.executable, "-c", _VICTIM, fresh_daemon.socket, comm_id],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        comm = peer.comm(comm_id, 1, 2)
        assert victim.stdout.readline().strip() == b"SUBMITTED"
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        x = peer.zeros(1024, np.float32)
        start = time.monotonic()
        # Its 8 entries were taken and matched by nobody: the peer learns of the death at once.
        with pytest.raises((railyard.UnavailableError, railyard.AbortedError)) as e:
            for _ in range(9):
                comm.all_reduce(x, timeout=30)
        assert time.monotonic() - start < 10
        assert "rank 0" in str(e.value)
        assert fresh_daemon.proc.poll() is None
        assert len(fresh_daemon.status().sessions) == 1
    finally:
        peer.close()


def _in_forked_child(child):
    """Runs ``child()`` (which returns lines of text) in a forked child; returns its lines and
    how long it took, after checking that it exited cleanly."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        start = time.monotonic()
        out = child()
        out.append(f"{time.monotonic() - start:.3f}")
        os.write(write_end, "\n".join(out).encode())
        os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_end) as f:
        lines = f.read().splitlines()
    assert os.WEXITSTATUS(status) == 0
    return lines[:-1], float(lines[-1])


def _failure(what, fn):
    try:
        fn()
        return f"{what}: no error"
    except railyard.FailedPreconditionError as e:
        return f"{what}: {e}"


def test_a_forked_child_fails_at_once_and_leaves_its_parents_session_alone(daemon):
    c = railyard.connect(daemon.socket, job="forker")
    try:
        comm = c.comm(c.new_comm_id(), 0, 1)
        lines, took = _in_forked_child(lambda: [
            _failure("inherited", lambda: comm.all_reduce(np.zeros(2, np.float32))),
            _failure("new", lambda: railyard.connect(daemon.socket, job="forker"))])
        assert lines[0].startswith("inherited: ") and "spawn" in lines[0], lines
        assert lines[1].startswith("new: ") and "spawn" in lines[1], lines
        assert took < 2.0  # at once, not after a connect timeout
        # The parent's session survived the child's exit.
        x = c.zeros(2, np.float32)
        x[:] = 4
        comm.all_reduce(x)
        assert list(x) == [4.0, 4.0]
    finally:
        c.close()


def test_a_forked_child_touches_nothing_its_parent_shares_with_the_daemon(daemon):
    """A child forked after its parent used a staging buffer: the child's operations fail at
    once and publish nothing on the shared rings or into the shared staging buffers (a child's
    entry once made its parent's next operation wait forever: the parent's ring tail went
    back behind the entry the daemon had taken)."""
    c = railyard.connect(daemon.socket, job="forker2")
    try:
        comm = c.comm(c.new_comm_id(), 0, 1)
        plain = np.full(3, 2.0, np.float32)  # not shared: goes through a staging buffer
        comm.all_reduce(plain)
        lines, took = _in_forked_child(lambda: [
            _failure("op", lambda: comm.all_reduce(plain)),
            _failure("op", lambda: comm.all_reduce(plain, async_op=True).wait()),
            _failure("op", lambda: comm.all_reduce(plain))])
        for line in lines:
            assert line.startswith("op: ") and "spawn" in line, lines
        assert took < 2.0, lines
        # The parent's operations, staged and shared, run (nothing of the child's reached the
        # rings or the buffers).
        for _ in range(3):
            plain[:] = 2.0
            comm.all_reduce(plain, timeout=10)
            assert list(plain) == [2.0] * 3
        x = c.zeros(2, np.float32)
        x[:] = 4
        comm.all_reduce(x, timeout=10)
        assert list(x) == [4.0, 4.0]
    finally:
        c.close()


_DESTROY = textwrap.dedent("""
    import sys, torch, torch.distributed as dist, railyard.torch
    store = dist.FileStore(sys.argv[1], 1)
    dist.init_process_group("railyard", rank=0, world_size=1, store=store)
    sub = dist.new_group([0])
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.all_reduce(t, group=sub)
    print("COMMS", flush=True)
    sys.stdin.readline()
    dist.destroy_process_group(sub)
    print("DESTROYED SUB", flush=True)
    sys.stdin.readline()
    dist.destroy_process_group()
    print("DESTROYED ALL", flush=True)
    sys.stdin.readline()
""")


def test_destroy_process_group_releases_the_daemon_side_communicators(fresh_daemon, tmp_path):
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
               RAILYARD_SOCKET=fresh_daemon.socket, RAILYARD_JOB="destroy")
    p = subprocess.Popen([sys.executable, "-c", _DESTROY, str(tmp_path / "store")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        def step(expect):
            line = p.stdout.readline().strip()
            assert line == expect, line
            return len([c for c in fresh_daemon.status().comms if c.job_id == "destroy"])
        assert step(b"COMMS") == 2
        p.stdin.write(b"\n")
        p.stdin.flush()
        assert step(b"DESTROYED SUB") == 1
        p.stdin.write(b"\n")
        p.stdin.flush()
        assert step(b"DESTROYED ALL") == 0
        p.stdin.write(b"\n")
        p.stdin.flush()
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()


def test_yields_that_keep_losing_the_core_stop_for_a_while_and_short_ones_never_do():
    # The pure-Python rings' twin of spin_yield.h's YieldPacer (spin_yield_test.cc has the C++).
    p = _ring._YieldPacer()
    t = 5.0
    for i in range(5000):  # yields of up to 240 us: another rank, the daemon's ring thread
        assert p.should_yield(t)
        took = 240e-6 if i % 2 == 0 else 3e-6
        assert not p.yielded(t, t + took)
        t += took + 10e-6
    for i in range(2000):  # up to 1.85 ms: daemon threads running this rank's operations
        assert p.should_yield(t), i
        assert not p.yielded(t, t + 500e-6 + (i % 4) * 450e-6)
        t += 500e-6 + (i % 4) * 450e-6 + 5e-6
    for i in range(100):  # a 3 ms yield every 20 ms (the host taking the vCPU away)
        assert p.should_yield(t)
        assert not p.yielded(t, t + 3e-3), i
        t += 20e-3
    t += 1.0
    for _ in range(4):  # busy neighbours: each yield hands the core over for a 3 ms slice
        assert not p.yielded(t, t + 3e-3)
        t += 3e-3
    assert p.yielded(t, t + 3e-3)  # 15 ms of the last 50: quiet from here
    t += 3e-3
    assert not p.should_yield(t)
    assert not p.should_yield(t + _ring._YIELD_QUIET_S - 1e-6)
    t += _ring._YIELD_QUIET_S
    assert p.should_yield(t)
    assert not p.yielded(t, t + 3e-3)  # counted afresh
    assert p.should_yield(t + 3e-3)
