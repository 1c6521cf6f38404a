"""Device memory from Python (railyard.DeviceArray, docs/gpu.md) against a real railyardd with fake
GPUs (--fake_gpus: a "device allocation" is a memfd named railyard-fake-device-<N>, which this
test maps to see what the daemon's device steps wrote) and legacy CUDA IPC allowed (--cuda_ipc;
the fake's handles name the process and descriptor that made them).
"""

from __future__ import annotations

import ctypes
import gc
import os
import struct
import threading

import numpy as np
import pytest
from conftest import Daemon
from fake_gpu import FakeDeviceMemory, FakeStream, FakeStreamOps

import railyard


@pytest.fixture(scope="module")
def gpu_daemon():
    d = Daemon("--fake_gpus=1", "--cuda_ipc", node_name="pytest-gpu")
    yield d
    d.stop()


@pytest.fixture
def fake_memory():
    """Makes FakeDeviceMemory(nbytes) objects, closed when the test ends."""
    made = []

    def make(nbytes):
        made.append(FakeDeviceMemory(nbytes))
        return made[-1]

    yield make
    for m in made:
        m.close()


def run_ranks(clients, fn, timeout=30.0):
    """fn(rank, client, comm) on one thread per client, all in one communicator; returns the
    results, raising the first error."""
    comm_id = clients[0].new_comm_id()
    results = [None] * len(clients)
    errors = []

    def rank(i):
        try:
            comm = clients[i].comm(comm_id, i, len(clients), timeout=timeout)
            results[i] = fn(i, clients[i], comm)
            comm.barrier(timeout=timeout)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def gpu_pair(gpu_daemon):
    clients = [railyard.connect(gpu_daemon.socket, job="gpu") for _ in range(2)]
    yield clients
    for c in clients:
        c.close()


def test_collectives_on_device_arrays_run_in_the_daemon_and_are_exact(gpu_pair, fake_memory):
    n = 10007
    mems = [fake_memory(3 * n * 4) for _ in range(2)]

    def rank(r, client, comm):
        mem = mems[r]
        buf = client.register_device_memory(mem.fd, mem.nbytes, 0)
        assert isinstance(buf, railyard.DeviceArray) and buf.size == 3 * n and buf.device == 0
        x, out = buf.part(0, n), buf.part(n, n)
        mem.floats(0, n)[:] = (r + 1) * (np.arange(n, dtype=np.float32) % 11)
        assert comm.all_reduce(x, out=out) is out
        np.testing.assert_array_equal(mem.floats(n * 4, n), 3 * (np.arange(n) % 11))
        np.testing.assert_array_equal(mem.floats(0, n), (r + 1) * (np.arange(n) % 11))
        comm.all_reduce(x, op="max")  # in place
        np.testing.assert_array_equal(mem.floats(0, n), 2 * (np.arange(n) % 11))
        # all_gather into the last 2n elements, as a (2, n) array.
        mem.floats(0, n)[:] = r + 1
        gathered = comm.all_gather(x, out=buf.part(n, 2 * n, shape=(2, n)))
        assert gathered.shape == (2, n)
        np.testing.assert_array_equal(mem.floats(n * 4, n), 1)
        np.testing.assert_array_equal(mem.floats(2 * n * 4, n), 2)
        # async, and the Work's result is the device array.
        work = comm.broadcast(x, root=1, async_op=True)
        assert work.wait(timeout=30) is x
        np.testing.assert_array_equal(mem.floats(0, n), 2)
        return True

    assert run_ranks(gpu_pair, rank) == [True, True]


def test_cuda_ipc_registration_at_an_offset(gpu_pair, fake_memory):
    n = 4096
    offset = 4100  # not page-aligned: as in an allocator's pool
    mems = [fake_memory(offset + 2 * n * 4) for _ in range(2)]

    def rank(r, client, comm):
        mem = mems[r]
        if r == 0:
            buf = client.register_cuda_ipc(mem.ipc_handle(), offset, 2 * n * 4, 0)
            base = offset
        else:
            buf = client.register_device_memory(mem.fd, mem.nbytes, 0)
            base = 0
        mem.floats(base, n)[:] = r + 1.0
        comm.all_reduce(buf.part(0, n), out=buf.part(n, n))
        np.testing.assert_array_equal(mem.floats(base + n * 4, n), 3.0)
        if r == 0:
            assert not mem.floats(0, 1).any()  # nothing before the registered range
        return True

    assert run_ranks(gpu_pair, rank) == [True, True]


def test_bad_device_memory_is_refused_saying_why_and_buffers_are_released(fake_memory):
    gpu_daemon = Daemon("--fake_gpus=1", "--cuda_ipc", node_name="pytest-gpu-bad")
    c = railyard.connect(gpu_daemon.socket, job="gpu-bad")
    mem = fake_memory(4096)
    try:
        with pytest.raises(railyard.InvalidArgumentError, match="device 3 is not one of the 1"):
            c.register_device_memory(mem.fd, 4096, 3)
        with pytest.raises(railyard.InvalidArgumentError, match="does not fit"):
            c.register_device_memory(mem.fd, 8192, 0)
        host = os.memfd_create("host-memory")
        os.ftruncate(host, 4096)
        with pytest.raises(railyard.InvalidArgumentError, match="not an exported device"):
            c.register_device_memory(host, 4096, 0)
        os.close(host)
        with pytest.raises(railyard.InvalidArgumentError, match="64 bytes, not 10"):
            c.register_cuda_ipc(b"0123456789", 0, 4096, 0)
        with pytest.raises(railyard.PermissionDeniedError, match="not by this session's process"):
            c.register_cuda_ipc(b"RYFKIPC1" + struct.pack("<qi", 1, mem.fd) + bytes(44), 0,
                                4096, 0)
        with pytest.raises(railyard.InvalidArgumentError, match="cannot register 0 bytes"):
            c.register_device_memory(mem.fd, 0, 0)
        with pytest.raises(railyard.InvalidArgumentError, match="not a whole number"):
            c.register_device_memory(mem.fd, 4094, 0, dtype=np.float32)
        assert gpu_daemon.status().buffers == 0
        buf = c.register_device_memory(mem.fd, 4096, 0, shape=(32, 32))
        assert buf.shape == (32, 32) and buf.nbytes == 4096
        assert gpu_daemon.status().buffers == 1
        comm = c.comm(c.new_comm_id(), 0, 1)
        # Device arrays have no host memory to allocate an output in, and cannot mix with host
        # arrays in one operation.
        with pytest.raises(railyard.InvalidArgumentError, match="pass out= for a device array"):
            comm.all_gather(buf)
        with pytest.raises(railyard.InvalidArgumentError):
            comm.all_reduce(buf, out=c.empty((32, 32)))
        with pytest.raises(ValueError):
            buf.part(1000, 100)
        # Dropping the last DeviceArray releases the buffer (at the next call).
        del buf
        gc.collect()
        c.new_comm_id()
        c.register_device_memory(mem.fd, 4096, 0)  # flushes the release first
        # It, and the pooled buffer the host array of the refused all_reduce was a part of.
        assert gpu_daemon.status().buffers == 1 + c._pool.slabs()
    finally:
        c.close()
        gpu_daemon.stop()


def test_a_daemon_without_cuda_ipc_refuses_ipc_handles(fresh_daemon):
    c = railyard.connect(fresh_daemon.socket, job="gpu-strict")
    try:
        with pytest.raises(railyard.FailedPreconditionError):
            c.register_cuda_ipc(bytes(64), 0, 4096, 0)
    finally:
        c.close()


# -- stream ordering (stream=, railyard.StreamOps) ------------------------------------------------


@pytest.fixture
def stream_pair(gpu_daemon):
    clients = [railyard.connect(gpu_daemon.socket, job="gpu-streams", stream_ops=FakeStreamOps())
               for _ in range(2)]
    yield clients
    for c in clients:
        c.close()


@pytest.mark.parametrize("fastpath", ["1", "0"], ids=["rings", "grpc"])
def test_an_operation_on_a_stream_reads_what_the_stream_wrote_and_the_stream_waits_for_it(
        gpu_daemon, fake_memory, monkeypatch, fastpath):
    monkeypatch.setenv("RAILYARD_FASTPATH", fastpath)
    clients = [railyard.connect(gpu_daemon.socket, job="gpu-streams", stream_ops=FakeStreamOps())
               for _ in range(2)]
    assert all(c.fastpath == (fastpath == "1") for c in clients)
    n = 4099
    mems = [(fake_memory(n * 4), fake_memory(n * 4)) for _ in range(2)]

    def rank(r, client, comm):
        send_mem, recv_mem = mems[r]
        send = client.register_device_memory(send_mem.fd, n * 4, 0)
        recv = client.register_device_memory(recv_mem.fd, n * 4, 0)
        recv_mem.floats()[:] = -1
        stream, go, seen = FakeStream(), threading.Event(), []

        def produce():  # the stream's earlier work: it writes the input, once told to
            assert go.wait(20)
            send_mem.floats()[:] = (r + 1) * (np.arange(n, dtype=np.float32) % 13)

        stream.put(produce)
        work = comm.all_reduce(send, out=recv, stream=stream, async_op=True)
        stream.put(lambda: seen.append(recv_mem.floats().copy()))  # the stream's later work
        # Neither rank's stream has reached the operation: it cannot have started.
        assert not work.is_completed()
        go.set()
        assert work.wait(timeout=30) is recv
        stream.finish()
        np.testing.assert_array_equal(seen[0], 3 * (np.arange(n) % 13))
        # Shared host memory on a stream too (the words order any operation), and a second
        # operation on the same stream takes the stream's next value.
        x = client.empty(8, np.float64)
        x[:] = r + 1
        stream = FakeStream()
        works = [comm.all_reduce(x, stream=stream, async_op=True) for _ in range(2)]
        for w in works:
            w.wait(timeout=30)
        stream.finish()
        np.testing.assert_array_equal(x, 6.0)  # (1 + 2), then doubled
        return True

    try:
        assert run_ranks(clients, rank) == [True, True]
    finally:
        for c in clients:
            c.close()
    assert all(len(c._stream_ops.unmapped) == 1 for c in clients)  # unmapped at close


def test_an_operation_that_fails_lets_its_stream_go(stream_pair, fake_memory):
    """However an operation on a stream ends, the stream gets past its wait: the daemon stores
    done for a failure it reports (here the other rank never comes: DEADLINE_EXCEEDED), and the
    client does when the session ends before the operation ran."""
    c0, c1 = stream_pair
    mem = fake_memory(4096)
    buf = c0.register_device_memory(mem.fd, 4096, 0)
    comm_id = c0.new_comm_id()
    comms = [None, None]
    threads = [threading.Thread(target=lambda i=i, c=c: comms.__setitem__(
        i, c.comm(comm_id, i, 2, timeout=20))) for i, c in enumerate(stream_pair)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stream, after = FakeStream(), []
    work = comms[0].all_reduce(buf, stream=stream, async_op=True, timeout=0.3)
    stream.put(lambda: after.append(True))
    with pytest.raises(railyard.DeadlineExceededError):
        work.wait(timeout=30)
    stream.finish()
    assert after == [True]

    # Held for a stream that has not reached it, then the session ends: the client lets the
    # stream go when the operation fails.
    stream, go, after = FakeStream(), threading.Event(), []
    stream.put(lambda: go.wait(20))
    work = comms[0].all_reduce(buf, stream=stream, async_op=True)
    stream.put(lambda: after.append(True))
    c0.close()
    with pytest.raises(railyard.RailyardError):
        work.wait(timeout=30)
    go.set()
    stream.finish()
    assert after == [True]


def test_stream_arguments_that_cannot_work_are_refused_before_anything_is_enqueued(
        stream_pair, fake_memory):
    c = stream_pair[0]
    comm = c.comm(c.new_comm_id(), 0, 1)
    stream = FakeStream()
    with pytest.raises(railyard.InvalidArgumentError, match="pass async_op=True"):
        comm.all_reduce(c.empty(4), stream=stream)
    with pytest.raises(railyard.InvalidArgumentError, match="before the stream has produced it"):
        comm.all_reduce(np.ones(4, np.float32), stream=stream, async_op=True)
    stream.finish()  # nothing was enqueued: nothing waits
    assert c._stream_words is None or not c._stream_words._streams


def test_the_ring_entry_carries_the_stream_sync_in_its_last_extension_slot():
    from railyard import _ring
    out = bytearray()
    _ring.Rings.encode(out, 7, 3, _ring.ALL_TO_ALL_V, 1, 0, 0, 0, (1, 0), (2, 0), 0, "", False,
                       ([1] * 5, [0] * 5, [1] * 5, [0] * 5), stream_sync=(9, 16, 42))
    vec_slots = _ring.ext_slots_for(5)
    assert len(out) == (2 + vec_slots) * _ring.SQ_ENTRY
    flags, ext = struct.unpack_from("<II", out, 76)
    assert flags == _ring.FLAG_STREAM_SYNC and ext == vec_slots + 1
    assert struct.unpack_from("<QQI", out, (1 + vec_slots) * _ring.SQ_ENTRY) == (9, 16, 42)


def test_without_a_cuda_driver_a_stream_is_refused_saying_so(gpu_daemon):
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this node has a CUDA driver (tests/cuda covers the real path)")
    except OSError:
        pass
    c = railyard.connect(gpu_daemon.socket, job="gpu-nocuda")
    try:
        comm = c.comm(c.new_comm_id(), 0, 1)
        with pytest.raises(railyard.FailedPreconditionError, match="no CUDA driver"):
            comm.all_reduce(c.empty(4), stream=1, async_op=True)
    finally:
        c.close()


def test_stream_words_count_up_per_stream_wrap_and_a_release_only_moves_done_forward():
    from railyard import _streams
    words = np.zeros(_streams.STREAMS_BYTES, np.uint8)
    ops = FakeStreamOps()
    sw = _streams.StreamWords(words, buffer_id=5, offset=4096, ops=ops)
    a, b = FakeStream(), FakeStream()
    s1, s2, t1 = sw.enqueue(a), sw.enqueue(a), sw.enqueue(b)
    assert (s1.buffer_id, s1.offset, s1.value) == (5, 4096, 1)
    assert (s2.offset, s2.value) == (4096, 2)  # the same stream: its next value
    assert (t1.offset, t1.value) == (4096 + 8, 1)  # another stream: its own words
    u32 = words.view(np.uint32)
    s2.release()  # done jumps to 2 (both of a's waits pass)
    assert u32[1] == 2
    s1.release()  # never backwards
    assert u32[1] == 2
    t1.release()
    assert u32[3] == 1
    a.finish()
    b.finish()
    assert u32[0] == 2 and u32[2] == 1  # the streams stored ready
    # Near the wrap: values compare as int32 differences. (a's thread has ended: what this
    # enqueues on it does not run; the slot is what is checked.)
    sw._streams[ops.key(a)][1] = 0xFFFFFFFF
    w = sw.enqueue(a)
    assert w.value == 0
    u32[1] = 0xFFFFFFFF
    w.release()
    assert u32[1] == 0  # 0 is after 0xFFFFFFFF
    sw.close()
    assert ops.unmapped == [words.__array_interface__["data"][0]]
