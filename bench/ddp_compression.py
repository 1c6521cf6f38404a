#!/usr/bin/python3
"""DDP step time with and without railyard.torch.compression_hook (issue 17): one rank per daemon
(--sockets S0,S1,...), an MLP of --width hidden units (its gradients: ~width^2 x 4 x 4 bytes in
DDP's 25 MiB buckets), --steps steps after --warmup; prints the median step time per codec, the
launches of the codecs interleaved --reps times. Not a test. On the emulated fabric:

    scripts/fabric.sh up --nodes 2 --rails 1 --rate 1gbit --dir /tmp/f --prefix rf-
    PYTHONPATH=build/python bench/ddp_compression.py --sockets /tmp/f/n0.sock,/tmp/f/n1.sock
    scripts/fabric.sh down --dir /tmp/f
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch.multiprocessing as mp


def rank_main(rank, world, sockets, store_path, codec, width, steps, warmup, out):
    os.environ["RAILYARD_SOCKET"] = sockets[rank]
    os.environ.setdefault("RAILYARD_JOB", "ddp-compression-bench")
    import torch
    import torch.distributed as dist
    import railyard.torch as rt
    dist.init_process_group("railyard", rank=rank, world_size=world,
                            store=dist.FileStore(store_path, world))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if codec != "none":
        ddp.register_comm_hook(None, rt.compression_hook(codec))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1 + rank)
    times = []
    for step in range(warmup + steps):
        x = torch.randn(32, 256, generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in model.parameters())
    del ddp
    dist.destroy_process_group()
    if rank == 0:
        out.put((params, times[warmup:]))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sockets", required=True)
    p.add_argument("--codecs", default="none,int8,fp16,topk:0.01")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    sockets = a.sockets.split(",")
    ctx = mp.get_context("spawn")
    medians = {c: [] for c in a.codecs.split(",")}
    params = 0
    for rep in range(a.reps):
        for codec in medians:
            with tempfile.TemporaryDirectory(prefix="ddpc-") as tmp:
                out = ctx.Queue()
                procs = [ctx.Process(target=rank_main,
                                     args=(r, len(sockets), sockets, os.path.join(tmp, "store"),
                                           codec, a.width, a.steps, a.warmup, out))
                         for r in range(len(sockets))]
                for pr in procs:
                    pr.start()
                params, times = out.get(timeout=600)
                for pr in procs:
                    pr.join(60)
                medians[codec].append(statistics.median(times))
    print(f"# DDP step (forward, backward with bucket all-reduces, SGD step) of an MLP with "
          f"{params} parameters ({params * 4 / 2**20:.1f} MiB of float32 gradients), "
          f"{len(sockets)} ranks on {len(sockets)} daemons; medians over {a.steps} steps, median "
          f"of {a.reps} interleaved launches")
    base = statistics.median(medians["none"]) if "none" in medians else None
    for codec, vals in medians.items():
        m = statistics.median(vals)
        print(f"{codec:>12} {m * 1e3:9.1f} ms" +
              (f"   {base / m:5.2f}x faster than none" if base and codec != "none" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
