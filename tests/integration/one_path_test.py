"""One execution path on one node: the algorithm a one-node communicator runs is chosen by the
same planner as across nodes. By default the tuner picks `local` (the single-pass kernels);
RAILYARD_ALGO=ring runs the ring schedule, and /metrics labels each collective with what ran.
railyard-perf checks every result (-c 1), so the forced ring is also checked for correctness.

Run by CTest (one_path_test) with RAILYARDD and RAILYARD_PERF in the environment.
"""

import os
import re
import subprocess
import tempfile

import pytest

from virtual_nodes import http_get, start_daemon, stop


@pytest.fixture(scope="module")
def daemon():
    tmp = tempfile.mkdtemp(prefix="ry-onepath-")
    proc, sock, addr = start_daemon(tmp, "vnode0", rails=1)
    yield sock, addr
    stop(proc)


def perf(sock, op, algo, size="1M"):
    env = dict(os.environ)
    env.pop("RAILYARD_ALGO", None)
    if algo:
        env["RAILYARD_ALGO"] = algo
    out = subprocess.run(
        [os.environ["RAILYARD_PERF"], "--op", op, "-b", "8", "-e", size, "-f", "64", "-n", "3",
         "-w", "1", "-c", "1", "--daemons", sock, "--ranks-per-daemon", "2", "--deadline_s", "60"],
        env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Out of bounds values : 0 OK" in out.stdout, out.stdout
    return out.stdout


def collective_bytes(addr):
    """{(op, algorithm): bytes} from railyard_collective_bytes_total."""
    status, body = http_get(f"http://{addr}/metrics")
    assert status == 200
    out = {}
    for line in body.splitlines():
        m = re.match(r'railyard_collective_bytes_total\{algorithm="([^"]+)",job="[^"]*",'
                     r'op="([^"]+)",size_bucket="[^"]*"\} (\S+)', line)
        if m:
            out[(m.group(2), m.group(1))] = out.get((m.group(2), m.group(1)), 0) + float(m.group(3))
    return out


def test_default_is_local_and_ring_is_forced_and_labelled(daemon):
    sock, addr = daemon
    perf(sock, "allreduce", "")
    after_default = collective_bytes(addr)
    assert after_default.get(("allreduce", "local"), 0) > 0, after_default
    assert ("allreduce", "ring") not in after_default, after_default

    perf(sock, "allreduce", "ring")
    after_ring = collective_bytes(addr)
    # 8 B .. 1 MiB in x64 steps: 8, 512, 32768 B (and 1 MiB is past the last step's x64) per
    # iteration, 2 ranks: the ring moved bytes and the local count did not change.
    assert after_ring.get(("allreduce", "ring"), 0) > 0, after_ring
    assert after_ring[("allreduce", "local")] == after_default[("allreduce", "local")]


@pytest.mark.parametrize("op,algo", [("allgather", "ring"), ("reducescatter", "direct"),
                                     ("broadcast", "tree"), ("alltoall", "direct"),
                                     ("allreduce", "rhd")])
def test_every_forced_algorithm_runs_on_one_node(daemon, op, algo):
    sock, addr = daemon
    before = collective_bytes(addr).get((op, algo), 0)
    perf(sock, op, algo, size="64K")
    assert collective_bytes(addr).get((op, algo), 0) > before


def test_local_forced_on_one_node(daemon):
    sock, addr = daemon
    before = collective_bytes(addr).get(("reduce", "local"), 0)
    perf(sock, "reduce", "local", size="64K")
    assert collective_bytes(addr).get(("reduce", "local"), 0) > before


def test_an_algorithm_that_does_not_implement_the_op_leaves_it_to_the_tuner(daemon):
    # Like NCCL_ALGO: rhd implements allreduce (and barrier) only.
    sock, addr = daemon
    before = collective_bytes(addr)
    perf(sock, "reducescatter", "rhd", size="64K")
    after = collective_bytes(addr)
    assert ("reducescatter", "rhd") not in after, after
    assert after.get(("reducescatter", "local"), 0) > before.get(("reducescatter", "local"), 0)
