"""Stream ordering (docs/gpu.md, "Stream ordering"): a collective put in order on an accelerator's
stream, as NCCL users expect, by the protocol the C++ client speaks.

For an operation given ``stream=``, the client enqueues on that stream a store of the stream's
next value into its *ready* word and, after it, a wait for its *done* word to reach that value;
both words live in one 4 KiB buffer of host memory shared with the daemon (8 bytes per stream).
The daemon starts the operation once *ready* holds the value and stores it into *done* however
the operation ends. Work the stream ran before the call is therefore done before the operation
reads its buffers, and work enqueued after the call waits for its results, without a host wait.

How the stream is driven is a :class:`StreamOps`: CUDA's (:class:`CudaStreamOps`, the default:
``cuMemHostRegister`` with DEVICEMAP, ``cuStreamWriteValue32``, ``cuStreamWaitValue32`` GEQ,
through ``libcuda.so.1``), or another one given to :func:`railyard.connect` (another
accelerator's runtime; the tests' stream, a thread).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Dict, Hashable, Optional

import numpy as np

STREAMS_BYTES = 4096  # 512 streams
_CU_MEMHOSTREGISTER_PORTABLE = 1
_CU_MEMHOSTREGISTER_DEVICEMAP = 2
_CU_STREAM_WAIT_VALUE_GEQ = 0


class StreamOps:
    """How a client puts work on an accelerator's streams. Every method raises (any exception)
    when it cannot do what it says; the client reports it as the operation's error."""

    def key(self, stream: Any) -> Hashable:
        """The identity of ``stream``: operations on streams with one key share its words."""
        return stream

    def map_host_words(self, address: int, nbytes: int) -> int:
        """Makes host memory ``[address, address + nbytes)`` storable and waitable from streams;
        returns the address streams use for ``address``."""
        raise NotImplementedError

    def unmap_host_words(self, address: int) -> None:
        """Undoes :meth:`map_host_words`."""
        raise NotImplementedError

    def write_value(self, stream: Any, addr: int, value: int) -> None:
        """Enqueues on ``stream``: store the u32 ``value`` at ``addr`` (a mapped address), after
        what is before it."""
        raise NotImplementedError

    def wait_value(self, stream: Any, addr: int, value: int) -> None:
        """Enqueues on ``stream``: nothing after it runs until ``(int32)(*addr - value) >= 0``."""
        raise NotImplementedError


class CudaStreamOps(StreamOps):
    """CUDA's stream memory operations through the driver library (``libcuda.so.1``). A stream
    is a ``CUstream`` handle (an int), or an object with ``cuda_stream`` (``torch.cuda.Stream``)
    or ``ptr`` (CuPy's)."""

    def __init__(self) -> None:
        try:
            self._cu = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise OSError(f"no CUDA driver (libcuda.so.1: {e}): operations cannot be ordered "
                          "on a CUDA stream (give connect(stream_ops=...) another StreamOps)"
                          ) from None
        self._check("cuInit", self._cu.cuInit(ctypes.c_uint(0)))

        def fn(*names: str) -> Any:
            for name in names:
                f = getattr(self._cu, name, None)
                if f is not None:
                    return f
            raise OSError(f"this CUDA driver has none of {', '.join(names)}")

        self._write = fn("cuStreamWriteValue32_v2", "cuStreamWriteValue32")
        self._wait = fn("cuStreamWaitValue32_v2", "cuStreamWaitValue32")
        self._register = fn("cuMemHostRegister_v2", "cuMemHostRegister")
        self._device_pointer = fn("cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer")

    def _check(self, what: str, result: int) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            self._cu.cuGetErrorName(result, ctypes.byref(name))
            raise OSError(f"{what}: {(name.value or b'CUDA error').decode()} ({result})")

    def key(self, stream: Any) -> Hashable:
        return self._handle(stream)

    @staticmethod
    def _handle(stream: Any) -> int:
        for attr in ("cuda_stream", "ptr"):
            if hasattr(stream, attr):
                return int(getattr(stream, attr))
        if isinstance(stream, int):
            return stream
        raise TypeError(f"stream must be a CUstream handle (an int), or an object with "
                        f"cuda_stream or ptr, not {type(stream).__name__}")

    def map_host_words(self, address: int, nbytes: int) -> int:
        # The driver calls need a context: the primary one of the current device (device 0 when
        # this thread has none).
        ctx = ctypes.c_void_p()
        self._check("cuCtxGetCurrent", self._cu.cuCtxGetCurrent(ctypes.byref(ctx)))
        if not ctx.value:
            dev = ctypes.c_int()
            self._check("cuDeviceGet", self._cu.cuDeviceGet(ctypes.byref(dev), 0))
            self._check("cuDevicePrimaryCtxRetain",
                        self._cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
            self._check("cuCtxSetCurrent", self._cu.cuCtxSetCurrent(ctx))
        self._check("cuMemHostRegister", self._register(
            ctypes.c_void_p(address), ctypes.c_size_t(nbytes),
            ctypes.c_uint(_CU_MEMHOSTREGISTER_DEVICEMAP | _CU_MEMHOSTREGISTER_PORTABLE)))
        mapped = ctypes.c_uint64()
        result = self._device_pointer(ctypes.byref(mapped), ctypes.c_void_p(address),
                                      ctypes.c_uint(0))
        if result != 0:
            self._cu.cuMemHostUnregister(ctypes.c_void_p(address))
            self._check("cuMemHostGetDevicePointer", result)
        return mapped.value

    def unmap_host_words(self, address: int) -> None:
        self._cu.cuMemHostUnregister(ctypes.c_void_p(address))

    def write_value(self, stream: Any, addr: int, value: int) -> None:
        self._check("cuStreamWriteValue32", self._write(
            ctypes.c_void_p(self._handle(stream)), ctypes.c_uint64(addr), ctypes.c_uint32(value),
            ctypes.c_uint(0)))

    def wait_value(self, stream: Any, addr: int, value: int) -> None:
        self._check("cuStreamWaitValue32", self._wait(
            ctypes.c_void_p(self._handle(stream)), ctypes.c_uint64(addr), ctypes.c_uint32(value),
            ctypes.c_uint(_CU_STREAM_WAIT_VALUE_GEQ)))


class Slot:
    """One operation's place on its stream: what its request carries, and its done word."""

    __slots__ = ("buffer_id", "offset", "value", "_words", "_index")

    def __init__(self, buffer_id: int, offset: int, value: int, words: np.ndarray,
                 index: int) -> None:
        self.buffer_id = buffer_id
        self.offset = offset
        self.value = value
        self._words = words
        self._index = index

    def release(self) -> None:
        """Lets the stream go past the operation (done = value, unless it is there already): for
        an operation that ends without the daemon storing done (refused before it got there, or
        its session ended). The daemon only ever moves done forward and stores an operation's
        value only after the stream stored ready for it, which the stream does only once done
        reached the value before it: no store here can pass one of the daemon's."""
        word = self._words[self._index:self._index + 1]
        if ((int(word[0]) - self.value) & 0xFFFFFFFF) >= 0x80000000:
            word[0] = self.value


class StreamWords:
    """The ready/done words of the streams a client orders operations on: one buffer of
    :data:`STREAMS_BYTES` shared with the daemon, 8 bytes per stream, each stream's values
    counting up from 1 (wrapping; compared as ``(int32)(word - value)``)."""

    def __init__(self, array: np.ndarray, buffer_id: int, offset: int, ops: StreamOps) -> None:
        self._array = array  # client.empty's: shared with the daemon
        self._words = array.view(np.uint32)
        self._address = array.__array_interface__["data"][0]
        self._buffer_id = buffer_id
        self._offset = offset
        self._ops = ops
        self._mapped = ops.map_host_words(self._address, STREAMS_BYTES)
        self._lock = threading.Lock()
        self._streams: Dict[Hashable, list] = {}  # key -> [index, last value]
        self._closed = False

    def enqueue(self, stream: Any) -> Slot:
        """Takes the stream's next value and enqueues on it the store of ready and the wait for
        done (under one lock, so that threads sharing a stream enqueue their values in order)."""
        with self._lock:
            if self._closed:
                raise OSError("the client is closed")
            key = self._ops.key(stream)
            s = self._streams.get(key)
            if s is None:
                if len(self._streams) >= STREAMS_BYTES // 8:
                    raise OverflowError(f"this client already orders operations on "
                                        f"{len(self._streams)} streams (the most)")
                s = self._streams[key] = [len(self._streams), 0]
            value = (s[1] + 1) & 0xFFFFFFFF
            offset = s[0] * 8
            self._ops.write_value(stream, self._mapped + offset, value)
            # The store of ready is enqueued from here: the stream's next value goes on from
            # this one whatever happens next.
            s[1] = value
            self._ops.wait_value(stream, self._mapped + offset + 4, value)
            return Slot(self._buffer_id, self._offset + offset, value, self._words,
                        offset // 4 + 1)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._ops.unmap_host_words(self._address)


def make_stream_words(client: Any, ops: Optional[StreamOps]) -> StreamWords:
    """The client's stream words: a shared buffer of its own, mapped for ``ops`` (default
    :class:`CudaStreamOps`)."""
    if ops is None:
        ops = CudaStreamOps()
    array = client.empty(STREAMS_BYTES, np.uint8)
    array[:] = 0
    where = client._locate(array)
    assert where is not None  # client.empty's arrays are shared
    return StreamWords(array, where[0], where[1], ops)
