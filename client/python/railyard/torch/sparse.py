"""All-reduce of sparse COO tensors (sum), as gloo does it."""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

import railyard

from .views import Io, as_numpy, red_op
from .work import Work, worded

if TYPE_CHECKING:  # pragma: no cover
    from .process_group import ProcessGroupRailyard


def _raw_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of ``t`` (any dtype) as a flat uint8 array."""
    arr, _ = as_numpy(t.contiguous(), None)
    return arr.reshape(-1).view(np.uint8)


def _from_raw_bytes(raw: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A flat tensor of ``dtype`` made of a copy of ``raw`` (uint8)."""
    if not raw.size:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(bytearray(raw.tobytes()), dtype=dtype)


def sparse_allreduce(pg: "ProcessGroupRailyard", t: torch.Tensor, opts: Any) -> Work:
    """Sum of sparse COO tensors, as gloo does it: every rank gathers every rank's indices
    and values (one all_gather of the sizes, one all_to_all_v of the bytes) and coalesces
    their concatenation (duplicate indices add up). Waits for the sizes before returning, so
    that the operation's two collectives keep their place among the group's."""
    red = red_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
    if red != "sum":
        raise ValueError(f"railyard: all_reduce of a sparse tensor supports SUM only, got "
                         f"{red.upper()}")
    if t.layout != torch.sparse_coo:
        raise ValueError(f"railyard: sparse all_reduce needs a COO tensor, got {t.layout}")
    if t.device.type != "cpu":
        raise ValueError(f"railyard: all_reduce tensor is on {t.device}; the railyard "
                         "backend handles CPU tensors only")
    n = pg.size()
    local = t.detach().coalesce()
    indices = local.indices().contiguous()
    values = local.values().contiguous()
    sparse_dim = t.sparse_dim()
    shape_id = zlib.crc32(repr((tuple(t.shape), sparse_dim, str(t.dtype))).encode())
    meta = np.array([local._nnz(), shape_id], dtype=np.int64)
    metas = np.zeros((n, 2), dtype=np.int64)
    timeout = pg._timeout(opts)
    try:
        pg.comm.all_gather(meta, out=metas, timeout=timeout)
    except railyard.RailyardError as e:
        raise worded(e, timeout).with_traceback(None) from None
    others = [r for r in range(n) if metas[r, 1] != shape_id]
    if others:  # every rank sees it: none goes on to the second collective
        raise ValueError(f"railyard: sparse all_reduce: ranks {others} have tensors of "
                         f"another shape, sparse_dim or dtype than this rank's "
                         f"{tuple(t.shape)}, sparse_dim {sparse_dim}, {t.dtype}")
    nnz = [int(c) for c in metas[:, 0]]
    row_bytes = sparse_dim * 8 + int(np.prod(values.shape[1:], dtype=np.int64)) * \
        values.element_size()
    mine = np.concatenate([indices.numpy().reshape(-1).view(np.uint8),
                           _raw_bytes(values)])
    gathered = np.empty(sum(nnz) * row_bytes, dtype=np.uint8)

    def post() -> None:
        idx, vals, offset = [], [], 0
        for c in nnz:
            chunk = gathered[offset:offset + c * row_bytes]
            idx.append(_from_raw_bytes(chunk[:c * sparse_dim * 8], torch.int64)
                       .reshape(sparse_dim, c))
            vals.append(_from_raw_bytes(chunk[c * sparse_dim * 8:], values.dtype)
                        .reshape((c,) + tuple(values.shape[1:])))
            offset += c * row_bytes
        total = torch.sparse_coo_tensor(torch.cat(idx, 1), torch.cat(vals), t.shape,
                                        dtype=t.dtype).coalesce()
        with torch.no_grad():
            t.copy_(total)

    if not gathered.size:  # every rank's tensor is empty: nothing to move
        work = Work([t], post)
        work._complete(None)
        return work
    send = mine if mine.size else np.zeros(1, dtype=np.uint8)
    return pg._start([t], Io(), lambda kw: pg.comm.all_to_all_v(
        send, [mine.size] * n, [c * row_bytes for c in nnz], out=gathered,
        send_displs=[0] * n, **kw), post, opts)
