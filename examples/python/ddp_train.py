#!/usr/bin/python3
"""DistributedDataParallel over railyard: a small MLP on synthetic data, per-step loss printed.

    railyardd --socket /tmp/ry.sock --insecure_first_session_token &
    RAILYARD_SOCKET=/tmp/ry.sock /usr/bin/python3 examples/python/ddp_train.py --nproc 2

Starts --nproc processes itself (torch.multiprocessing, spawn) that rendezvous through a c10d
FileStore; under torchrun (RANK, WORLD_SIZE, MASTER_ADDR set) it uses init_method="env://"
instead. The only railyard-specific lines are ``import railyard.torch`` and the backend name;
``--backend gloo`` runs the very same training on gloo, for comparison.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import railyard.torch  # noqa: F401  registers the "railyard" backend


def train(rank: int, world_size: int, args: argparse.Namespace, store_path: str) -> None:
    if store_path:
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(args.backend, rank=rank, world_size=world_size, store=store)
    else:  # torchrun
        dist.init_process_group(args.backend, init_method="env://")
        rank, world_size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    # Synthetic regression data, a different shard per rank.
    gen = torch.Generator().manual_seed(args.seed + 1 + rank)
    w_true = torch.randn(32, 1, generator=torch.Generator().manual_seed(args.seed)) / 32 ** 0.5
    start = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(args.batch, 32, generator=gen)
        y = x @ w_true + 0.05 * torch.randn(args.batch, 1, generator=gen)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP all_reduces gradient buckets asynchronously, during backward
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # SUM: gloo has no AVG
        if rank == 0:
            print(f"step {step:3d}  loss {mean.item() / world_size:.6f}", flush=True)
    if rank == 0:
        print(f"{args.backend}: {world_size} ranks, {args.steps} steps in "
              f"{time.perf_counter() - start:.2f} s", flush=True)
    # DDP before the group: the group's last owner runs its destructor, and with gloo only the
    # group's Python object does that without holding the GIL (a DDP outliving the group can
    # hang here, its Reducer waiting for gloo threads that wait for the GIL).
    del ddp
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="railyard", choices=["railyard", "gloo"])
    args = parser.parse_args()
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, "")
        return 0
    with tempfile.TemporaryDirectory(prefix="ddp-") as tmp:
        mp.start_processes(train, args=(args.nproc, args, os.path.join(tmp, "store")),
                           nprocs=args.nproc, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
