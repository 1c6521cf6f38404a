"""Element types and reduction operators, and their wire numbers (proto/railyard/v1/common.proto)."""

from __future__ import annotations

import enum
from typing import Dict, Union

import numpy as np

# DataType wire numbers by numpy dtype.
_DTYPE_NUMBERS: Dict[np.dtype, int] = {
    np.dtype(np.float32): 1,
    np.dtype(np.float64): 2,
    np.dtype(np.float16): 3,
    # 4 is bfloat16: numpy has no such type; see DTYPE_BFLOAT16 below.
    np.dtype(np.int8): 5,
    np.dtype(np.uint8): 6,
    np.dtype(np.int32): 7,
    np.dtype(np.uint32): 8,
    np.dtype(np.int64): 9,
    np.dtype(np.uint64): 10,
}

#: Wire number of bfloat16. Arrays holding bfloat16 bits are passed as uint16/int16 with
#: ``dtype="bfloat16"`` (the PyTorch backend does this for ``torch.bfloat16`` tensors).
DTYPE_BFLOAT16 = 4

#: numpy dtypes the daemon reduces natively.
SUPPORTED_DTYPES = tuple(_DTYPE_NUMBERS)


class ReduceOp(enum.IntEnum):
    """Reduction operators. ``AVG`` is ``SUM`` divided by the number of ranks (integer ``AVG``
    truncates toward zero). Operations also accept the lowercase names ("sum", "prod", ...)."""

    SUM = 1
    PROD = 2
    MIN = 3
    MAX = 4
    AVG = 5


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
