"""The railyard process group: :class:`ProcessGroupRailyard` (every collective of
``c10d::ProcessGroup``), the process's shared session (:func:`shared_client`), :func:`empty` and
the creator registered with ``torch.distributed``.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist

import railyard
from railyard import wire
from railyard.v1 import common_pb2 as _common_pb2
from railyard.wire import timeout_ms

from ._device_tensors import CudaTensors, DeviceTensors
from .p2p import Claim, PointToPoint
from .sparse import sparse_allreduce
from .views import RED_OPS, DeviceIo, Io, as_device_array, as_numpy, check_tensor, red_op
from .work import MAX_TIMEOUT, Work, live_lock, live_works

#: The backend name, for ``dist.init_process_group(BACKEND, ...)``.
BACKEND = "railyard"

_STORE_KEY = "railyard/comm_id"
_INIT_COUNT_KEY = "railyard/inits"


# The lean path of a small all_reduce (ProcessGroupRailyard._small_allreduce): wire numbers by
# torch dtype and reduce op, and the largest tensor it takes (beyond, the staging copies cost more
# than the Python it saves).
_WIRE_DTYPES = {t: wire.dtype_number(np.dtype(n)) for t, n in (
    (torch.float32, np.float32), (torch.float64, np.float64), (torch.float16, np.float16),
    (torch.int8, np.int8), (torch.uint8, np.uint8), (torch.int32, np.int32),
    (torch.int64, np.int64))}
_WIRE_DTYPES[torch.bfloat16] = wire.DTYPE_BFLOAT16
_WIRE_RED_OPS = {ref: wire.red_op_number(name) for name, ref in RED_OPS}
_SMALL_BYTES = 64 << 10
_ALL_REDUCE = _common_pb2.COLLECTIVE_OP_ALL_REDUCE


_clients: Dict[Tuple[int, str, str, str], "railyard.Client"] = {}
_clients_lock = threading.Lock()


def shared_client() -> "railyard.Client":
    """One session per process (and daemon): every process group's comm shares it."""
    key = (os.getpid(), os.environ.get("RAILYARD_SOCKET", ""),
           os.environ.get("RAILYARD_JOB", ""), os.environ.get("RAILYARD_TOKEN", ""))
    with _clients_lock:
        client = _clients.get(key)
        if client is None or client.closed:
            client = railyard.connect()
            _clients[key] = client
        return client


def _seconds(timeout: Any, what: str) -> Optional[float]:
    """A ``timedelta`` or a number of seconds as float seconds (``None`` stays ``None``)."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        return float(timeout)
    raise TypeError(f"railyard: {what} must be a timedelta or seconds, got "
                    f"{type(timeout).__name__}")


class ProcessGroupRailyard(dist.ProcessGroup):
    """A ``torch.distributed`` process group whose collectives run in railyardd.

    Created by ``dist.init_process_group("railyard", ...)`` / ``dist.new_group(...,
    backend="railyard")`` through :func:`create_process_group`; see the docstring of
    :mod:`railyard.torch`.

    Attributes:
        comm: the :class:`railyard.Comm` of this group (its ``client`` is the session).
    """

    def __init__(self, store: Any, rank: int, world_size: int,
                 timeout: timedelta = timedelta(minutes=30),
                 client: Optional["railyard.Client"] = None,
                 device_tensors: Optional[DeviceTensors] = None,
                 comm: Optional["railyard.Comm"] = None) -> None:
        super().__init__(rank, world_size)
        self.client = client if client is not None else shared_client()
        # Tensors that are not host memory (cuda ones by default; tests give a fake).
        self._devices = device_tensors if device_tensors is not None else _cuda_tensors
        seconds = _seconds(timeout, "timeout")
        self._op_timeout = min(max(seconds or 0.0, 0.001), MAX_TIMEOUT)
        if comm is not None:  # a group made from a communicator (shrink)
            self.comm = comm
        else:
            # Every init of this store's group gets its own key (re-initialization reuses group
            # names): the n-th init of each rank reads the n-th id.
            generation = (store.add(_INIT_COUNT_KEY, 1) - 1) // world_size
            key = f"{_STORE_KEY}/{generation}"
            if rank == 0:
                comm_id = self.client.new_comm_id()
                store.set(key, comm_id)
            else:
                comm_id = store.get(key).decode()
            self.comm = self.client.comm(comm_id, rank, world_size, timeout=self._op_timeout)
        self._p2p = PointToPoint(self)
        live_groups.add(self)

    def getBackendName(self) -> str:  # noqa: N802 - the name C++ calls
        return BACKEND

    def shrink(self, exclude: Sequence[int],
               timeout: Optional[timedelta] = None) -> "ProcessGroupRailyard":
        """A group of this one's ranks but ``exclude`` (as torchcomms' and NCCL's shrink): every
        surviving rank calls it with the same list; the excluded ranks do not take part (they may
        be dead); the others are renumbered in order. No store is needed: the new
        communicator's id is derived alike on every rank (``railyard.Comm.shrink``). Use the
        returned group's methods directly (``group.allreduce([t]).wait()``); this group stays
        as it is (``shutdown()`` it when done)."""
        seconds = self._op_timeout if timeout is None else _seconds(timeout, "timeout")
        small = self.comm.shrink(list(exclude), timeout=seconds)
        return ProcessGroupRailyard(None, small.rank, small.nranks,
                                    timedelta(seconds=self._op_timeout), client=self.client,
                                    device_tensors=self._devices, comm=small)

    def __repr__(self) -> str:
        return f"<ProcessGroupRailyard rank {self.rank()} of {self.size()} {self.comm.comm_id}>"

    def shutdown(self) -> None:
        """Leaves the communicator: the daemon releases it. ``dist.destroy_process_group`` calls
        it (railyard.torch wraps that function: PyTorch 1.13 does not tell Python groups)."""
        try:
            self.comm.close()
        except railyard.RailyardError:
            pass

    # -- plumbing ------------------------------------------------------------------------------

    def _timeout(self, opts: Any) -> float:
        """The timeout of an operation: its options' where set, else the group's."""
        t = getattr(opts, "timeout", None)
        if isinstance(t, timedelta) and t >= timedelta(0):  # unset: -1 ms
            return min(max(t.total_seconds(), 0.001), MAX_TIMEOUT)
        return self._op_timeout

    def _start(self, outputs: List[torch.Tensor], io: Io,
               launch: Callable[[Dict[str, Any]],
                                Union["railyard.Work", List["railyard.Work"]]],
               post: Optional[Callable[[], None]] = None, opts: Any = None,
               timeout: Optional[float] = None, stream: Any = None) -> Work:
        """Launches an operation: ``launch(kw)`` submits it (``kw``: async_op and timeout for the
        railyard calls: ``timeout``, else the one of ``opts``, else the group's; and ``stream``
        for device tensors) and returns its railyard work(s). On host tensors ``post`` and the
        copies back run once the operation has completed; on device tensors they are enqueued on
        ``stream`` now, behind the operation."""
        def finish() -> None:
            if post is not None:
                post()
            io.finish()

        kw = {"async_op": True, "timeout": self._timeout(opts) if timeout is None else timeout}
        if stream is not None:
            kw["stream"] = stream
        work = Work(outputs, finish if stream is None else None, kw["timeout"])
        try:
            rws = launch(kw)
        except BaseException:
            with live_lock:
                live_works.pop(id(work), None)
            raise
        if stream is not None:
            self._devices.on_stream(stream, finish)
        work._expect(rws if isinstance(rws, list) else [rws])
        return work

    def _stream(self, tensors: Sequence[torch.Tensor], what: str) -> Any:
        """None when ``tensors`` are host memory; for device tensors, the stream their operation
        is put in order on. Host and device tensors in one operation: ValueError."""
        on_device = [self._devices.owns(t) for t in tensors]
        if not any(on_device):
            return None
        if not all(on_device):
            raise ValueError(f"railyard: {what} mixes CPU and device tensors")
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(f"railyard: {what} has tensors on several devices "
                             f"({', '.join(sorted(str(d) for d in devices))}); one process "
                             "drives one device per operation")
        return self._devices.stream(tensors[0])

    def _io(self, stream: Any) -> Io:
        return Io() if stream is None else DeviceIo(self._devices, stream)

    def _array(self, t: torch.Tensor, red: Optional[str], stream: Any
               ) -> Tuple[Union[np.ndarray, "railyard.DeviceArray"], Optional[str]]:
        """The array a railyard call takes for contiguous ``t``, and its ``dtype=``."""
        if stream is None:
            return as_numpy(t, red)
        return as_device_array(self._devices.array(self.client, t), t, red)

    def _empty(self, shape: Tuple[int, ...], dtype: torch.dtype, like: torch.Tensor,
               stream: Any) -> torch.Tensor:
        if stream is None:
            return torch.empty(shape, dtype=dtype)
        return self._devices.empty(shape, dtype, like)

    def _flat(self, tensors: Sequence[torch.Tensor], stream: Any) -> torch.Tensor:
        """``tensors`` laid end to end in one new 1-D tensor (on a device: copied by stream
        work)."""
        if stream is None:
            return torch.cat([t.detach().reshape(-1) for t in tensors])
        flat = self._devices.empty((sum(t.numel() for t in tensors),), tensors[0].dtype,
                                   tensors[0])

        def copy() -> None:
            offset = 0
            with torch.no_grad():
                for t in tensors:
                    flat[offset:offset + t.numel()].copy_(t.reshape(-1))
                    offset += t.numel()

        self._devices.on_stream(stream, copy)
        return flat

    def _done(self, outputs: List[Any]) -> Work:
        """A work that has already completed (an operation with nothing to move)."""
        work = Work(outputs)
        work._complete(None)
        return work

    def _one(self, tensors: Sequence[torch.Tensor], what: str,
             on_devices: bool = False) -> torch.Tensor:
        if len(tensors) != 1:
            raise ValueError(f"railyard: {what} takes exactly one tensor per process, got "
                             f"{len(tensors)}")
        return check_tensor(tensors[0], what, self._devices if on_devices else None)

    # -- collectives (signatures of c10d::ProcessGroup) ----------------------------------------

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        if len(tensors) == 1:
            work = self._small_allreduce(tensors[0], opts)
            if work is not None:
                return work
        if len(tensors) == 1 and isinstance(tensors[0], torch.Tensor) and \
                tensors[0].layout != torch.strided:
            return sparse_allreduce(self, tensors[0], opts)
        t = self._one(tensors, "all_reduce", on_devices=True)
        red = red_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        stream = self._stream([t], "all_reduce")
        io = self._io(stream)
        arr, dt = self._array(io.output(t), red, stream)
        return self._start([t], io, lambda kw: self.comm.all_reduce(arr, red, dtype=dt, **kw),
                           opts=opts, stream=stream)

    def _small_allreduce(self, t: Any, opts: Any) -> Optional[Work]:
        """A small contiguous CPU tensor's all_reduce, submitted straight onto the session rings
        (railyard.Comm._start_in_place: one staging copy each way, no numpy view, no per-operation
        objects but this Work). ``None`` where it does not apply; the general path runs then."""
        if (type(t) is not torch.Tensor or t.device.type != "cpu" or
                t.layout != torch.strided or not t.is_contiguous() or self._devices.owns(t)):
            return None
        dtype = _WIRE_DTYPES.get(t.dtype)
        count = t.numel()
        nbytes = count * t.element_size()
        red = _WIRE_RED_OPS.get(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if dtype is None or red is None or not 0 < nbytes <= _SMALL_BYTES:
            return None
        timeout = self._timeout(opts)
        work = Work([t], None, timeout)
        rw = None
        try:
            rw = self.comm._start_in_place(_ALL_REDUCE, dtype, red, count, 0, t.data_ptr(),
                                           nbytes, timeout_ms(timeout), work._complete)
        finally:
            if rw is None:  # not submitted (raised, or not for the lean path): forget the work
                with live_lock:
                    live_works.pop(id(work), None)
        if rw is None:
            return None
        work._rw = rw
        return work

    def allreduce_compressed(self, tensor: torch.Tensor, compression: str,
                             key: Optional[int] = None, op: str = "avg",
                             timeout: Optional[float] = None) -> Work:
        """All-reduce of ``tensor`` in place whose inter-node steps run under ``compression``
        (docs/compression.md; float32, float16 and bfloat16; other dtypes run exact), with error feedback under
        ``key`` unless it is None. What :func:`compression_hook` submits per DDP bucket."""
        t = check_tensor(tensor, "all_reduce")
        io = Io()
        buf = io.output(t)
        arr, dt = as_numpy(buf, op)
        return self._start([t], io, lambda kw: self.comm.all_reduce(
            arr, op, dtype=dt, compression=compression, compression_key=key, **kw),
            timeout=timeout)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        red = red_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if not tensors:
            raise ValueError("railyard: allreduce_coalesced needs at least one tensor")
        for t in tensors:
            check_tensor(t, "all_reduce_coalesced", self._devices)
            if t.dtype != tensors[0].dtype:
                raise ValueError("railyard: allreduce_coalesced tensors must share a dtype")
        stream = self._stream(tensors, "all_reduce_coalesced")
        flat = self._flat(tensors, stream)
        arr, dt = self._array(flat, red, stream)

        def post() -> None:
            offset = 0
            with torch.no_grad():
                for t in tensors:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

        return self._start(list(tensors), Io(),
                           lambda kw: self.comm.all_reduce(arr, red, dtype=dt, **kw), post, opts,
                           stream=stream)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        t = self._one(tensors, "broadcast", on_devices=True)
        root = opts.rootRank if opts is not None else 0
        stream = self._stream([t], "broadcast")
        io = self._io(stream)
        arr, dt = self._array(io.output(t), None, stream)
        return self._start([t], io, lambda kw: self.comm.broadcast(arr, root, dtype=dt, **kw),
                           opts=opts, stream=stream)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        t = self._one(tensors, "reduce", on_devices=True)
        red = red_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        root = opts.rootRank if opts is not None else 0
        stream = self._stream([t], "reduce")
        io = self._io(stream)
        arr, dt = self._array(io.output(t), red, stream)
        return self._start([t], io, lambda kw: self.comm.reduce(arr, root, red, dtype=dt, **kw),
                           opts=opts, stream=stream)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,
                        opts: Any = None) -> Work:
        check_tensor(output, "all_gather output", self._devices)
        check_tensor(input, "all_gather input", self._devices)
        if output.dtype != input.dtype or output.numel() != input.numel() * self.size():
            raise ValueError(f"railyard: all_gather output must have world_size * "
                             f"{input.numel()} elements of {input.dtype}, got "
                             f"{output.numel()} of {output.dtype}")
        stream = self._stream([output, input], "all_gather")
        io = self._io(stream)
        src, _ = self._array(io.input(input), None, stream)
        out, dt = self._array(io.output(output), None, stream)
        return self._start([output], io, lambda kw: self.comm.all_gather(
            src, out=out, dtype=dt, **kw), opts=opts, stream=stream)

    def allgather(self, output_tensors: List[List[torch.Tensor]],
                  input_tensors: List[torch.Tensor], opts: Any = None) -> Work:
        t = self._one(input_tensors, "all_gather", on_devices=True)
        if len(output_tensors) != 1 or len(output_tensors[0]) != self.size():
            raise ValueError(f"railyard: all_gather needs one list of {self.size()} output "
                             "tensors")
        outs = output_tensors[0]
        for o in outs:
            check_tensor(o, "all_gather output", self._devices)
            if o.numel() != t.numel() or o.dtype != t.dtype:
                raise ValueError("railyard: all_gather outputs must match the input's size and "
                                 "dtype")
        stream = self._stream([t] + list(outs), "all_gather")
        gathered = self._empty((self.size(),) + tuple(t.shape), t.dtype, t, stream)
        src, _ = self._array(self._io(stream).input(t), None, stream)
        out, dt = self._array(gathered, None, stream)

        def post() -> None:
            with torch.no_grad():
                for r, o in enumerate(outs):
                    o.copy_(gathered[r].view_as(o))

        return self._start(list(outs), Io(), lambda kw: self.comm.all_gather(
            src, out=out, dtype=dt, **kw), post, opts, stream=stream)

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]],
                            input_list: List[torch.Tensor], opts: Any = None) -> Work:
        """Every rank's ``input_list`` into ``output_lists[rank]``: one all_gather of the inputs
        laid end to end (every rank passes tensors of the same sizes, in the same order)."""
        n = self.size()
        if not input_list:
            raise ValueError("railyard: all_gather_coalesced needs at least one input tensor")
        for t in input_list:
            check_tensor(t, "all_gather_coalesced input")
            if t.dtype != input_list[0].dtype:
                raise ValueError(f"railyard: all_gather_coalesced inputs must share a dtype, got "
                                 f"{input_list[0].dtype} and {t.dtype}")
        if len(output_lists) != n:
            raise ValueError(f"railyard: all_gather_coalesced needs {n} output lists (one per "
                             f"rank), got {len(output_lists)}")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_list):
                raise ValueError(f"railyard: all_gather_coalesced output list {r} has "
                                 f"{len(outs)} tensors, the input list {len(input_list)}")
            for i, (o, t) in enumerate(zip(outs, input_list)):
                check_tensor(o, "all_gather_coalesced output")
                if o.numel() != t.numel() or o.dtype != t.dtype:
                    raise ValueError(f"railyard: all_gather_coalesced output [{r}][{i}] holds "
                                     f"{o.numel()} x {o.dtype}, its input {t.numel()} x "
                                     f"{t.dtype}")
        flat = torch.cat([t.detach().reshape(-1) for t in input_list])
        outputs = [list(outs) for outs in output_lists]  # the future's value, as gloo's
        if flat.numel() == 0:
            return self._done(outputs)
        gathered = torch.empty((n, flat.numel()), dtype=flat.dtype)
        src, _ = as_numpy(flat, None)
        out, dt = as_numpy(gathered, None)

        def post() -> None:
            with torch.no_grad():
                for r, outs in enumerate(output_lists):
                    offset = 0
                    for o in outs:
                        o.copy_(gathered[r, offset:offset + o.numel()].view_as(o))
                        offset += o.numel()

        return self._start(outputs, Io(), lambda kw: self.comm.all_gather(
            src, out=out, dtype=dt, **kw), post, opts)

    def gather(self, output_tensors: List[List[torch.Tensor]],
               input_tensors: List[torch.Tensor], opts: Any = None) -> Work:
        t = self._one(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        gathered = torch.empty((self.size(),) + tuple(t.shape), dtype=t.dtype)
        src, _ = as_numpy(t.contiguous(), None)
        out, dt = as_numpy(gathered, None)
        outs = output_tensors[0] if self.rank() == root else []
        if self.rank() == root and len(outs) != self.size():
            raise ValueError(f"railyard: gather needs {self.size()} output tensors on the root")

        def post() -> None:
            with torch.no_grad():
                for r, o in enumerate(outs):
                    o.copy_(gathered[r].view_as(o))

        return self._start(list(outs), Io(), lambda kw: self.comm.all_gather(
            src, out=out, dtype=dt, **kw), post, opts)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,
                             opts: Any = None) -> Work:
        check_tensor(output, "reduce_scatter output", self._devices)
        check_tensor(input, "reduce_scatter input", self._devices)
        red = red_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if output.dtype != input.dtype or input.numel() != output.numel() * self.size():
            raise ValueError(f"railyard: reduce_scatter input must have world_size * "
                             f"{output.numel()} elements of {output.dtype}, got "
                             f"{input.numel()} of {input.dtype}")
        stream = self._stream([output, input], "reduce_scatter")
        io = self._io(stream)
        src, dt = self._array(io.input(input), red, stream)
        out, _ = self._array(io.output(output), red, stream)
        return self._start([output], io, lambda kw: self.comm.reduce_scatter(
            src, red, out=out, dtype=dt, **kw), opts=opts, stream=stream)

    def reduce_scatter(self, output_tensors: List[torch.Tensor],
                       input_tensors: List[List[torch.Tensor]], opts: Any = None) -> Work:
        t = self._one(output_tensors, "reduce_scatter", on_devices=True)
        red = red_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if len(input_tensors) != 1 or len(input_tensors[0]) != self.size():
            raise ValueError(f"railyard: reduce_scatter needs one list of {self.size()} input "
                             "tensors")
        for i in input_tensors[0]:
            check_tensor(i, "reduce_scatter input", self._devices)
            if i.numel() != t.numel() or i.dtype != t.dtype:
                raise ValueError("railyard: reduce_scatter inputs must match the output's size "
                                 "and dtype")
        stream = self._stream([t] + list(input_tensors[0]), "reduce_scatter")
        stacked = self._flat(input_tensors[0], stream)
        io = self._io(stream)
        src, dt = self._array(stacked, red, stream)
        out, _ = self._array(io.output(t), red, stream)
        return self._start([t], io, lambda kw: self.comm.reduce_scatter(
            src, red, out=out, dtype=dt, **kw), opts=opts, stream=stream)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: List[int], input_split_sizes: List[int],
                      opts: Any = None) -> Work:
        check_tensor(output, "all_to_all output", self._devices)
        check_tensor(input, "all_to_all input", self._devices)
        if output.dtype != input.dtype:
            raise ValueError("railyard: all_to_all input and output dtypes differ")
        stream = self._stream([output, input], "all_to_all")
        io = self._io(stream)
        src, dt = self._array(io.input(input), None, stream)
        out, _ = self._array(io.output(output), None, stream)
        n = self.size()
        if not output_split_sizes and not input_split_sizes:
            if src.size != out.size or src.size % n:
                raise ValueError(f"railyard: all_to_all_single needs equal input and output "
                                 f"sizes divisible by {n}")
            return self._start([output], io, lambda kw: self.comm.all_to_all(
                src, out=out, dtype=dt, **kw), opts=opts, stream=stream)
        # Split sizes count rows (dim 0); counts for the daemon are elements (or bytes).
        def counts(t: torch.Tensor, arr: Any, splits: List[int]) -> List[int]:
            if not splits:
                if t.shape[0] % n:
                    raise ValueError(f"railyard: dim 0 ({t.shape[0]}) not divisible by {n}")
                splits = [t.shape[0] // n] * n
            if len(splits) != n or sum(splits) != (t.shape[0] if t.dim() else 1):
                raise ValueError(f"railyard: split sizes {splits} do not split dim 0 "
                                 f"({t.shape[0] if t.dim() else 1}) in {n}")
            per_row = arr.size // max(t.shape[0] if t.dim() else 1, 1)
            return [s * per_row for s in splits]

        sc = counts(input, src, list(input_split_sizes))
        rc = counts(output, out, list(output_split_sizes))
        return self._start([output], io, lambda kw: self.comm.all_to_all_v(
            src, sc, rc, out=out, dtype=dt, **kw), opts=opts, stream=stream)

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> Work:
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"railyard: all_to_all needs {n} input and {n} output tensors")
        for t in list(input_tensors) + list(output_tensors):
            check_tensor(t, "all_to_all")
            if t.dtype != input_tensors[0].dtype:
                raise ValueError("railyard: all_to_all tensors must share a dtype")
        flat_in = torch.cat([t.detach().reshape(-1) for t in input_tensors])
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)
        src, dt = as_numpy(flat_in, None)
        out, _ = as_numpy(flat_out, None)
        scale = src.size // max(flat_in.numel(), 1) if flat_in.numel() else 1
        sc = [t.numel() * scale for t in input_tensors]
        rc = [t.numel() * scale for t in output_tensors]

        def post() -> None:
            offset = 0
            with torch.no_grad():
                for t in output_tensors:
                    t.copy_(flat_out[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

        return self._start(list(output_tensors), Io(), lambda kw: self.comm.all_to_all_v(
            src, sc, rc, out=out, dtype=dt, **kw), post, opts)

    def scatter(self, output_tensors: List[torch.Tensor],
                input_tensors: List[List[torch.Tensor]], opts: Any = None) -> Work:
        t = self._one(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        n = self.size()
        if self.rank() == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != n:
                raise ValueError(f"railyard: scatter needs {n} input tensors on the root")
            flat_in = torch.cat([i.detach().reshape(-1) for i in input_tensors[0]])
        else:
            flat_in = torch.empty(0, dtype=t.dtype)
        io = Io()
        src, dt = as_numpy(flat_in, None)
        out, _ = as_numpy(io.output(t), None)
        scale = out.size // max(t.numel(), 1) if t.numel() else 1
        c = t.numel() * scale
        sc = [c] * n if self.rank() == root else [0] * n
        rc = [c if p == root else 0 for p in range(n)]
        if src.size == 0:  # no send buffer needed, but the array must exist
            src = np.empty(1, dtype=out.dtype)
        return self._start([t], io, lambda kw: self.comm.all_to_all_v(
            src, sc, rc, out=out, dtype=dt, **kw), opts=opts)

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Work:
        t = self._one(tensors, "send")
        return self._start([t], Io(), lambda kw: self._p2p.send(t, dst, kw["timeout"]))

    def _claim(self, tensors: List[torch.Tensor], src: Optional[int], what: str,
               timeout: Optional[float] = None) -> Claim:
        t = self._one(tensors, what)
        io = Io()
        out, dt = as_numpy(io.output(t), None)
        seconds = self._op_timeout if timeout is None else timeout
        work = Work([t], io.finish, seconds)
        return Claim(next(self._p2p.seq), src, t, out, dt, work, seconds)

    def _post(self, claim: Claim) -> Work:
        try:
            (self._p2p.recv if claim.peer is not None else self._p2p.recv_any)(claim)
        except BaseException:
            with live_lock:
                live_works.pop(id(claim.work), None)
            raise
        return claim.work

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Work:
        return self._post(self._claim(tensors, src, "recv"))

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Work:
        """Receives the first message any peer sends (``Work._source_rank()`` names it)."""
        return self._post(self._claim(tensors, None, "recv"))

    def barrier(self, opts: Any = None) -> Work:
        return self._start([], Io(), lambda kw: self.comm.barrier(**kw), opts=opts)

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """A barrier that names the ranks that did not reach it, as gloo's does (same words):
        every other rank sends to rank 0 and waits for its answer; rank 0 waits up to
        ``timeout`` (default: the group's) for them, then answers each. Rank 0 raises naming
        the first rank that did not arrive (every such rank with ``wait_all_ranks``); a missing
        rank's receive times out in the daemon, which aborts the communicator, so the ranks
        that did arrive fail too instead of waiting."""
        seconds = _seconds(timeout, "monitored_barrier timeout")
        seconds = self._op_timeout if seconds is None else min(seconds, MAX_TIMEOUT)
        ms = int(seconds * 1000)
        rank, n = self.rank(), self.size()
        token = [torch.tensor([rank], dtype=torch.int64)]
        if rank != 0:
            try:
                sent = self.send(token, 0)
                got = self.recv([torch.zeros(1, dtype=torch.int64)], 0)
                sent.wait()
                got.wait()
            except Exception as e:
                raise RuntimeError(
                    f"Rank {rank} successfully reached monitoredBarrier, but received errors "
                    "while waiting for send/recv from rank 0. Please check rank 0 logs for "
                    f"faulty rank.\n Original exception: \n{e}") from e
            return
        start = time.monotonic()

        def wait_loop(works: Dict[int, Work]) -> None:
            processed: List[int] = []
            failed: List[int] = []
            for r, work in works.items():
                remaining = seconds - (time.monotonic() - start)
                if not wait_all_ranks and remaining <= 0:
                    raise RuntimeError(
                        f"Rank 0 timed out in monitoredBarrier after {ms} ms.\n" +
                        (f"Successfully processed ranks: {', '.join(map(str, processed))}"
                         if processed else "No ranks successfully processed in "
                                           "monitoredBarrier."))
                try:
                    work.wait(seconds if wait_all_ranks else remaining)
                    processed.append(r)
                except Exception as e:
                    error = f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {ms} ms"
                    if not wait_all_ranks:
                        raise RuntimeError(f"{error}\n Original exception: \n{e}") from e
                    failed.append(r)
            if failed:
                raise RuntimeError(f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed to "
                                   f"pass monitoredBarrier in {ms} ms")

        if seconds <= 0:  # nothing to wait with: posting receives would only abort the group
            raise RuntimeError(f"Rank 0 timed out in monitoredBarrier after {ms} ms.\n"
                               "No ranks successfully processed in monitoredBarrier.")
        recvs = {}
        for r in range(1, n):
            recvs[r] = self._post(self._claim([torch.zeros(1, dtype=torch.int64)], r,
                                              "monitored_barrier", seconds))
        wait_loop(recvs)
        # Every rank has arrived: release them (this is a true barrier: all pass or none do).
        sends = {}
        for r in range(1, n):
            t = token[0]
            sends[r] = self._start([t], Io(), lambda kw, r=r: self._p2p.send(t, r, kw["timeout"]),
                                   timeout=seconds)
        wait_loop(sends)

    # -- shared tensors ------------------------------------------------------------------------

    def empty(self, *size: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A tensor in shared memory registered with this group's daemon: collectives on it
        (or on contiguous views of it) copy nothing."""
        return empty(*size, dtype=dtype, client=self.client)


def empty(*size: Any, dtype: torch.dtype = torch.float32,
          client: Optional["railyard.Client"] = None) -> torch.Tensor:
    """A CPU tensor in railyard shared memory: collectives of the railyard backend on it (or on
    contiguous views of it) are zero-copy. Uses the process's shared session unless ``client``
    is given."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    client = client if client is not None else shared_client()
    probe = torch.empty(0, dtype=dtype)
    if dtype == torch.bfloat16:
        return torch.from_numpy(client.empty(size, np.int16)).view(torch.bfloat16)
    np_dtype = probe.numpy().dtype if dtype != torch.bool else np.dtype(np.bool_)
    return torch.from_numpy(client.empty(size, np_dtype))


def create_process_group(store: Any, rank: int, world_size: int,
                         timeout: timedelta) -> ProcessGroupRailyard:
    """The creator registered with ``torch.distributed.Backend.register_backend``."""
    return ProcessGroupRailyard(store, rank, world_size, timeout)


live_groups: "weakref.WeakSet[ProcessGroupRailyard]" = weakref.WeakSet()
_cuda_tensors = CudaTensors()
