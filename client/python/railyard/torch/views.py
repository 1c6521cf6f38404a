"""Tensors as the arrays railyard's calls take: numpy views of CPU tensors, device arrays of
device tensors (:class:`railyard.DeviceArray`), the contiguous copies of non-contiguous ones and
their copies back (:class:`Io`), and the reduce operators by name.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

import railyard

from ._device_tensors import DeviceTensors, numpy_dtype

#: The reduce operators the backend takes, by the name railyard calls them.
RED_OPS = (("sum", dist.ReduceOp.SUM), ("prod", dist.ReduceOp.PRODUCT),
           ("min", dist.ReduceOp.MIN), ("max", dist.ReduceOp.MAX), ("avg", dist.ReduceOp.AVG))


def red_op(op: Any) -> str:
    for name, ref in RED_OPS:
        if op == ref:
            return name
    raise ValueError(f"railyard: reduce op {op} is not supported "
                     "(supported: SUM, PRODUCT, MIN, MAX, AVG)")


ON_DEVICES = ("all_reduce, all_reduce_coalesced, broadcast, reduce, all_gather, "
              "all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, "
              "all_to_all_single and barrier")


def check_tensor(t: Any, what: str, devices: Optional[DeviceTensors] = None) -> torch.Tensor:
    """``t`` if the operation ``what`` can take it: a dense CPU tensor, or a device tensor
    ``devices`` serves (``None``: host memory only)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"railyard: {what} must be a tensor, got {type(t).__name__}")
    if t.device.type != "cpu" and (devices is None or not devices.owns(t)):
        if devices is None:
            raise ValueError(f"railyard: {what} is on {t.device}; the railyard backend runs it "
                             f"on CPU tensors only (device tensors: {ON_DEVICES})")
        raise ValueError(f"railyard: {what} is on {t.device}; the railyard backend takes CPU "
                         f"tensors and {devices.kind} only")
    if t.layout != torch.strided:
        raise ValueError(f"railyard: {what} has layout {t.layout}; only dense tensors are "
                         "supported here (all_reduce also takes sparse COO tensors)")
    return t


def as_numpy(t: torch.Tensor, red: Optional[str]) -> Tuple[np.ndarray, Optional[str]]:
    """A numpy view of contiguous ``t`` and the ``dtype=`` override for railyard.

    Reductions need a dtype the daemon reduces; other operations move any dtype as bytes.
    """
    if t.requires_grad:  # numpy() refuses it; detach() costs ~3 us, so only then
        t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), "bfloat16"
    if t.is_complex():
        _refuse_red(t.dtype, red)
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        _refuse_red(t.dtype, red)
        arr = t.view(torch.uint8).numpy()
    else:
        arr = t.numpy()
    if arr.dtype in railyard.SUPPORTED_DTYPES:
        return arr, None
    _refuse_red(t.dtype, red, unsupported=True)
    return arr.reshape(-1).view(np.uint8), None


def _refuse_red(dtype: torch.dtype, red: Optional[str], unsupported: bool = False) -> None:
    """Raises when tensors of ``dtype`` cannot be reduced with ``red`` (None: no reduction)."""
    if red is None:
        return
    if dtype.is_complex and red not in ("sum", "avg"):
        raise ValueError(f"railyard: {red} is not defined for complex tensors")
    if dtype == torch.bool and red not in ("min", "max"):
        raise ValueError(f"railyard: {red} is not supported for bool tensors (min/max are)")
    if unsupported:
        raise ValueError(f"railyard: dtype {dtype} cannot be reduced (supported: float32, "
                         "float64, float16, bfloat16, int8, uint8, int32, int64)")


def as_device_array(reg: "railyard.DeviceArray", t: torch.Tensor,
                    red: Optional[str]) -> Tuple["railyard.DeviceArray", Optional[str]]:
    """What :func:`as_numpy` is for host tensors, for ``reg``: the bytes of a device tensor
    ``t`` (uint8), seen as the dtype the daemon reduces (or left as bytes)."""
    if t.dtype == torch.bfloat16:
        return reg.view(np.int16), "bfloat16"
    _refuse_red(t.dtype, red)
    if t.is_complex():
        dt = numpy_dtype(torch.float32 if t.dtype == torch.complex64 else torch.float64)
    elif t.dtype == torch.bool:
        dt = np.dtype(np.uint8)
    else:
        dt = numpy_dtype(t.dtype)
    if dt in railyard.SUPPORTED_DTYPES:
        return reg.view(dt), None
    _refuse_red(t.dtype, red, unsupported=True)
    return reg, None


class Io:
    """Numpy views of an operation's tensors: non-contiguous tensors go through contiguous
    copies, copied back into the originals once the operation completes."""

    def __init__(self) -> None:
        self.copy_back: List[Tuple[torch.Tensor, torch.Tensor]] = []

    def input(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.is_contiguous() else t.contiguous()

    def output(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous():
            return t
        tmp = t.contiguous()
        self.copy_back.append((tmp, t))
        return tmp

    def finish(self) -> None:
        if not self.copy_back:
            return
        with torch.no_grad():
            for tmp, t in self.copy_back:
                t.copy_(tmp)


class DeviceIo(Io):
    """An :class:`Io` for device tensors: the contiguous copies are device tensors, and the
    copies into and out of them are work on the operation's stream."""

    def __init__(self, devices: DeviceTensors, stream: Any) -> None:
        super().__init__()
        self._devices = devices
        self._stream = stream

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        tmp = self._devices.empty(tuple(t.shape), t.dtype, t)

        def copy() -> None:
            with torch.no_grad():
                tmp.copy_(t)

        self._devices.on_stream(self._stream, copy)
        return tmp

    def input(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.is_contiguous() else self._copy(t)

    def output(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous():
            return t
        tmp = self._copy(t)
        self.copy_back.append((tmp, t))
        return tmp
