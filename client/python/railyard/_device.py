"""Device (GPU) memory registered with railyardd: :class:`DeviceArray`.

The Python client does not allocate device memory itself (it has no CUDA bindings): memory comes
from whatever allocates it (cuda-python, CuPy, a framework) and is registered as the C++ client's
is (docs/gpu.md): a CUDA VMM allocation by its exported POSIX file descriptor
(:meth:`railyard.Client.register_device_memory`), or, where the daemon allows legacy CUDA IPC
(``railyardd --cuda_ipc``), by a 64-byte ``cudaIpcMemHandle_t`` and the offset into its
allocation (:meth:`railyard.Client.register_cuda_ipc`). Collectives take a DeviceArray wherever
they take a numpy array; the daemon runs them on the GPU (one node) or stages them through host
memory (across nodes). Nothing is copied through this process.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import numpy as np


class _Registration:
    """One registered device buffer; released (ReleaseBuffer) when no DeviceArray uses it."""

    __slots__ = ("buffer_id", "nbytes", "device", "ptr", "__weakref__")

    def __init__(self, buffer_id: int, nbytes: int, device: int, ptr: int) -> None:
        self.buffer_id = buffer_id
        self.nbytes = nbytes
        self.device = device
        self.ptr = ptr


Shape = Union[int, Tuple[int, ...]]


def _shape_of(shape: Optional[Shape], count: int) -> Tuple[int, ...]:
    if shape is None:
        return (count,)
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


class DeviceArray:
    """Elements of one dtype in registered device memory: ``nbytes`` bytes from ``offset`` of a
    registered buffer, seen as ``shape``. It has no host view (the host cannot read device
    memory); ``ptr`` is the device address in this process, for the library that allocated it.
    """

    __slots__ = ("_reg", "offset", "dtype", "shape")

    def __init__(self, reg: _Registration, offset: int, dtype: np.dtype,
                 shape: Tuple[int, ...]) -> None:
        self._reg = reg
        self.offset = offset
        self.dtype = dtype
        self.shape = shape

    @classmethod
    def _layout(cls, nbytes: int, dtype: object,
                shape: Optional[Shape]) -> Tuple[np.dtype, Tuple[int, ...]]:
        """The dtype and shape of a whole registration, or ValueError saying why not."""
        dt = np.dtype(dtype)  # type: ignore[call-overload]
        if nbytes % dt.itemsize:
            raise ValueError(f"{nbytes} bytes are not a whole number of {dt} elements")
        return dt, cls._fit(_shape_of(shape, nbytes // dt.itemsize), dt, nbytes)

    @staticmethod
    def _fit(shape: Tuple[int, ...], dtype: np.dtype, room: int) -> Tuple[int, ...]:
        if any(s < 0 for s in shape):
            raise ValueError(f"negative dimensions in shape {shape}")
        need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if need > room:
            raise ValueError(f"shape {shape} of {dtype} needs {need} bytes; {room} are there")
        return shape

    @property
    def buffer_id(self) -> int:
        return self._reg.buffer_id

    @property
    def device(self) -> int:
        return self._reg.device

    @property
    def ptr(self) -> int:
        return self._reg.ptr + self.offset

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def part(self, start: int, count: int, shape: Optional[Shape] = None) -> "DeviceArray":
        """Elements ``[start, start + count)`` (in C order) of this array, as ``shape``
        (default ``(count,)``)."""
        start, count = int(start), int(count)
        if start < 0 or count < 0 or start + count > self.size:
            raise ValueError(f"elements [{start}, {start + count}) are not within {self.size}")
        new_shape = _shape_of(shape, count)
        if int(np.prod(new_shape, dtype=np.int64)) != count:
            raise ValueError(f"shape {new_shape} does not hold {count} elements")
        return DeviceArray(self._reg, self.offset + start * self.dtype.itemsize, self.dtype,
                           new_shape)

    def view(self, dtype: object, shape: Optional[Shape] = None) -> "DeviceArray":
        """The same bytes as another dtype (and shape)."""
        dt = np.dtype(dtype)  # type: ignore[call-overload]
        if self.nbytes % dt.itemsize:
            raise ValueError(f"{self.nbytes} bytes are not a whole number of {dt} elements")
        return DeviceArray(self._reg, self.offset, dt,
                           self._fit(_shape_of(shape, self.nbytes // dt.itemsize), dt,
                                     self.nbytes))

    def ref(self) -> Tuple[int, int]:
        """(buffer id, byte offset): what a submission names."""
        return self._reg.buffer_id, self.offset

    def __repr__(self) -> str:
        return (f"<railyard.DeviceArray {self.shape} {self.dtype} on device {self.device}, "
                f"buffer {self.buffer_id} + {self.offset}>")
