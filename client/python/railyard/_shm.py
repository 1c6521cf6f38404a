"""POSIX shared-memory segments shared with the daemon (docs/local-api.md, "Buffers")."""

from __future__ import annotations

import errno
import mmap
import os
import secrets

try:  # CPython's own binding of shm_open/shm_unlink (used by multiprocessing.shared_memory)
    import _posixshmem
except ImportError:  # pragma: no cover - every Linux CPython has it
    _posixshmem = None

_SHM_DIR = "/dev/shm"


class Mapping(mmap.mmap):
    """An ``mmap`` of a shared-memory segment; subclassed so that it supports weak references and
    carries the daemon's buffer id."""

    buffer_id: int = 0
    name: str = ""


def _shm_open(name: str) -> int:
    flags = os.O_CREAT | os.O_EXCL | os.O_RDWR
    if _posixshmem is not None:
        return _posixshmem.shm_open(name, flags, 0o600)
    return os.open(_SHM_DIR + name, flags | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


def shm_unlink(name: str) -> None:
    """Removes the name of a segment (the mappings stay valid). Missing names are ignored."""
    try:
        if _posixshmem is not None:
            _posixshmem.shm_unlink(name)
        else:
            os.unlink(_SHM_DIR + name)
    except FileNotFoundError:
        pass


def create(job: str, serial: int, size: int) -> Mapping:
    """Creates, sizes and maps (pre-faulted) ``/railyard.<job>.<pid>.<serial>.<16 hex>``.

    The name is still linked on return: the caller registers it with the daemon and then calls
    :func:`shm_unlink`. Raises ``OSError`` (``ENOSPC`` when /dev/shm is full).
    """
    if size <= 0:
        raise ValueError(f"cannot allocate a buffer of {size} bytes")
    name = f"/railyard.{job}.{os.getpid()}.{serial}.{secrets.token_hex(8)}"
    fd = _shm_open(name)
    try:
        try:
            # Reserves the pages: a full /dev/shm fails here with ENOSPC instead of SIGBUS later.
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            os.ftruncate(fd, size)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapping = Mapping(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        shm_unlink(name)
        raise
    os.close(fd)
    mapping.name = name
    return mapping
