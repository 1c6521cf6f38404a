"""Tensors that live on a device, for the torch backend: how one becomes railyard device memory
(:class:`railyard.DeviceArray`) and how work is put in order on its stream.

The backend asks a :class:`DeviceTensors` for everything device-specific; :class:`CudaTensors`
(the default) serves ``cuda`` tensors, and tests give a fake that serves tensors in fake device
memory (``railyardd --fake_gpus``) ordered on a fake stream. What the backend does with them
(docs/gpu.md, "From torch"):

- the operation is put in order on the tensor's current stream (``stream=``): it reads its inputs
  once the stream's earlier work is done, and the stream's later work waits for its results;
- temporaries (flattened inputs, gathered outputs, contiguous copies) are device tensors, and
  the copies into and out of them are stream work too, enqueued at the call, so the call never
  waits on the host.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any, Callable, Dict, Tuple

import numpy as np
import torch

import railyard

_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
# Registrations of allocator segments kept per session. Past it the oldest are let go (the daemon
# unmaps them once no operation uses them): PyTorch's caching allocator holds few, large segments.
_MAX_SEGMENTS = 256


class DeviceTensors:
    """What the torch backend needs to run collectives on tensors that are not host memory."""

    #: What it serves, for error messages ("cuda tensors").
    kind = "device tensors"

    def owns(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lives on a device this object serves."""
        raise NotImplementedError

    def array(self, client: "railyard.Client", t: torch.Tensor) -> "railyard.DeviceArray":
        """The bytes of contiguous ``t`` as a uint8 DeviceArray registered with ``client``'s
        daemon. Raises ValueError (or a RailyardError) saying why not."""
        raise NotImplementedError

    def stream(self, t: torch.Tensor) -> Any:
        """The stream ``t``'s operation is ordered on (the caller's current one)."""
        raise NotImplementedError

    def on_stream(self, stream: Any, fn: Callable[[], None]) -> None:
        """Enqueues the tensor work ``fn`` does on ``stream``, after what is there."""
        raise NotImplementedError

    def empty(self, shape: Tuple[int, ...], dtype: torch.dtype, like: torch.Tensor
              ) -> torch.Tensor:
        """An uninitialised tensor on ``like``'s device."""
        raise NotImplementedError


class CudaTensors(DeviceTensors):
    """``cuda`` tensors. Memory from PyTorch's caching allocator (``cudaMalloc``'d segments) is
    registered by legacy CUDA IPC, a segment at a time (the daemon needs ``--cuda_ipc``), and
    kept registered while the segment stays the same allocation: a segment freed and allocated
    again gets another IPC handle, and the old registration is let go."""

    kind = "cuda tensors"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cu: Any = None
        # per session: (device, segment base) -> (IPC handle, the registration as uint8)
        self._segments: "weakref.WeakKeyDictionary[Any, Dict[Tuple[int, int], Tuple[bytes, Any]]]" \
            = weakref.WeakKeyDictionary()

    def owns(self, t: torch.Tensor) -> bool:
        return t.device.type == "cuda"

    def _driver(self) -> Any:
        if self._cu is None:
            try:
                cu = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise ValueError(f"railyard: cuda tensors need the CUDA driver (libcuda.so.1: {e})"
                                 ) from None
            self._cu = cu
        return self._cu

    def _check(self, what: str, result: int) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            self._cu.cuGetErrorName(result, ctypes.byref(name))
            raise ValueError(f"railyard: {what}: {(name.value or b'CUDA error').decode()} "
                             f"({result})")

    def _segment(self, ptr: int) -> Tuple[int, int]:
        cu = self._driver()
        base, size = ctypes.c_uint64(), ctypes.c_uint64()
        self._check("cuPointerGetAttribute(RANGE_START_ADDR)", cu.cuPointerGetAttribute(
            ctypes.byref(base), ctypes.c_int(_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR),
            ctypes.c_uint64(ptr)))
        self._check("cuPointerGetAttribute(RANGE_SIZE)", cu.cuPointerGetAttribute(
            ctypes.byref(size), ctypes.c_int(_CU_POINTER_ATTRIBUTE_RANGE_SIZE),
            ctypes.c_uint64(ptr)))
        return base.value, size.value

    def array(self, client: "railyard.Client", t: torch.Tensor) -> "railyard.DeviceArray":
        device = t.device.index if t.device.index is not None else torch.cuda.current_device()
        ptr, nbytes = t.data_ptr(), t.numel() * t.element_size()
        base, size = self._segment(ptr)
        handle = ctypes.create_string_buffer(64)
        with torch.cuda.device(device):  # the driver call needs the device's context current
            result = self._driver().cuIpcGetMemHandle(handle, ctypes.c_uint64(base))
        if result != 0:
            self._check("cuIpcGetMemHandle (memory from PyTorch's expandable segments or "
                        "another VMM allocator has no legacy IPC handle: set "
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False)", result)
        key, raw = (device, base), handle.raw
        with self._lock:
            segments = self._segments.setdefault(client, {})
            known = segments.get(key)
        if known is None or known[0] != raw:
            reg = client.register_cuda_ipc(raw, 0, size, device, dtype=np.uint8, ptr=base)
            with self._lock:
                segments.pop(key, None)  # a freed segment's registration goes
                while len(segments) >= _MAX_SEGMENTS:
                    segments.pop(next(iter(segments)))
                segments[key] = known = (raw, reg)
        return known[1].part(ptr - base, nbytes)

    def stream(self, t: torch.Tensor) -> Any:
        return torch.cuda.current_stream(t.device)

    def on_stream(self, stream: Any, fn: Callable[[], None]) -> None:
        with torch.cuda.stream(stream):
            fn()

    def empty(self, shape: Tuple[int, ...], dtype: torch.dtype, like: torch.Tensor
              ) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=like.device)


_NP_DTYPES: Dict[torch.dtype, np.dtype] = {}


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a tensor of ``dtype`` (as ``Tensor.numpy()`` gives it)."""
    found = _NP_DTYPES.get(dtype)
    if found is None:
        found = _NP_DTYPES[dtype] = torch.empty(0, dtype=dtype).numpy().dtype
    return found
