"""The Python client on a real GPU (scripts/device-check.sh runs this; without a CUDA driver and a
device every test skips, saying why): device memory from cuMemAlloc registered by legacy CUDA IPC
(a daemon with --cuda_ipc), and a collective ordered on a real CUDA stream through
railyard.CudaStreamOps, both ways: the operation reads what the stream copied in before it (the
stream held back on a host word until both ranks have submitted), and the stream's later copy
reads its result. CUDA is driven through the driver library by ctypes, as the client does.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest
from conftest import Daemon

import railyard

c_u64, c_size, c_ptr = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p


class Cuda:
    """The few driver calls the test needs, each checked."""

    def __init__(self) -> None:
        try:
            self.cu = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            pytest.skip(f"no CUDA driver here (libcuda.so.1: {e})")
        if self.cu.cuInit(0) != 0:
            pytest.skip("cuInit failed: no usable CUDA device")
        count = ctypes.c_int()
        if self.cu.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
            pytest.skip("no CUDA device")
        dev, ctx = ctypes.c_int(), c_ptr()
        self.check("cuDeviceGet", self.cu.cuDeviceGet(ctypes.byref(dev), 0))
        self.check("cuDevicePrimaryCtxRetain",
                   self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        self.ctx = ctx
        self.enter()

    def enter(self) -> None:
        """Makes the primary context current on this thread."""
        self.check("cuCtxSetCurrent", self.cu.cuCtxSetCurrent(self.ctx))

    def check(self, what: str, result: int) -> None:
        assert result == 0, f"{what} returned CUDA error {result}"

    def alloc(self, nbytes: int) -> int:
        p = c_u64()
        self.check("cuMemAlloc", self.cu.cuMemAlloc_v2(ctypes.byref(p), c_size(nbytes)))
        return p.value

    def ipc_handle(self, ptr: int) -> bytes:
        handle = (ctypes.c_char * 64)()
        self.check("cuIpcGetMemHandle", self.cu.cuIpcGetMemHandle(handle, c_u64(ptr)))
        return bytes(handle)

    def upload(self, ptr: int, arr: np.ndarray) -> None:
        self.check("cuMemcpyHtoD", self.cu.cuMemcpyHtoD_v2(
            c_u64(ptr), c_ptr(arr.ctypes.data), c_size(arr.nbytes)))

    def download(self, arr: np.ndarray, ptr: int) -> None:
        self.check("cuMemcpyDtoH", self.cu.cuMemcpyDtoH_v2(
            c_ptr(arr.ctypes.data), c_u64(ptr), c_size(arr.nbytes)))

    def stream(self) -> int:
        s = c_ptr()
        self.check("cuStreamCreate", self.cu.cuStreamCreate(ctypes.byref(s), 0))
        return s.value

    def upload_async(self, ptr: int, arr: np.ndarray, stream: int) -> None:
        self.check("cuMemcpyHtoDAsync", self.cu.cuMemcpyHtoDAsync_v2(
            c_u64(ptr), c_ptr(arr.ctypes.data), c_size(arr.nbytes), c_ptr(stream)))

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self.check("cuMemcpyDtoDAsync", self.cu.cuMemcpyDtoDAsync_v2(
            c_u64(dst), c_u64(src), c_size(nbytes), c_ptr(stream)))

    def pin(self, arr: np.ndarray) -> int:
        """Page-locks arr (an async copy from it is then truly async: a pageable one may block
        the host until the stream gets there) and returns its device address."""
        dptr = c_u64()
        self.check("cuMemHostRegister", self.cu.cuMemHostRegister_v2(
            c_ptr(arr.ctypes.data), c_size(arr.nbytes), ctypes.c_uint(3)))  # PORTABLE|DEVICEMAP
        self.check("cuMemHostGetDevicePointer", self.cu.cuMemHostGetDevicePointer_v2(
            ctypes.byref(dptr), c_ptr(arr.ctypes.data), ctypes.c_uint(0)))
        return dptr.value

    def hold_until(self, stream: int, word: np.ndarray) -> None:
        """Enqueues on stream: wait until the host sets word[0] to 1."""
        dptr = c_u64(self.pin(word))
        wait = getattr(self.cu, "cuStreamWaitValue32_v2", None) or self.cu.cuStreamWaitValue32
        self.check("cuStreamWaitValue32", wait(c_ptr(stream), dptr, ctypes.c_uint32(1),
                                               ctypes.c_uint(0)))  # GEQ

    def synchronize(self, stream: int) -> None:
        self.check("cuStreamSynchronize", self.cu.cuStreamSynchronize(c_ptr(stream)))


def test_a_collective_on_a_real_cuda_stream_is_ordered_both_ways():
    cuda = Cuda()
    daemon = Daemon("--cuda_ipc", node_name="pytest-cuda")
    clients = [railyard.connect(daemon.socket, job="cuda-python") for _ in range(2)]
    n = 1 << 20
    try:
        comm_id = clients[0].new_comm_id()
        results, errors = [None, None], []

        def rank(r: int) -> None:
            try:
                cuda.enter()
                c = clients[r]
                send, recv, copy = (cuda.alloc(n * 4) for _ in range(3))
                cuda.upload(recv, np.full(n, -1.0, np.float32))
                cuda.upload(send, np.zeros(n, np.float32))
                dsend = c.register_cuda_ipc(cuda.ipc_handle(send), 0, n * 4, 0)
                drecv = c.register_cuda_ipc(cuda.ipc_handle(recv), 0, n * 4, 0)
                comm = c.comm(comm_id, r, 2, timeout=60)
                stream = cuda.stream()
                go = np.zeros(1024, np.uint32)  # a page: the stream waits for go[0] == 1
                cuda.hold_until(stream, go)
                data = (r + 1) * (np.arange(n, dtype=np.float32) % 17)
                cuda.pin(data)
                cuda.upload_async(send, data, stream)
                work = comm.all_reduce(dsend, out=drecv, stream=stream, async_op=True)
                cuda.copy_async(copy, recv, n * 4, stream)
                assert not work.is_completed()  # neither stream has reached it
                go[0] = 1
                work.wait(timeout=60)
                cuda.synchronize(stream)
                got = np.empty(n, np.float32)
                cuda.download(got, copy)
                results[r] = got
                comm.barrier(timeout=60)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        for r in range(2):
            np.testing.assert_array_equal(results[r], 3 * (np.arange(n) % 17))
    finally:
        for c in clients:
            c.close()
        daemon.stop()
