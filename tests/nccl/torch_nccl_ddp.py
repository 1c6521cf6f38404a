"""torch's own ProcessGroupNCCL on railyard's libnccl.so.2 (LD_PRELOAD): a DDP job on cuda
tensors whose per-step losses must match the same job on CPU with gloo (scripts/device-check.sh,
step nccl). Every rank on device 0, which NCCL itself refuses ("Duplicate GPU detected") and
railyard allows.

    LD_PRELOAD=<build>/nccl/libnccl.so.2 RAILYARD_SOCKET=... python3 torch_nccl_ddp.py --nproc 2

Prints one line per step and backend, then "ddp steps match" or the first difference. Exit 0
when they match; 3 when torch has no CUDA (nothing to compare: the caller reports it)."""

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train(rank, nproc, backend, store_path, steps, out):
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                            world_size=nproc)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 8)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[0] if backend == "nccl" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 64, generator=gen).to(device)
        y = torch.randn(32, 8, generator=gen).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(float(t.cpu()) / nproc)
    if rank == 0:
        out.put(losses)
    dist.barrier()
    dist.destroy_process_group()


def run(backend, nproc, steps):
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=train, args=(r, nproc, backend, os.path.join(tmp, "store"),
                                                 steps, q)) for r in range(nproc)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
        if any(p.exitcode != 0 for p in procs):
            raise SystemExit(f"{backend}: a rank failed: {[p.exitcode for p in procs]}")
        return q.get()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(f"torch {torch.__version__} has no CUDA: ProcessGroupNCCL cannot run here")
        return 3
    nccl = run("nccl", a.nproc, a.steps)
    gloo = run("gloo", a.nproc, a.steps)
    for i, (n, g) in enumerate(zip(nccl, gloo)):
        print(f"step {i:3d}  nccl(railyard) {n:.6f}  gloo(cpu) {g:.6f}")
    bad = [i for i, (n, g) in enumerate(zip(nccl, gloo)) if abs(n - g) > 1e-4 * max(1, abs(g))]
    if bad:
        print(f"ddp steps differ from step {bad[0]}")
        return 1
    print(f"ddp steps match ({a.steps} steps, {a.nproc} ranks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
