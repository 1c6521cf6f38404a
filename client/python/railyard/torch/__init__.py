"""The ``"railyard"`` backend of ``torch.distributed`` (CPU tensors; ``cuda`` tensors in the
operations :data:`railyard.torch.views.ON_DEVICES` lists, ordered on their current stream:
docs/gpu.md, "From torch").

Importing this module registers the backend::

    import torch.distributed as dist
    import railyard.torch  # noqa: F401  (registers "railyard")

    dist.init_process_group("railyard", rank=rank, world_size=world_size, store=store)
    # or init_method="env://" / "tcp://..." like any backend (torchrun works unchanged)
    model = torch.nn.parallel.DistributedDataParallel(model)

Each process talks to its node's railyardd (``RAILYARD_SOCKET``, ``RAILYARD_JOB``,
``RAILYARD_TOKEN`` as for :func:`railyard.connect`). Rank 0 of every process group creates a
communicator id and publishes it through the group's c10d store; every rank then joins it.

How it is built, and why: :class:`ProcessGroupRailyard` is a *Python* subclass of
``torch.distributed.ProcessGroup``. PyTorch 1.13 ships a pybind11 trampoline
(``c10d::PyProcessGroup``) that forwards the C++ virtual calls DDP makes (``allreduce``,
``broadcast``, ``allgather``, ``barrier``...) to Python overrides, and
``Backend.register_backend`` accepts a Python creator, so no C++ extension (and no libtorch
headers, which Debian's python3-torch does not ship) is needed. Works returned to PyTorch are
Python subclasses of ``Work``: PyTorch's own ``_create_work_from_future`` wrapper would do for
DDP, but its ``wait()`` ignores the future's error (a failed ``dist.all_reduce`` would look
successful), so the Python ``Work`` here raises instead and hands DDP a ``torch.futures.Future``
from ``get_future()``. Such a Python object must outlive every C++ call on it (otherwise the
trampoline falls back to the base class, whose ``wait()`` never returns), so each one is kept
alive until its operation has completed *and* it has been waited on or had its future taken.

Supported: ``all_reduce`` (sum, product, min, max, avg; sum of sparse COO tensors too),
``broadcast``, ``reduce``, ``all_gather`` (list, ``_all_gather_base``/``all_gather_into_tensor``
and ``all_gather_coalesced``), ``reduce_scatter`` (list and ``_reduce_scatter_base``),
``all_to_all`` (list and ``all_to_all_single`` with or without split sizes), ``gather``,
``scatter``, ``send``/``recv`` (from a given rank or from any source; tags are ignored: messages
between two ranks match in order), ``barrier``, ``monitored_barrier`` and ``allreduce_coalesced``,
on CPU tensors of float32/64, float16, bfloat16, int8, uint8, int32, int64 (and, for the
operations that do not reduce, any dtype; complex for sum/avg). Tensors are copied into shared
staging memory and back, except those from :func:`empty`, which live in shared memory (zero copy).

Timeouts: every operation is bounded by the group's timeout (``init_process_group(timeout=)``,
``new_group(timeout=)``) or by the one in its options where PyTorch passes one; past it the
daemon fails the operation with a :class:`railyard.DeadlineExceededError` ("Timed out after ...")
and aborts the communicator, so that the other ranks fail too instead of waiting.

Point-to-point messages carry a small header (element count and dtype) ahead of the payload: a
receive from any source takes whichever peer's header arrives first (see
:class:`railyard.torch.p2p.PointToPoint`).

The modules: ``process_group`` (:class:`ProcessGroupRailyard`, the shared session, :func:`empty`),
``work`` (the Work returned to PyTorch, the threads completing it), ``views`` (tensors as the
arrays railyard takes), ``p2p`` (send/recv, from any source too), ``sparse`` (sparse all_reduce),
``hooks`` (:func:`compression_hook`) and ``_device_tensors`` (device tensors: :class:`CudaTensors`).
This one registers the backend (and wraps ``destroy_process_group`` and ``monitored_barrier``).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch.distributed as dist

from ._device_tensors import CudaTensors, DeviceTensors
from .hooks import compression_hook
from .process_group import (BACKEND, ProcessGroupRailyard, create_process_group, empty,
                            live_groups, shared_client)
from .work import Work as _Work

__all__ = ["ProcessGroupRailyard", "BACKEND", "empty", "create_process_group",
           "compression_hook", "DeviceTensors", "CudaTensors"]

# Names this module had before the backend was split into modules (not in __all__, as then).
Work = _Work
_shared_client = shared_client


def _destroy_process_group(group: Any = None) -> None:
    """``torch.distributed.destroy_process_group``, then the daemon-side communicators of the
    railyard groups it destroyed are released (every group when ``group`` is None)."""
    if group is None or group is dist.GroupMember.WORLD:
        doomed = list(live_groups)  # every group goes, the default one included
    else:
        doomed = [group] if isinstance(group, ProcessGroupRailyard) else []
    _torch_destroy_process_group(group)
    for g in doomed:
        g.shutdown()


_torch_destroy_process_group = dist.distributed_c10d.destroy_process_group


def _monitored_barrier(group: Any = dist.GroupMember.WORLD, timeout: Any = None,
                       wait_all_ranks: bool = False) -> None:
    """``torch.distributed.monitored_barrier``, which PyTorch 1.13 refuses for any backend but
    gloo, for railyard groups too (:meth:`ProcessGroupRailyard.monitored_barrier`; ``timeout``
    None: the group's). Other groups, and ranks outside ``group``, go to PyTorch's own."""
    c10d = dist.distributed_c10d
    if not c10d._rank_not_in_group(group) and c10d.is_initialized():
        pg = c10d._get_default_group() if group is None or group is c10d.GroupMember.WORLD \
            else group
        if isinstance(pg, ProcessGroupRailyard):
            return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
    return _torch_monitored_barrier(group, timeout, wait_all_ranks)


_torch_monitored_barrier = dist.distributed_c10d.monitored_barrier


def _register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        # torch >= 2.1 asks which devices the backend serves: CPU tensors, and CUDA tensors
        # (docs/gpu.md: staged or registered device memory). torch 1.13 has no such parameter.
        if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
            dist.Backend.register_backend(BACKEND, create_process_group,
                                          devices=["cpu", "cuda"])
        else:
            dist.Backend.register_backend(BACKEND, create_process_group)
    if dist.distributed_c10d.destroy_process_group is not _destroy_process_group:
        dist.distributed_c10d.destroy_process_group = _destroy_process_group
        dist.destroy_process_group = _destroy_process_group
    if dist.distributed_c10d.monitored_barrier is not _monitored_barrier:
        dist.distributed_c10d.monitored_barrier = _monitored_barrier
        dist.monitored_barrier = _monitored_barrier


_register()
