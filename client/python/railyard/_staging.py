"""Staging: the shared memory an operation's arrays that are not in shared memory are copied
through (docs/local-api.md, "Buffers").

Every piece is a :class:`Slot`, an offset into a registered buffer. Pieces of up to
:data:`SLAB_SLOT_MAX` bytes are carved from slabs, buffers registered once and cut into slots of
one power-of-two size: registering a buffer costs a memfd, a descriptor passed to the daemon and
an RPC (~0.3-0.8 ms), so a slot per operation in flight, all from one registration, is what
keeps many small operations in flight (a loop of ``async_op=True`` calls) at the cost of one.
Their slots are kept until the client closes: as many as were in flight at once, rounded up to
whole slabs. Larger pieces are buffers of their own, kept for reuse up to :func:`keep_count` of
each size (64 ``async_op=True`` all_reduces of 256 KiB in one process: 63-73 us each, against
1.1-2.7 ms with 4 kept, when all but 4 were registered for their operation).
"""

from __future__ import annotations

import threading
from typing import Callable, Dict, List

from . import _memfd

#: The smallest slot: the alignment of every slot, enough for any element type.
SLOT_MIN = 256
#: Slots up to this size come from slabs; larger ones are buffers of their own.
SLAB_SLOT_MAX = 64 << 10
#: A slab holds this many bytes (at least one slot)...
SLAB_BYTES = 1 << 20
#: ...or, for small slots, this many slots (so that a few 4 B operations take 64 KiB, not 1 MiB).
SLAB_SLOTS_MIN = 256
#: Free buffers of their own (larger than SLAB_SLOT_MAX) kept per size: as many as fit in
#: KEEP_BYTES_PER_SIZE, and at least KEEP_PER_SIZE.
KEEP_PER_SIZE = 4
KEEP_BYTES_PER_SIZE = 32 << 20


def keep_count(size: int) -> int:
    """How many free buffers of their own of ``size`` bytes the pool keeps."""
    return max(KEEP_PER_SIZE, KEEP_BYTES_PER_SIZE // size)


class Slot:
    """``size`` bytes at ``offset`` in a registered buffer: ``buffer_id`` for the daemon,
    ``address`` in this process."""

    __slots__ = ("mapping", "offset", "size", "address", "buffer_id")

    def __init__(self, mapping: _memfd.Mapping, offset: int, size: int) -> None:
        self.mapping = mapping  # keeps the buffer registered while the slot exists
        self.offset = offset
        self.size = size
        self.address = mapping.address + offset
        self.buffer_id = mapping.buffer_id

    def view(self, nbytes: int) -> memoryview:
        """The slot's first ``nbytes`` (at most its size) as a writable byte view."""
        if not 0 <= nbytes <= self.size:
            raise ValueError(f"{nbytes} bytes do not fit a staging slot of {self.size}")
        return memoryview(self.mapping)[self.offset:self.offset + nbytes]


def size_class(nbytes: int) -> int:
    """The slot size that holds ``nbytes``: a power of two, at least :data:`SLOT_MIN`."""
    return max(SLOT_MIN, 1 << max(0, (nbytes - 1).bit_length()))


def slab_bytes(size: int) -> int:
    """Bytes of one slab of slots of ``size`` (a size class up to :data:`SLAB_SLOT_MAX`)."""
    return max(size, min(SLAB_BYTES, size * SLAB_SLOTS_MIN))


class Pool:
    """Free slots by size, and where new ones come from: ``allocate(size)`` registers a buffer of
    ``size`` bytes with the daemon and returns its mapping (called without the pool's lock: it
    is an RPC, and it raises what the registration raised). Thread-safe."""

    def __init__(self, allocate: Callable[[int], _memfd.Mapping]) -> None:
        self._allocate = allocate
        self._lock = threading.Lock()
        self._free: Dict[int, List[Slot]] = {}
        self._closed = False

    def acquire(self, nbytes: int) -> Slot:
        """A slot of at least ``nbytes``: a free one, else one of a new slab, else (above
        :data:`SLAB_SLOT_MAX`) a new buffer of its own."""
        size = size_class(nbytes)
        with self._lock:
            free = self._free.get(size)
            if free:
                return free.pop()
        if size > SLAB_SLOT_MAX:
            return Slot(self._allocate(size), 0, size)
        try:
            mapping = self._allocate(slab_bytes(size))
        except Exception:
            if slab_bytes(size) == size:
                raise
            # No room for a slab (a tight --max_buffer_bytes_per_session): a buffer of just the
            # slot, as every staged operation had before slabs; its error is the one to raise.
            mapping = self._allocate(size)
        slots = [Slot(mapping, offset, size) for offset in range(0, len(mapping), size)]
        with self._lock:
            if not self._closed:
                self._free.setdefault(size, []).extend(slots[1:])
        return slots[0]

    def release(self, slot: Slot) -> None:
        """``slot`` is free again (the daemon is done with it). A slab's slot is kept; a buffer
        of its own beyond :func:`keep_count` of its size is dropped, and unregistered once
        nothing refers to it."""
        with self._lock:
            if self._closed:
                return
            free = self._free.setdefault(slot.size, [])
            if slot.size <= SLAB_SLOT_MAX or len(free) < keep_count(slot.size):
                free.append(slot)

    def close(self) -> None:
        """Drops every free slot; later releases drop theirs."""
        with self._lock:
            self._closed = True
            self._free.clear()

    def free_slots(self, size: int) -> int:
        with self._lock:
            return len(self._free.get(size, ()))
