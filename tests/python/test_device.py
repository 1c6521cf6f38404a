"""Device memory from Python (railyard.DeviceArray, docs/gpu.md) against a real railyardd with fake
GPUs (--fake_gpus: a "device allocation" is a memfd named railyard-fake-device-<N>, which this
test maps to see what the daemon's device steps wrote) and legacy CUDA IPC allowed (--cuda_ipc;
the fake's handles name the process and descriptor that made them).
"""

from __future__ import annotations

import gc
import mmap
import os
import struct
import threading

import numpy as np
import pytest
from conftest import Daemon

import railyard


@pytest.fixture(scope="module")
def gpu_daemon():
    d = Daemon("--fake_gpus=1", "--cuda_ipc", node_name="pytest-gpu")
    yield d
    d.stop()


class FakeDeviceMemory:
    """A fake device allocation and a host view of it (what cudaMemcpy would show)."""

    def __init__(self, nbytes, device=0):
        self.fd = os.memfd_create(f"railyard-fake-device-{device}")
        os.ftruncate(self.fd, nbytes)
        self.map = mmap.mmap(self.fd, nbytes)
        self.nbytes = nbytes

    def floats(self, offset=0, count=None):
        count = (self.nbytes - offset) // 4 if count is None else count
        return np.frombuffer(self.map, dtype=np.float32, count=count, offset=offset)

    def ipc_handle(self):
        return b"RYFKIPC1" + struct.pack("<qi", os.getpid(), self.fd) + bytes(44)

    def close(self):
        self.map.close()
        os.close(self.fd)


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
        assert gpu_daemon.status().buffers == 1
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
