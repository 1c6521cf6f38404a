"""Fakes of a GPU for the Python tests, beside the interfaces they stand in for: device memory
as railyardd --fake_gpus sees it (a memfd named railyard-fake-device-<N>, mapped here to see what
the daemon's device steps wrote), and a stream (work run in order on a thread) with the
railyard.StreamOps that drives it.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import queue
import struct
import threading
import time

import numpy as np

import railyard


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


class FakeStream:
    """A stream as CUDA runs one: its work in order, on its own thread (here: Python callables)."""

    def __init__(self):
        self._queue = queue.Queue()
        self.errors = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def put(self, fn):
        self._queue.put(fn)

    def _run(self):
        while True:
            fn = self._queue.get()
            if fn is None:
                return
            try:
                fn()
            except Exception as e:  # noqa: BLE001
                self.errors.append(e)

    def finish(self, timeout=30.0):
        """Waits until everything put so far has run, then ends the stream."""
        self._queue.put(None)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream is still waiting"
        assert not self.errors, self.errors


class FakeStreamOps(railyard.StreamOps):
    """StreamOps for FakeStream: host addresses as they are, stores and waits as stream work."""

    def __init__(self):
        self.unmapped = []

    def map_host_words(self, address, nbytes):
        return address

    def unmap_host_words(self, address):
        self.unmapped.append(address)

    def write_value(self, stream, addr, value):
        def store():
            ctypes.c_uint32.from_address(addr).value = value
        stream.put(store)

    def wait_value(self, stream, addr, value):
        def wait():
            deadline = time.monotonic() + 20
            word = ctypes.c_uint32.from_address(addr)
            while ((word.value - value) & 0xFFFFFFFF) >= 0x80000000:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the done word stayed at {word.value}, below {value}")
                time.sleep(1e-4)
        stream.put(wait)
