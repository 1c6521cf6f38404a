"""Small arrays carved from larger registered buffers.

Each registered buffer costs the daemon one memory mapping, and the daemon gives each job a share
of the mappings the kernel allows (``vm.max_map_count``; railyardd's ``--max_mappings_per_job``):
a program that made thousands of small arrays with :meth:`railyard.Client.empty` one buffer each
would meet it. Arrays of at most :data:`MAX_POOLED` bytes are instead chunks of
:data:`SLAB_BYTES` slabs, one size class (a power of two) per slab, each chunk registered as a
part of its slab (``RegisterBufferRequest.parent_buffer_id``: an id of its own whose bounds the
daemon checks, without a mapping of its own). A chunk is released and goes back to its slab when
the array and every view of it are gone; slabs live as long as the client.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Dict, List, Tuple

import numpy as np

MAX_POOLED = 256 << 10
SLAB_BYTES = 4 << 20
MIN_CHUNK = 256


class _Slab:
    __slots__ = ("mapping", "chunk", "free")

    def __init__(self, mapping, chunk: int) -> None:
        self.mapping = mapping
        self.chunk = chunk
        # Offsets free for taking; the first chunk goes to the caller that made the slab.
        self.free: List[int] = list(range(SLAB_BYTES - chunk, 0, -chunk))


def pooled(nbytes: int) -> bool:
    return 0 < nbytes <= MAX_POOLED


class Pool:
    """``allocate(size)`` registers a new buffer and returns its mapping (``Client._allocate``);
    ``register_part(mapping, offset, nbytes, owner)`` registers a chunk of it and returns the
    part's buffer id, which is released once ``owner`` is gone (``Client._register_part``)."""

    def __init__(self, allocate: Callable[[int], object],
                 register_part: Callable[[object, int, int, object], int]) -> None:
        self._allocate = allocate
        self._register_part = register_part
        self._lock = threading.Lock()
        self._slabs: Dict[int, List[_Slab]] = {}

    def array(self, nbytes: int, dtype: np.dtype, count: int) -> np.ndarray:
        """A 1-D array of ``count`` ``dtype`` elements (``nbytes`` bytes) in a pooled chunk."""
        chunk = max(MIN_CHUNK, 1 << (nbytes - 1).bit_length())
        slab, offset = self._take(chunk)
        try:
            arr = np.frombuffer(memoryview(slab.mapping)[offset:offset + nbytes], dtype=dtype,
                                count=count)
            # arr.base is the buffer numpy exported from: it lives while arr or any view does.
            self._register_part(slab.mapping, offset, nbytes, arr.base)
        except BaseException:
            slab.free.append(offset)
            raise
        weakref.finalize(arr.base, slab.free.append, offset)
        return arr

    def slabs(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._slabs.values())

    def _take(self, chunk: int) -> Tuple[_Slab, int]:
        with self._lock:
            for slab in self._slabs.get(chunk, ()):
                if slab.free:
                    return slab, slab.free.pop()
        # A round trip to the daemon: outside the lock.
        slab = _Slab(self._allocate(SLAB_BYTES), chunk)
        with self._lock:
            self._slabs.setdefault(chunk, []).append(slab)
        return slab, 0
