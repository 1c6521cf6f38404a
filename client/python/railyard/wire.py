"""Python values as the numbers on the wire: element types, reduction operators and timeouts.

The numbers are those of proto/railyard/v1/common.proto (``DataType``, ``RedOp``), read from its
generated stubs. Shared by the client and the torch backend (:mod:`railyard.torch`).
"""

from __future__ import annotations

import enum
import math
from typing import Dict, Optional, Union

import grpc
import numpy as np

from ._generated import common_pb2
from .errors import InvalidArgumentError

__all__ = ["ReduceOp", "RedOpLike", "DTYPE_BFLOAT16", "SUPPORTED_DTYPES", "dtype_number",
           "red_op_number", "timeout_ms"]

# DataType wire numbers by numpy dtype.
_DTYPE_NUMBERS: Dict[np.dtype, int] = {
    np.dtype(np.float32): common_pb2.DATA_TYPE_FLOAT32,
    np.dtype(np.float64): common_pb2.DATA_TYPE_FLOAT64,
    np.dtype(np.float16): common_pb2.DATA_TYPE_FLOAT16,
    # numpy has no bfloat16: see DTYPE_BFLOAT16 below.
    np.dtype(np.int8): common_pb2.DATA_TYPE_INT8,
    np.dtype(np.uint8): common_pb2.DATA_TYPE_UINT8,
    np.dtype(np.int32): common_pb2.DATA_TYPE_INT32,
    np.dtype(np.uint32): common_pb2.DATA_TYPE_UINT32,
    np.dtype(np.int64): common_pb2.DATA_TYPE_INT64,
    np.dtype(np.uint64): common_pb2.DATA_TYPE_UINT64,
}

#: Wire number of bfloat16. Arrays holding bfloat16 bits are passed as uint16/int16 with
#: ``dtype="bfloat16"`` (the PyTorch backend does this for ``torch.bfloat16`` tensors).
DTYPE_BFLOAT16: int = common_pb2.DATA_TYPE_BFLOAT16

#: numpy dtypes the daemon reduces natively.
SUPPORTED_DTYPES = tuple(_DTYPE_NUMBERS)


class ReduceOp(enum.IntEnum):
    """Reduction operators. ``AVG`` is ``SUM`` divided by the number of ranks (integer ``AVG``
    truncates toward zero). Operations also accept the lowercase names ("sum", "prod", ...)."""

    SUM = common_pb2.RED_OP_SUM
    PROD = common_pb2.RED_OP_PROD
    MIN = common_pb2.RED_OP_MIN
    MAX = common_pb2.RED_OP_MAX
    AVG = common_pb2.RED_OP_AVG


RedOpLike = Union[ReduceOp, str]

# By lowercase name, the names operations accept (a dict lookup per operation, not an enum's).
_RED_OP_NUMBERS: Dict[str, int] = {o.name.lower(): int(o) for o in ReduceOp}


def red_op_number(op: RedOpLike) -> int:
    """Wire number of a reduction operator given as :class:`ReduceOp` or name."""
    if isinstance(op, ReduceOp):
        return int(op)
    if isinstance(op, str):
        number = _RED_OP_NUMBERS.get(op)
        if number is not None:
            return number
        try:
            return int(ReduceOp[op.upper()])
        except KeyError:
            pass
    raise ValueError(f"unknown reduction op {op!r}; expected one of "
                     f"{', '.join(o.name.lower() for o in ReduceOp)}")


def dtype_number(dtype: np.dtype, override: object = None) -> int:
    """Wire number of ``dtype``; ``override="bfloat16"`` marks 2-byte arrays holding bfloat16."""
    if override is None and isinstance(dtype, np.dtype):
        number = _DTYPE_NUMBERS.get(dtype)  # the keys are native: '>f4' != '<f4' misses
        if number is not None:
            return number
    if override is not None:
        if override == "bfloat16" or override == DTYPE_BFLOAT16:
            if dtype.itemsize != 2:
                raise ValueError(f"bfloat16 data must be held in a 2-byte dtype, not {dtype}")
            return DTYPE_BFLOAT16
        dtype = np.dtype(override)
    number = _DTYPE_NUMBERS.get(np.dtype(dtype).newbyteorder("="))
    if number is None or not np.dtype(dtype).isnative:
        raise ValueError(f"dtype {dtype} is not supported; supported: "
                         f"{', '.join(str(d) for d in SUPPORTED_DTYPES)} (and bfloat16 via torch)")
    return number


def timeout_ms(timeout: Optional[float]) -> int:
    """An operation's ``timeout`` (seconds; ``None``: the daemon's default) as the request's
    ``timeout_ms`` (0: the default). :class:`InvalidArgumentError` outside (0, 2**32) ms."""
    if timeout is None:
        return 0
    ms = int(math.ceil(float(timeout) * 1000.0))
    if ms <= 0 or ms > 0xFFFFFFFF:
        raise InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"timeout {timeout} s out of range")
    return ms
