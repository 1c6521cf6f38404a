"""Buffer memory shared with the daemon: a sealed memfd, never a name anyone could open
(docs/local-api.md, "Buffers")."""

from __future__ import annotations

import fcntl
import mmap
import os

#: What the daemon requires: the buffer can never shrink (which would SIGBUS the daemon), grow,
#: or have its seals changed.
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class Mapping(mmap.mmap):
    """An ``mmap`` of a buffer's memfd; subclassed so that it supports weak references and
    carries the daemon's buffer id and the address it is mapped at here."""

    buffer_id: int = 0
    address: int = 0


def create(job: str, size: int) -> tuple:
    """Creates a memfd of ``size`` bytes, allocates it, seals it (:data:`SEALS`) and maps it
    (pre-faulted). Returns ``(mapping, fd)``: the caller sends ``fd`` to the daemon and closes it.
    Raises ``OSError`` (``ENOSPC``/``ENOMEM`` when memory is short)."""
    if size <= 0:
        raise ValueError(f"cannot allocate a buffer of {size} bytes")
    fd = os.memfd_create(f"railyard.{job}"[:200], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        # Reserves the pages: short memory fails here instead of SIGBUS on first touch, and the
        # daemon's pre-fault allocates nothing.
        os.posix_fallocate(fd, 0, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapping = Mapping(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    return mapping, fd
