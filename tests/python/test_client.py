"""The client API in one process: shared buffers, env defaults, Work handles, bfloat16.

Several ranks of one communicator can live in one process as separate sessions (clients): the
daemon does not care which process a session belongs to.
"""

from __future__ import annotations

import gc
import glob
import os
import threading

import numpy as np
import pytest

import railyard
from conftest import Daemon


def session_buffers(daemon, client):
    """The buffers the daemon has registered for ``client``'s session (Admin status)."""
    return [s.buffers for s in daemon.status().sessions
            if s.session_id_prefix == client.session_id[:8]][0]


def join_all(clients, comm_id=None, timeout=10.0):
    """Joins one comm with every client (rank i = clients[i]) concurrently."""
    comm_id = comm_id or clients[0].new_comm_id()
    comms = [None] * len(clients)
    errors = []

    def join(i):
        try:
            comms[i] = clients[i].comm(comm_id, i, len(clients), timeout=timeout)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    assert not errors, errors
    return comms


def test_connect_basics(daemon):
    with railyard.connect(daemon.socket, job="basics") as c:
        assert len(c.session_id) == 32 and c.node_name == "pytest"
        assert c.socket == daemon.socket and c.job == "basics"
        comm_id = c.new_comm_id()
        assert comm_id.startswith("ry1-") and comm_id.endswith("@local:pytest")
        with c.comm(comm_id, 0, 1) as comm:
            assert (comm.rank, comm.nranks, comm.nnodes) == (0, 1, 1)
            assert "rank 0 of 1" in repr(comm)
    assert c.closed


def test_env_defaults(daemon, monkeypatch):
    monkeypatch.setenv("RAILYARD_SOCKET", daemon.socket)
    monkeypatch.setenv("RAILYARD_JOB", "from-env")
    monkeypatch.delenv("RAILYARD_TOKEN", raising=False)
    with railyard.connect() as c:
        assert c.socket == daemon.socket and c.job == "from-env"
        jobs = {j.job_id for j in daemon.status().jobs}
        assert "from-env" in jobs


def test_init_from_env(daemon, monkeypatch):
    with railyard.connect(daemon.socket, job="envinit") as c:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "1")
        monkeypatch.setenv("LOCAL_RANK", "0")
        monkeypatch.setenv("RAILYARD_COMM_ID", c.new_comm_id())
        comm = railyard.init_from_env(c)
        assert (comm.rank, comm.nranks, comm.local_rank) == (0, 1, 0)
        x = c.empty(3, np.int32)
        x[:] = 5
        assert comm.all_reduce(x).tolist() == [5, 5, 5]
        monkeypatch.delenv("RAILYARD_COMM_ID")
        with pytest.raises(railyard.InvalidArgumentError, match="RAILYARD_COMM_ID"):
            railyard.init_from_env(c)


def test_empty_is_shared_and_zero_copy(daemon):
    with railyard.connect(daemon.socket, job="shared") as c:
        before = session_buffers(daemon, c)
        x = c.empty((4, 5), np.float64)
        assert x.shape == (4, 5) and x.dtype == np.float64
        assert c.is_shared(x) and c.is_shared(x[1:3]) and c.is_shared(x[2])
        assert not c.is_shared(x[:, 1])  # not contiguous
        assert not c.is_shared(np.zeros(3))
        z = c.zeros(7, np.uint8)
        assert z.sum() == 0
        # Two small arrays: two parts of one pooled buffer (see railyard/_pool.py).
        assert c._pool.slabs() == 1
        assert session_buffers(daemon, c) == before + 2 + 1
        # Collectives on views of a shared array are zero copy and write through.
        comm = c.comm(c.new_comm_id(), 0, 1)
        x[:] = 1.5
        out = comm.all_gather(x[1], out=x[2:3])
        assert out.base is not None and c.is_shared(out)
        comm.close()


def test_buffers_are_released_and_unlinked(daemon):
    with railyard.connect(daemon.socket, job="release") as c:
        def buffers():
            return session_buffers(daemon, c)

        # Small arrays are parts of pooled buffers (railyard/_pool.py), which stay registered;
        # big ones buffers of their own.
        def parts():
            return buffers() - c._pool.slabs()

        arrays = [c.empty(1000, np.float32) for _ in range(5)]
        assert parts() == 5
        big = [c.empty(1 << 17, np.float32) for _ in range(2)]  # 512 KiB each: not pooled
        assert parts() == 7
        # Names are unlinked right after registration: nothing left in /dev/shm.
        assert not glob.glob(f"/dev/shm/railyard.release.{os.getpid()}.*")
        view = arrays[0][10:20]
        big_view = big[0][10:20]
        del arrays, big
        gc.collect()
        keep = c.empty(1, np.uint8)  # releases pending buffers
        assert parts() == 3  # the two still viewed, and the new one
        assert view.sum() == view.sum() and big_view.sum() == big_view.sum()  # still valid
        del view, big_view, keep
        gc.collect()
        keep = c.empty(1, np.uint8)
        assert parts() == 1  # only the new one: the viewed buffers and the last one went


def test_staging_buffers_are_reused(daemon):
    with railyard.connect(daemon.socket, job="staging") as c:
        comm = c.comm(c.new_comm_id(), 0, 1)
        for _ in range(20):
            comm.all_reduce(np.ones(1000, np.float32))
        assert session_buffers(daemon, c) <= 2
        comm.close()


def test_work_handle(pair):
    a, b = join_all(pair)
    xa, xb = pair[0].zeros(4, np.int64), pair[1].zeros(4, np.int64)
    xa += 1
    xb += 2
    wa = a.all_reduce(xa, async_op=True, timeout=10)
    assert not wa.is_completed()  # rank 1 has not submitted yet
    with pytest.raises(railyard.DeadlineExceededError, match="keeps running in the daemon"):
        wa.wait(0.2)  # gives up waiting; the operation goes on and can be waited on again
    assert not wa.is_completed() and wa.exception() is None
    seen = []
    wa.add_done_callback(lambda w: seen.append(w.is_completed()))
    wb = b.all_reduce(xb, async_op=True, timeout=10)
    assert wa.wait(10) is xa and wb.wait(10) is xb
    assert wa.wait(0) is xa  # again: same result
    assert xa.tolist() == [3] * 4 and xb.tolist() == [3] * 4
    assert wa.is_completed() and wa.exception() is None and wa.seq == 0 and seen == [True]
    assert "ok" in repr(wa)


def test_bfloat16_bits(pair):
    a, b = join_all(pair)
    # bfloat16 1.0 = 0x3F80, 2.0 = 0x4000, 3.0 = 0x4040
    xa = np.full(3, 0x3F80, np.uint16)
    xb = np.full(3, 0x4000, np.uint16)
    wa = a.all_reduce(xa, dtype="bfloat16", async_op=True, timeout=10)
    b.all_reduce(xb, dtype="bfloat16", timeout=10)
    wa.wait(10)
    assert xa.tolist() == [0x4040] * 3 and xb.tolist() == [0x4040] * 3


def test_int_sum_wraps(pair):
    a, b = join_all(pair)
    xa = np.full(2, 100, np.int8)
    xb = np.full(2, 100, np.int8)
    wa = a.all_reduce(xa, async_op=True, timeout=10)
    b.all_reduce(xb, timeout=10)
    wa.wait(10)
    assert xa.tolist() == [-56, -56]  # 200 - 256


def test_non_contiguous_plain_arrays(pair):
    a, b = join_all(pair)
    ma = np.arange(12, dtype=np.float32).reshape(3, 4)
    mb = np.arange(12, dtype=np.float32).reshape(3, 4) * 10
    wa = a.all_reduce(ma[:, 1], async_op=True, timeout=10)  # a strided column, in place
    b.all_reduce(mb[:, 1], timeout=10)
    wa.wait(10)
    assert ma[:, 1].tolist() == [11.0, 55.0, 99.0]
    assert ma[:, 0].tolist() == [0.0, 4.0, 8.0]  # untouched


def test_staged_arrays_of_every_layout_round_trip(pair):
    """Plain (non-shared) arrays are copied into staging buffers and back: C-contiguous ones by
    one memcpy, others through numpy. Each layout and buffer format, in and out of place."""
    a, b = join_all(pair)

    def both(make, run):
        xa, xb = make(1), make(10)
        w = run(a, xa, True)
        rb = run(b, xb, False)
        ra = w.wait(10)
        return xa, xb, ra, rb

    # Fortran order (contiguous, but not C-contiguous), in place.
    xa, xb, _, _ = both(lambda k: np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)
                                                    * k),
                        lambda c, x, w: c.all_reduce(x, async_op=w, timeout=10))
    assert xa.tolist() == xb.tolist() == (np.arange(6).reshape(2, 3) * 11.0).tolist()
    # 0-d, in place.
    xa, xb, _, _ = both(lambda k: np.array(3 * k, dtype=np.int32),
                        lambda c, x, w: c.all_reduce(x, async_op=w, timeout=10))
    assert int(xa) == int(xb) == 33
    # uint8 max, out of place into a strided output.
    outs = [np.zeros(8, dtype=np.uint8), np.zeros(8, dtype=np.uint8)]
    xs = [np.array([1, 0, 0, 7], dtype=np.uint8), np.array([0, 0, 5, 1], dtype=np.uint8)]
    w = a.all_reduce(xs[0], "max", out=outs[0][::2], async_op=True, timeout=10)
    b.all_reduce(xs[1], "max", out=outs[1][::2], timeout=10)
    w.wait(10)
    for o in outs:
        assert o[::2].tolist() == [1, 0, 5, 7] and not o[1::2].any()
    # float16 (buffer format "e"), out of place into a C-contiguous output.
    hs = [np.array([0.5, 1.5], dtype=np.float16), np.array([2.0, -1.0], dtype=np.float16)]
    hout = [np.zeros(2, dtype=np.float16), np.zeros(2, dtype=np.float16)]
    w = a.all_reduce(hs[0], out=hout[0], async_op=True, timeout=10)
    b.all_reduce(hs[1], out=hout[1], timeout=10)
    w.wait(10)
    for o in hout:
        assert o.tolist() == [2.5, 0.5]
    assert hs[0].tolist() == [0.5, 1.5]  # the input is untouched out of place
    # complex64 as bytes, all_gather out of place.
    cs = [np.array([1 + 2j], dtype=np.complex64), np.array([3 - 4j], dtype=np.complex64)]
    got = [np.zeros(2, dtype=np.complex64), np.zeros(2, dtype=np.complex64)]
    w = a.all_gather(cs[0].view(np.uint8), out=got[0].view(np.uint8), async_op=True, timeout=10)
    b.all_gather(cs[1].view(np.uint8), out=got[1].view(np.uint8), timeout=10)
    w.wait(10)
    for g in got:
        assert g.tolist() == [1 + 2j, 3 - 4j]
    # complex64 itself (not a dtype the daemon reduces): refused, and nothing is left staged.
    with pytest.raises(railyard.InvalidArgumentError):
        a.all_reduce(cs[0], timeout=10)


def test_many_async_in_flight(pair):
    a, b = join_all(pair)
    n = 50
    xs = [pair[0].empty(16, np.float32) for _ in range(n)]
    ys = [np.full(16, i, np.float32) for i in range(n)]
    for i, x in enumerate(xs):
        x[:] = i
    works = [a.all_reduce(x, async_op=True, timeout=20) for x in xs]
    for y in ys:
        b.all_reduce(y, async_op=True, timeout=20)
    for i, w in enumerate(works):
        assert w.wait(20)[0] == 2 * i
    assert [w.seq for w in works] == list(range(n))  # sequence numbers count from 0


def test_staged_operations_in_flight_share_a_few_buffers(daemon, pair):
    # Arrays not in shared memory are staged through slots of a few registered buffers: 300
    # operations in flight per rank (two sizes, each its own slot size) register two slabs
    # per session, not a buffer each (which cost 0.3-0.8 ms per operation), and every result
    # is its own operation's.
    a, b = join_all(pair)

    def buffers(c):
        return session_buffers(daemon, c)

    before = [buffers(c) for c in pair]
    n = 300
    sizes = [4 if i % 2 else 1000 for i in range(n)]
    xs = [[np.full(sizes[i], i + r, np.float32) for i in range(n)] for r in range(2)]
    works = [[comm.all_reduce(x, async_op=True, timeout=20) for x in xs[r]]
             for r, comm in enumerate((a, b))]
    for r in range(2):
        for i, w in enumerate(works[r]):
            got = w.wait(20)
            assert got.shape == (sizes[i],) and (got == 2 * i + 1).all(), (r, i, got[:4])
    assert [buffers(c) - b0 for c, b0 in zip(pair, before)] == [2, 2]
    # A second burst reuses the slots: nothing more is registered.
    for comm in (a, b):
        ws = [comm.all_reduce(np.ones(4, np.float32), async_op=True, timeout=20)
              for _ in range(200)]
    for w in ws:
        assert w.wait(20)[0] == 2.0
    assert [buffers(c) - b0 for c, b0 in zip(pair, before)] == [2, 2]


def test_staging_under_a_tight_buffer_quota_still_runs():
    # 512 KiB of buffers per session: no room for the 1 MiB slab of 64 KiB slots, so such a
    # slot gets a buffer of its own; a 1 MiB staged array is refused, naming the quota.
    d = Daemon("--max_buffer_bytes_per_session=524288")
    try:
        with railyard.connect(d.socket, job="tight") as c:
            comm = c.comm(c.new_comm_id(), 0, 1)
            x = np.arange(15000, dtype=np.float32)  # 60000 B: a 64 KiB slot
            for _ in range(3):
                np.testing.assert_array_equal(comm.all_reduce(x), x)
            assert comm.all_reduce(np.full(3, 7, np.int32)).tolist() == [7, 7, 7]
            with pytest.raises(railyard.ResourceExhaustedError,
                               match="max_buffer_bytes_per_session"):
                comm.all_reduce(np.ones(1 << 18, np.float32))
            assert comm.all_reduce(np.full(3, 2, np.int32)).tolist() == [2, 2, 2]
            comm.close()
    finally:
        d.stop()


def test_integrity_option(daemon, monkeypatch):
    monkeypatch.setenv("RAILYARD_INTEGRITY", "crc32c")
    with railyard.connect(daemon.socket, job="integrity") as c:
        assert c.integrity == "crc32c"
        x = c.empty(4, np.float32)
        x[:] = 2
        with c.comm(c.new_comm_id(), 0, 1) as comm:  # one node: nothing on the wire to check
            assert comm.all_reduce(x).tolist() == [2, 2, 2, 2]
        with pytest.raises(railyard.InvalidArgumentError, match="integrity 'md5'"):
            c.comm(c.new_comm_id(), 0, 1, integrity="md5")
    monkeypatch.setenv("RAILYARD_INTEGRITY", "sha1")
    with pytest.raises(railyard.InvalidArgumentError, match="expected 'none' or 'crc32c'"):
        railyard.connect(daemon.socket, job="integrity")
    monkeypatch.delenv("RAILYARD_INTEGRITY")
    with railyard.connect(daemon.socket, job="integrity", integrity="none") as c:
        assert c.integrity == "none"


def test_closing_between_daemons_never_waits_for_the_next_one():
    """A daemon stops (SIGTERM: its sessions are told to move) and no other comes: closing a
    communicator and releasing a buffer return at once instead of waiting out
    RAILYARD_RECONNECT_S for a daemon to tell (what the old one held went with the session)."""
    import time
    d = Daemon(node_name="pytest-closing")
    c = railyard.connect(d.socket, job="closing")
    try:
        comm = c.comm(c.new_comm_id(), 0, 1)
        arr = c.empty((1024,), np.float32)
        arr[:] = 1
        assert comm.all_reduce(arr)[0] == 1
        assert d.stop() == 0
        deadline = time.monotonic() + 10
        while not c._rebuilding and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c._rebuilding, "the client did not notice its daemon stop"
        start = time.monotonic()
        comm.close()
        del arr
        gc.collect()
        c._flush_releases()
        assert time.monotonic() - start < 5, time.monotonic() - start
    finally:
        c.close()
