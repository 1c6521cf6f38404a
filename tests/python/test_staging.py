"""railyard._staging.Pool, the client's staging slots, over a fake registration: real memfd
mappings that no daemon sees, numbered as the daemon would number them."""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
import pytest

from railyard import _memfd, _staging


class FakeRegistry:
    """Stands in for Client._allocate: maps a real memfd and gives it the next buffer id."""

    def __init__(self) -> None:
        self.sizes = []
        self.refused = []
        self.max_bytes = None  # refuse registrations larger than this (a tight quota)
        self.fail = 0  # refuse the next this many registrations

    def allocate(self, size: int) -> _memfd.Mapping:
        if self.fail or (self.max_bytes is not None and size > self.max_bytes):
            self.fail = max(0, self.fail - 1)
            self.refused.append(size)
            raise OSError(f"RESOURCE_EXHAUSTED: {size} bytes: --max_buffer_bytes_per_session")
        mapping, fd = _memfd.create("staging-test", size)
        os.close(fd)
        self.sizes.append(size)
        mapping.buffer_id = len(self.sizes)
        mapping.address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        return mapping


@pytest.fixture
def reg():
    return FakeRegistry()


def test_size_classes():
    assert [_staging.size_class(n) for n in (1, 4, 256, 257, 4000, 65536, 65537)] == \
        [256, 256, 256, 512, 4096, 65536, 131072]
    assert _staging.slab_bytes(256) == 64 << 10  # 256 slots
    assert _staging.slab_bytes(4096) == 1 << 20
    assert _staging.slab_bytes(65536) == 1 << 20  # 16 slots
    assert _staging.keep_count(128 << 10) == 256 and _staging.keep_count(64 << 20) == 4


def test_small_slots_in_flight_come_from_one_registration(reg):
    pool = _staging.Pool(reg.allocate)
    slots = [pool.acquire(4) for _ in range(256)]
    assert reg.sizes == [64 << 10]  # one slab for 256 operations in flight
    assert {s.buffer_id for s in slots} == {1}
    offsets = sorted(s.offset for s in slots)
    assert offsets == list(range(0, 64 << 10, 256))  # disjoint, aligned, covering the slab
    assert all(s.address == slots[0].address - slots[0].offset + s.offset for s in slots)
    # Each slot's bytes are its own: write a distinct value through every slot, read them back.
    for i, s in enumerate(slots):
        s.view(4)[:] = np.uint32(i).tobytes()
    for i, s in enumerate(slots):
        assert np.frombuffer(s.view(4), np.uint32)[0] == i
    extra = pool.acquire(100)  # the 257th in flight: a second slab
    assert reg.sizes == [64 << 10, 64 << 10] and extra.buffer_id == 2
    assert pool.free_slots(256) == 255


def test_released_slots_are_reused_without_registering(reg):
    pool = _staging.Pool(reg.allocate)
    a = pool.acquire(1000)
    pool.release(a)
    b = pool.acquire(1024)  # the same size class
    assert b is a and reg.sizes == [256 << 10]  # 256 slots of 1 KiB
    c = pool.acquire(2048)  # another class: its own slab
    assert c.size == 2048 and reg.sizes == [256 << 10, 512 << 10]


def test_large_pieces_are_buffers_of_their_own_and_a_bounded_few_are_kept(reg):
    pool = _staging.Pool(reg.allocate)
    size = 64 << 20
    big = [pool.acquire(size - 5) for _ in range(6)]
    assert reg.sizes == [size] * 6 and all(s.offset == 0 and s.size == size for s in big)
    for s in big:
        pool.release(s)
    assert pool.free_slots(size) == _staging.KEEP_PER_SIZE  # the other two are dropped
    again = pool.acquire(size)
    assert again in big and len(reg.sizes) == 6


def test_view_refuses_more_than_the_slot(reg):
    pool = _staging.Pool(reg.allocate)
    s = pool.acquire(10)
    assert len(s.view(256)) == 256
    with pytest.raises(ValueError, match="do not fit a staging slot of 256"):
        s.view(257)


def test_a_failed_registration_is_the_callers_error_and_costs_nothing(reg):
    pool = _staging.Pool(reg.allocate)
    reg.fail = 2  # the slab, then the single slot
    with pytest.raises(OSError, match="RESOURCE_EXHAUSTED: 256 bytes"):
        pool.acquire(8)
    assert reg.refused == [64 << 10, 256] and pool.free_slots(256) == 0
    assert pool.acquire(8).buffer_id == 1  # the next registration works


def test_without_room_for_a_slab_a_slot_gets_a_buffer_of_its_own(reg):
    pool = _staging.Pool(reg.allocate)
    reg.max_bytes = 100 << 10  # room for a 64 KiB slot, not for its 1 MiB slab
    a = pool.acquire(60000)
    assert reg.refused == [1 << 20] and reg.sizes == [64 << 10]
    assert (a.offset, a.size, len(a.mapping)) == (0, 64 << 10, 64 << 10)
    pool.release(a)
    assert pool.acquire(65536) is a and reg.sizes == [64 << 10]
    small = pool.acquire(4)  # a 64 KiB slab of 256 B slots fits
    assert reg.sizes == [64 << 10, 64 << 10] and small.size == 256
    assert pool.free_slots(256) == 255


def test_close_drops_free_slots_and_later_releases(reg):
    pool = _staging.Pool(reg.allocate)
    held = pool.acquire(8)
    pool.close()
    assert pool.free_slots(256) == 0
    pool.release(held)
    assert pool.free_slots(256) == 0


def test_concurrent_acquires_never_share_a_slot(reg):
    pool = _staging.Pool(reg.allocate)
    got = [[] for _ in range(8)]

    def take(i: int) -> None:
        for _ in range(200):
            got[i].append(pool.acquire(64))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    keys = [(s.buffer_id, s.offset) for g in got for s in g]
    assert len(keys) == 1600 and len(set(keys)) == 1600
