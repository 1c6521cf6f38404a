"""Device tensors through the torch backend (docs/gpu.md, "From torch") against a real railyardd
with fake GPUs (--fake_gpus). Debian's torch has no CUDA, so the tensors here are CPU tensors
over fake device memory (memfds the daemon imports as device allocations), served to the backend
by a fake DeviceTensors, and their stream is a thread (fake_gpu.FakeStream): every operation
goes the device way (registration by descriptor, stream=, temporaries and copies as stream
work), and the values are checked through this process's mapping of the memory. The CUDA side
(CudaTensors: torch's caching allocator, legacy IPC, torch.cuda streams) runs only on a GPU:
tests/python/test_cuda_python.py.
"""

from __future__ import annotations

import gc
import threading
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import Daemon
from fake_gpu import FakeDeviceMemory, FakeStream, FakeStreamOps

import railyard
from railyard.torch import DeviceTensors, ProcessGroupRailyard


@pytest.fixture(scope="module")
def gpu_daemon():
    d = Daemon("--fake_gpus=1", node_name="pytest-torch-gpu")
    yield d
    d.stop()


class FakeTensors(DeviceTensors):
    """Tensors in fake device memory (one FakeDeviceMemory each), ordered on one FakeStream."""

    kind = "fake device tensors"

    def __init__(self):
        self.fake_stream = FakeStream()
        self.mems = []  # (memory, base address, the whole tensor over it)
        self.registered = 0
        self._regs = {}

    def tensor(self, shape, dtype):
        """A new tensor of ``shape`` and ``dtype`` in fake device memory."""
        shape = tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
        mem = FakeDeviceMemory(max(nbytes, 64))
        whole = torch.frombuffer(mem.map, dtype=torch.uint8)
        self.mems.append((mem, whole.data_ptr(), whole))
        return whole[:nbytes].view(dtype).view(shape)

    def _find(self, t):
        ptr = t.data_ptr()
        for i, (mem, base, _) in enumerate(self.mems):
            if base <= ptr < base + mem.nbytes:
                return i
        return None

    def owns(self, t):
        return t.device.type == "cpu" and t.numel() > 0 and self._find(t) is not None

    def array(self, client, t):
        i = self._find(t)
        mem, base, _ = self.mems[i]
        reg = self._regs.get(i)
        if reg is None:
            reg = self._regs[i] = client.register_device_memory(mem.fd, mem.nbytes, 0,
                                                                dtype=np.uint8)
            self.registered += 1
        return reg.part(t.data_ptr() - base, t.numel() * t.element_size())

    def stream(self, t):
        return self.fake_stream

    def on_stream(self, stream, fn):
        stream.put(fn)

    def empty(self, shape, dtype, like):
        return self.tensor(shape, dtype)

    def sync(self):
        """Waits until the stream has run everything put on it so far."""
        done = threading.Event()
        self.fake_stream.put(done.set)
        assert done.wait(20), "the stream is stuck"

    def close(self):
        self.fake_stream.finish()
        self._regs.clear()
        made, self.mems = self.mems, []
        del made[:]  # the tensors first: a mapping with views cannot close
        gc.collect()


def run_groups(gpu_daemon, fn, n=2, timeout=30.0):
    """fn(rank, group, fakes) on one thread per rank, each rank its own session and fake device
    tensors, the groups made as init_process_group makes them (one store); returns the results,
    raising the first error."""
    store = dist.HashStore()
    clients = [railyard.connect(gpu_daemon.socket, job="torch-gpu", stream_ops=FakeStreamOps())
               for _ in range(n)]
    fakes = [FakeTensors() for _ in range(n)]
    results, errors = [None] * n, []

    def rank(r):
        try:
            group = ProcessGroupRailyard(store, r, n, timedelta(seconds=timeout),
                                         client=clients[r], device_tensors=fakes[r])
            results[r] = fn(r, group, fakes[r])
            group.barrier().wait()
            group.shutdown()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    try:
        if errors:
            raise errors[0]
        for f in fakes:
            f.close()
    finally:
        for c in clients:
            c.close()
    return results


def values(n, r, dtype=torch.float32):
    return ((torch.arange(n) % 13) * (r + 1)).to(dtype)


def test_an_all_reduce_of_device_tensors_is_ordered_on_the_stream_both_ways(gpu_daemon):
    n = 4099

    def rank(r, group, fakes):
        t = fakes.tensor((n,), torch.float32)
        t.fill_(-1)
        go, seen = threading.Event(), []

        def produce():  # the stream's earlier work: it writes the input, once told to
            assert go.wait(20)
            t.copy_(values(n, r))

        fakes.on_stream(fakes.fake_stream, produce)
        work = group.allreduce([t])
        fakes.on_stream(fakes.fake_stream, lambda: seen.append(t.clone()))  # later work
        assert not work.is_completed()  # neither stream has reached the operation
        go.set()
        work.wait()
        fakes.sync()
        assert torch.equal(seen[0], values(n, 0) * 3)
        assert fakes.registered == 1  # through the daemon, not a host copy
        return True

    assert run_groups(gpu_daemon, rank) == [True, True]


def test_every_device_collective_with_temporaries_and_copies_as_stream_work(gpu_daemon):
    n, w = 1030, 2

    def rank(r, group, fakes):
        dev = fakes.tensor
        checks = {}
        # all_reduce: a bfloat16 tensor, and a non-contiguous one (its contiguous copy and the
        # copy back are stream work)
        b = dev((n,), torch.bfloat16)
        b.copy_(values(n, r, torch.bfloat16))
        group.allreduce([b]).wait()
        checks["bf16"] = torch.equal(b.float(), values(n, 0) * 3)
        m = dev((n, 4), torch.float32)
        m.copy_(values(4 * n, r).view(n, 4))
        col = m[:, 1]
        assert not col.is_contiguous()
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        group.allreduce([col], opts).wait()
        fakes.sync()  # the copy back is stream work behind the operation
        expect = values(4 * n, r).view(n, 4)
        expect[:, 1] = values(4 * n, 1).view(n, 4)[:, 1]
        checks["strided max"] = torch.equal(m, expect)
        # all_reduce_coalesced: flattened into one temporary and back
        parts = [dev((7,), torch.int32), dev((3, 5), torch.int32)]
        for i, p in enumerate(parts):
            p.copy_(values(p.numel(), r + i, torch.int32).view(p.shape))
        group.allreduce_coalesced(parts).wait()
        fakes.sync()
        checks["coalesced"] = all(
            torch.equal(p, (values(p.numel(), i, torch.int32) + values(p.numel(), 1 + i,
                                                                       torch.int32)).view(p.shape))
            for i, p in enumerate(parts))
        # broadcast and reduce from rank 1
        x = dev((n,), torch.float64)
        x.copy_(values(n, r, torch.float64))
        bo = dist.BroadcastOptions()
        bo.rootRank = 1
        group.broadcast([x], bo).wait()
        checks["broadcast"] = torch.equal(x, values(n, 1, torch.float64))
        ro = dist.ReduceOptions()
        ro.rootRank, ro.reduceOp = 1, dist.ReduceOp.SUM
        group.reduce([x], ro).wait()
        if r == 1:
            checks["reduce"] = torch.equal(x, 2 * values(n, 1, torch.float64))
        # all_gather into one tensor and into a list (a gathered temporary copied out)
        src = dev((n,), torch.int64)
        src.copy_(values(n, r, torch.int64))
        out = dev((w * n,), torch.int64)
        group._allgather_base(out, src).wait()
        checks["all_gather_base"] = torch.equal(
            out, torch.cat([values(n, p, torch.int64) for p in range(w)]))
        outs = [dev((n,), torch.int64) for _ in range(w)]
        group.allgather([outs], [src]).wait()
        fakes.sync()  # the copies out of the gathered temporary are stream work
        checks["all_gather list"] = all(torch.equal(o, values(n, p, torch.int64))
                                        for p, o in enumerate(outs))
        # reduce_scatter from one tensor and from a list (stacked by stream work)
        big = dev((w * n,), torch.float32)
        big.copy_(values(w * n, r))
        mine = dev((n,), torch.float32)
        group._reduce_scatter_base(mine, big).wait()
        checks["reduce_scatter_base"] = torch.equal(mine, 3 * values(w * n, 0)[r * n:(r + 1) * n])
        ins = [dev((n,), torch.float32) for _ in range(w)]
        for p, i in enumerate(ins):
            i.copy_(values(n, r + p))
        group.reduce_scatter([mine], [ins]).wait()
        checks["reduce_scatter list"] = torch.equal(mine, values(n, r) + values(n, 1 + r))
        # all_to_all_single, equal and uneven splits
        a = dev((w * 6,), torch.uint8)
        a.copy_(torch.arange(w * 6, dtype=torch.uint8) + 100 * r)
        ao = dev((w * 6,), torch.uint8)
        group.alltoall_base(ao, a, [], []).wait()
        checks["all_to_all"] = torch.equal(ao, torch.cat(
            [torch.arange(r * 6, r * 6 + 6, dtype=torch.uint8) + 100 * p for p in range(w)]))
        splits_in = [[1, 3], [2, 2]][r]
        splits_out = [[1, 2], [3, 2]][r]
        rows = dev((4, 2), torch.float32)
        rows.copy_(torch.arange(8, dtype=torch.float32).view(4, 2) + 10 * r)
        got = dev((sum(splits_out), 2), torch.float32)
        group.alltoall_base(got, rows, splits_out, splits_in).wait()
        expect_rows = []
        for p in range(w):
            p_in = [[1, 3], [2, 2]][p]
            start = sum(p_in[:r])
            sent = torch.arange(8, dtype=torch.float32).view(4, 2) + 10 * p
            expect_rows.append(sent[start:start + p_in[r]])
        checks["all_to_all_v"] = torch.equal(got, torch.cat(expect_rows))
        # a future of a device operation
        f = dev((5,), torch.float32)
        f.fill_(r + 1)
        fut = group.allreduce([f]).get_future()
        checks["future"] = torch.equal(fut.wait()[0], torch.full((5,), 3.0))
        return checks

    results = run_groups(gpu_daemon, rank)
    for r, checks in enumerate(results):
        assert checks and all(checks.values()), (r, checks)
    assert "reduce" in results[1]


def test_device_tensors_where_they_cannot_go_are_refused_saying_why(gpu_daemon):
    def rank(r, group, fakes):
        dev = fakes.tensor((8,), torch.float32)
        host = torch.zeros(16)
        with pytest.raises(ValueError, match="all_gather mixes CPU and device tensors"):
            group._allgather_base(host, dev)
        meta = torch.empty(8, device="meta")
        with pytest.raises(ValueError, match=r"all_reduce is on meta; the railyard backend takes "
                                             r"CPU tensors and fake device tensors only"):
            group.allreduce([meta])
        with pytest.raises(ValueError, match=r"send is on meta; the railyard backend runs it on "
                                             r"CPU tensors only \(device tensors: all_reduce, "):
            group.send([meta], 1 - r)
        with pytest.raises(ValueError, match="is not supported for bool"):
            opts = dist.AllreduceOptions()
            group.allreduce([fakes.tensor((4,), torch.bool)], opts)
        # Nothing was submitted: the group still works.
        dev.fill_(r)
        group.allreduce([dev]).wait()
        return torch.equal(dev, torch.ones(8))

    assert run_groups(gpu_daemon, rank) == [True, True]
