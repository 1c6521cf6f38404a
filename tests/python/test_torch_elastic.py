"""torch elastic with the railyard backend (issue 58, torch): ``torchrun --max_restarts`` runs a
2-rank DDP job; on its first attempt rank 1 is SIGKILLed mid-training; the elastic agent stops
the group and starts it again, which re-creates the process group on railyard and resumes from
the last step's checkpoint. The job finishes, and its final weights and per-step losses equal an
uninterrupted run's."""

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, os, signal, sys
import torch
import torch.distributed as dist
import railyard.torch  # registers the backend (torch 1.13 does not autoload it)

dist.init_process_group("railyard")
rank, world = dist.get_rank(), dist.get_world_size()
out = os.environ["OUT"]
ckpt = os.path.join(out, "ckpt.pt")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
ddp = torch.nn.parallel.DistributedDataParallel(model)
steps = int(os.environ["STEPS"])
kill_at = int(os.environ.get("KILL_AT", "-1"))
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
for step in range(start, steps):
    g = torch.Generator().manual_seed(step * 100 + rank)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    opt.step()
    t = loss.detach().clone()
    dist.all_reduce(t)
    if rank == 0:
        tmp = ckpt + ".tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, tmp)
        os.replace(tmp, ckpt)
        with open(os.path.join(out, "losses.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, "loss": float(t) / world, "attempt": attempt}) + "\n")
    if step == kill_at and attempt == 0 and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
if rank == 0:
    torch.save({k: v for k, v in model.state_dict().items()}, os.path.join(out, "final.pt"))
dist.destroy_process_group()
"""


def torchrun(tmp_path, daemon, name, steps, kill_at=None):
    out = tmp_path / name
    out.mkdir()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, RAILYARD_SOCKET=daemon.socket, RAILYARD_JOB=f"elastic-{name}",
               RAILYARD_TOKEN="", OUT=str(out), STEPS=str(steps), OMP_NUM_THREADS="1")
    if kill_at is not None:
        env["KILL_AT"] = str(kill_at)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nnodes=1", "--nproc_per_node=2", "--max_restarts=2",
                          "--monitor_interval=0.2",
                          # Debian torch 1.13 on Python 3.11: Std.from_str("0") is None (3.11
                          # does not iterate an IntFlag's 0), so name a real stream.
                          "--redirects=2", "--tee=2", "--log_dir", str(out / "logs"), str(script)],
                         env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    losses = {}
    attempts = set()
    for line in (out / "losses.jsonl").read_text().splitlines():
        rec = json.loads(line)
        losses[rec["step"]] = rec["loss"]  # a step run again after the restart: its last value
        attempts.add(rec["attempt"])
    return losses, attempts, out, run.stderr


def test_a_killed_rank_restarts_the_group_and_training_resumes(tmp_path, daemon):
    import torch
    steps = 12
    ref, ref_attempts, ref_out, _ = torchrun(tmp_path, daemon, "reference", steps)
    assert ref_attempts == {0}
    got, attempts, out, log = torchrun(tmp_path, daemon, "killed", steps, kill_at=4)
    assert attempts == {0, 1}, (attempts, log[-3000:])  # the agent restarted the group once
    assert sorted(got) == list(range(steps)) == sorted(ref)
    for step in range(steps):
        assert abs(got[step] - ref[step]) <= 1e-6 * max(1.0, abs(ref[step])), (step, got, ref)
    final, want = torch.load(out / "final.pt"), torch.load(ref_out / "final.pt")
    for k in want:
        assert torch.allclose(final[k], want[k], rtol=0, atol=1e-6), k
