"""client/python as an installable package (pyproject.toml): a wheel that carries the compiled
railyard._ringcore and the ``torch.backends`` entry point, installed into a fresh virtual
environment (offline: --no-index --no-build-isolation; --system-site-packages for Debian's
grpcio, protobuf, numpy and torch). There, torch's autoload of that entry point (what torch >=
2.5 does at ``import torch``; Debian's torch 1.13 does not, so the test does it as torch does)
makes ``dist.init_process_group("railyard")`` work without ``import railyard.torch``, across 2
ranks."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))

pytestmark = pytest.mark.skipif(
    subprocess.run([sys.executable, "-m", "pip", "--version"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL).returncode != 0, reason="pip is not installed")

# What torch >= 2.5 runs at the end of `import torch` (torch/__init__.py,
# _import_device_backends), then a job that names the backend without importing railyard.torch.
RANK_SCRIPT = r"""
import os, sys
from importlib.metadata import entry_points
import torch
for ep in entry_points(group="torch.backends"):
    ep.load()()
import torch.distributed as dist
assert "railyard.torch" in sys.modules, "the entry point did not register the backend"
import railyard, railyard._ringcore
assert os.path.realpath(railyard.__file__).startswith(os.path.realpath(sys.prefix)), railyard.__file__
rank = int(os.environ["RANK"])
dist.init_process_group("railyard", init_method="file://" + os.environ["STORE"], rank=rank,
                        world_size=2)
t = torch.arange(6, dtype=torch.float32) * (rank + 1)
dist.all_reduce(t)
assert t.tolist() == [3.0 * i for i in range(6)], t
print("rank", rank, "backend", dist.get_backend(), "ok", flush=True)
dist.destroy_process_group()
"""


def run(cmd, env=None, cwd=None, timeout=300):
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}:\n{out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr


def test_wheel_into_a_fresh_venv_registers_the_backend_through_its_entry_point(tmp_path, daemon):
    repo = tmp_path / "repo"  # a copy: setuptools builds in the source tree
    ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "v1", "*.so")
    shutil.copytree(os.path.join(REPO, "client", "python"), repo / "client" / "python",
                    ignore=ignore)
    shutil.copytree(os.path.join(REPO, "proto"), repo / "proto")
    shutil.copy(os.path.join(REPO, "CMakeLists.txt"), repo / "CMakeLists.txt")
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(wheels), str(repo / "client" / "python")])
    [wheel] = list(wheels.glob("railyard-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("railyard/_ringcore") and n.endswith(".so") for n in names), names
    assert "railyard/v1/local_pb2_grpc.py" in names, names
    [ep] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    eps = zipfile.ZipFile(wheel).read(ep).decode()
    assert "[torch.backends]\nrailyard = railyard.torch_autoload:autoload" in eps, eps

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
    py = str(venv / "bin" / "python")
    run([py, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)])
    env = dict(os.environ, RAILYARD_SOCKET=daemon.socket, RAILYARD_JOB="pytest-wheel",
               RAILYARD_TOKEN="", STORE=str(tmp_path / "store"), PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)  # only what the venv has installed
    procs = [subprocess.Popen([py, "-c", RANK_SCRIPT], env=dict(env, RANK=str(r)),
                              cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out
        assert f"rank {r} backend railyard ok" in out, out
