"""DistributedDataParallel communication hooks of the railyard backend."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from .process_group import ProcessGroupRailyard

__all__ = ["compression_hook"]


def _railyard_group(group: Any) -> "ProcessGroupRailyard":
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(pg, ProcessGroupRailyard):
        return pg
    get_backend = getattr(pg, "_get_backend", None)  # torch >= 2.0 wraps backends
    if get_backend is not None:
        backend = get_backend(torch.device("cpu"))
        if isinstance(backend, ProcessGroupRailyard):
            return backend
    raise ValueError(f"railyard.torch.compression_hook needs a railyard process group, got "
                     f"{type(pg).__name__}")


def compression_hook(codec: str = "int8", *, error_feedback: bool = True, group: Any = None,
                     key_base: int = 0) -> Callable[[Any, Any], torch.futures.Future]:
    """A ``DistributedDataParallel`` communication hook whose bucket all-reduces compress their
    inter-node steps with ``codec`` ("fp16", "bf16", "int8", "int8:B", "topk:R" or "auto";
    docs/compression.md) and average, like DDP's own allreduce::

        ddp.register_comm_hook(None, railyard.torch.compression_hook("int8"))

    With ``error_feedback`` (the default) the daemon keeps a residual per bucket, keyed by
    ``key_base + bucket.index()`` (give each DDP model of one process group its own key_base),
    which keeps the compression unbiased over steps. The state passed to ``register_comm_hook``
    may be the railyard process group (default: ``group``, else the default group). Applies
    across nodes to float32 gradients; elsewhere the all-reduce is exact."""
    if not isinstance(codec, str) or not codec:
        raise ValueError(f"railyard: compression_hook needs a codec name, got {codec!r}")

    def hook(state: Any, bucket: Any) -> torch.futures.Future:
        pg = _railyard_group(state if state is not None else group)
        tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
        key = key_base + bucket.index() if error_feedback else None
        work = pg.allreduce_compressed(tensor, codec, key)
        return work.get_future().then(lambda fut: fut.value()[0])

    # DDP checks a hook's annotations (register_comm_hook): real objects, not strings.
    hook.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    return hook
