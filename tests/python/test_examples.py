"""The examples, the launcher, the benchmark script (smoke run, not timed) and pip packaging."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
requires_torch = pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch (python3-torch) not installed")


def run(cmd, env_extra, timeout=150, cwd=None):
    env = dict(os.environ)
    env.update(env_extra)
    proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout)
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, f"{cmd} exited with {proc.returncode}:\n{out}"
    return out


def test_allreduce_example(daemon):
    out = run([sys.executable, os.path.join(REPO, "examples", "python", "allreduce.py"),
               "--count", "4096", "--iters", "3"],
              {"RAILYARD_SOCKET": daemon.socket, "RAILYARD_JOB": "ex-allreduce"})
    assert out.count("sum ok = 10") == 4, out
    assert out.count("(node 0, local rank") == 2, out
    assert out.count("(node 1, local rank") == 2, out


@requires_torch
def test_ddp_example(daemon):
    out = run([sys.executable, os.path.join(REPO, "examples", "python", "ddp_train.py"),
               "--nproc", "2", "--steps", "3"],
              {"RAILYARD_SOCKET": daemon.socket, "RAILYARD_JOB": "ex-ddp"})
    assert "step   2  loss" in out and "railyard: 2 ranks, 3 steps" in out, out


def test_launch_module(daemon, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import os, numpy as np, railyard
        comm = railyard.init_from_env(timeout=30)
        x = np.full(3, comm.rank + 1, np.int32)
        comm.all_reduce(x)
        line = (f"rank {comm.rank} local {comm.local_rank} of {comm.nranks} "
                f"node {os.environ['GROUP_RANK']} sum {int(x[0])}\\n")
        os.write(1, line.encode())  # one write: lines of concurrent ranks do not interleave
    """))
    out = run([sys.executable, "-m", "railyard.launch", "--nproc", "3", "--nodes", "2",
               "--timeout", "60", str(script)],
              {"RAILYARD_SOCKET": daemon.socket, "RAILYARD_JOB": "ex-launch"})
    for line in ("rank 0 local 0 of 3 node 0 sum 6", "rank 1 local 1 of 3 node 0 sum 6",
                 "rank 2 local 0 of 3 node 1 sum 6"):
        assert line in out, out


def test_launch_stops_everyone_when_a_rank_fails(daemon, tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys, time\n"
                      "sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(60)\n")
    env = dict(os.environ, RAILYARD_SOCKET=daemon.socket, RAILYARD_JOB="ex-fail")
    proc = subprocess.run([sys.executable, "-m", "railyard.launch", "--nproc", "2", str(script)],
                          env=env, timeout=40, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.returncode == 3


@requires_torch
def test_benchmark_smoke(daemon):
    out = run([sys.executable, os.path.join(REPO, "bench", "torch_allreduce_vs_gloo.py"),
               "--nproc", "2", "--sizes", "4,65536", "--iters", "2", "--warmup", "1",
               "--socket", daemon.socket], {"RAILYARD_JOB": "ex-bench"})
    assert any("railyard-shared" in line and "gloo" in line for line in out.splitlines()), out
    assert "64 KiB" in out, out


@pytest.mark.skipif(subprocess.run([sys.executable, "-m", "pip", "--version"],
                                   stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL).returncode != 0,
                    reason="pip is not installed")
def test_pip_install(tmp_path):
    """``pip install ./client/python`` (offline: --no-build-isolation) generates the stubs."""
    repo = tmp_path / "repo"  # a copy: pip builds in the source tree
    ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "v1")
    shutil.copytree(os.path.join(REPO, "client", "python"), repo / "client" / "python",
                    ignore=ignore)
    shutil.copytree(os.path.join(REPO, "proto"), repo / "proto")
    shutil.copy(os.path.join(REPO, "CMakeLists.txt"), repo / "CMakeLists.txt")  # the version
    site = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
         "--no-index", "--target", str(site), str(repo / "client" / "python")], {}, timeout=300)
    out = run([sys.executable, "-c",
               "import railyard, railyard.launch, railyard.v1.local_pb2_grpc as g; "
               "from railyard._version import VERSION; "
               "print(railyard.__file__, g.LocalStub.__name__, 'version', VERSION)"],
              {"PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"}, cwd=str(tmp_path))
    assert str(site) in out and "LocalStub" in out, out
    # One version: project(VERSION) of the top CMakeLists.txt.
    import re
    cmake = open(os.path.join(REPO, "CMakeLists.txt")).read()
    want = re.search(r"project\(railyard VERSION (\S+)", cmake).group(1)
    assert f"version {want}" in out, out
