"""Fixtures of the Python tests: a real railyardd on a temporary socket, and a pool of rank
processes (multiprocessing, spawn) that run test tasks against it.

Environment:
    RAILYARDD    the daemon binary (CTest sets it to the build's railyardd); default
                 <repo>/build/daemon/railyardd.
    PYTHONPATH   should hold the build tree's package copy (<build>/python, CTest sets it). When
                 ``import railyard`` finds no generated stubs, this conftest generates a copy in
                 a temporary directory with client/python/gen_stubs.py.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket as socketlib
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
_generated_dir: Optional[str] = None


def _ensure_package() -> None:
    """Makes ``import railyard`` work (with its stubs), here and in spawned processes."""
    global _generated_dir
    try:
        import railyard.v1.local_pb2  # noqa: F401
        return
    except ImportError:
        for name in [m for m in sys.modules if m == "railyard" or m.startswith("railyard.")]:
            del sys.modules[name]
    _generated_dir = tempfile.mkdtemp(prefix="rypy-pkg-")
    subprocess.run([sys.executable, os.path.join(REPO, "client", "python", "gen_stubs.py"),
                    "--proto-dir", os.path.join(REPO, "proto"), "--out", _generated_dir,
                    "--copy-package", os.path.join(REPO, "client", "python", "railyard")],
                   check=True)
    sys.path.insert(0, _generated_dir)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [_generated_dir] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


_ensure_package()
# Rank processes import the tests' helper module by name.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [os.path.dirname(os.path.abspath(__file__))]
    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

import rank_tasks  # noqa: E402


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    if _generated_dir:
        shutil.rmtree(_generated_dir, ignore_errors=True)


# Flags only the test build of the daemon serves (railyardd-testing, daemon/test_hooks.h).
TEST_ONLY_FLAGS = ("--fake_gpus", "--test_flip_bit_every")


def railyardd_path(flags: Tuple[str, ...] = ()) -> str:
    """The installed daemon ($RAILYARDD), or its test build ($RAILYARDD_TESTING) when one of
    flags is test-only."""
    if any(f.startswith(TEST_ONLY_FLAGS) for f in flags):
        name, default = "RAILYARDD_TESTING", os.path.join(REPO, "build", "tests", "support",
                                                          "railyardd-testing")
    else:
        name, default = "RAILYARDD", os.path.join(REPO, "build", "daemon", "railyardd")
    path = os.environ.get(name) or default
    if not os.access(path, os.X_OK):
        pytest.exit(f"{name} not found at {path}: build it and set {name}", returncode=4)
    return path


def socket_accepts(path: str) -> bool:
    s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Daemon:
    """A railyardd process on a socket in a fresh temporary directory."""

    def __init__(self, *flags: str, node_name: str = "pytest") -> None:
        self.dir = tempfile.mkdtemp(prefix="rypy-", dir="/tmp")  # short: sun_path is 108 bytes
        self.socket = os.path.join(self.dir, "ry.sock")
        self.log_path = os.path.join(self.dir, "railyardd.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [railyardd_path(flags), f"--socket={self.socket}", "--insecure_first_session_token",
             f"--node_name={node_name}",
             "--log_level=warn", *flags],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while not socket_accepts(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log()
                self.stop()
                raise RuntimeError(f"railyardd did not start on {self.socket}:\n{log}")
            time.sleep(0.01)

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: the daemon dies without a goodbye."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(15)

    def stop(self) -> Optional[int]:
        code = self.proc.poll()
        if code is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait(15)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return code

    def status(self):
        """The daemon's Admin.Status."""
        import grpc
        from railyard.v1 import admin_pb2, admin_pb2_grpc
        with grpc.insecure_channel("unix:" + self.socket + ".admin") as channel:
            return admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=10)


class RankError(AssertionError):
    """A task raised in a rank process."""


class RankPool:
    """``size`` rank processes (spawned once) that run test tasks; see rank_tasks.serve."""

    def __init__(self, size: int, env: Dict[str, str]) -> None:
        self.size = size
        self.env = env
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: List[Any] = []
        self.conns: List[Any] = []
        self._start()

    def _start(self) -> None:
        for rank in range(self.size):
            parent, child = self.ctx.Pipe()
            proc = self.ctx.Process(target=rank_tasks.serve, args=(child, rank, self.env),
                                    daemon=True, name=f"rank{rank}")
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except Exception:
                pass
        deadline = time.monotonic() + 5
        for proc in self.procs:
            proc.join(max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for conn in self.conns:
            conn.close()
        for proc in self.procs:
            try:
                os.unlink(rank_tasks.stacks_path(proc.pid))
            except OSError:
                pass
        self.procs, self.conns = [], []

    def restart(self) -> None:
        self.close()
        self._start()

    def _stacks(self, ranks: Sequence[int]) -> str:
        """The Python stacks of hung ranks' threads (rank_tasks.serve writes them on SIGUSR1)."""
        for i in ranks:
            try:
                os.kill(self.procs[i].pid, signal.SIGUSR1)
            except OSError:
                pass
        time.sleep(1.0)
        out = []
        for i in ranks:
            try:
                with open(rank_tasks.stacks_path(self.procs[i].pid)) as f:
                    out.append(f"--- rank {i} (pid {self.procs[i].pid}):\n{f.read()}")
            except OSError:
                pass
        return "\n".join(out)

    def run(self, fn: Callable, args: Sequence[Sequence[Any]], timeout: float = 60.0) -> List[Any]:
        """Runs ``fn(*args[i])`` on ranks 0..len(args)-1 at once; returns their results.

        Raises RankError (with the remote tracebacks) if a task raised, and restarts the pool if
        a rank did not answer within ``timeout`` seconds (so that no process outlives a test).
        """
        k = len(args)
        assert k <= self.size
        for i in range(k):
            self.conns[i].send((fn, tuple(args[i])))
        results: List[Any] = [None] * k
        failures: List[str] = []
        pending = set(range(k))
        deadline = time.monotonic() + timeout
        while pending:
            remaining = deadline - time.monotonic()
            if failures:  # a failed rank may leave its peers waiting: give them less time
                remaining = min(remaining, 15.0)
            ready = multiprocessing.connection.wait([self.conns[i] for i in pending],
                                                    max(0.0, remaining))
            if not ready:
                stacks = self._stacks(sorted(pending))
                self.restart()
                failures.append(f"ranks {sorted(pending)} did not finish {fn.__name__} within "
                                f"{timeout} s (rank processes restarted)\n{stacks}")
                break
            for conn in ready:
                i = self.conns.index(conn)
                pending.discard(i)
                try:
                    status, value = conn.recv()
                except EOFError:
                    failures.append(f"rank {i} died")
                    continue
                if status == "ok":
                    results[i] = value
                else:
                    failures.append(f"rank {i}: {value[0]}\n{value[1]}")
        if failures:
            if any("died" in f for f in failures):
                self.restart()
            raise RankError("\n".join(failures))
        return results


@pytest.fixture(scope="session")
def daemon():
    """One railyardd for the session (tests isolate themselves with job ids and comm ids)."""
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture
def fresh_daemon():
    """A railyardd of this test's own (for tests that kill or reconfigure it)."""
    d = Daemon(node_name="pytest-fresh")
    yield d
    d.stop()


@pytest.fixture(scope="session")
def ranks(daemon):
    """Four rank processes connected (lazily) to the session daemon as job "pytest"."""
    pool = RankPool(4, {"RAILYARD_SOCKET": daemon.socket, "RAILYARD_JOB": "pytest",
                        "RAILYARD_TOKEN": ""})
    try:
        pool.run(rank_tasks.noop, [(r,) for r in range(4)], timeout=60)
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def client(daemon):
    """A session of the test process itself (job "pytest"), e.g. to create comm ids."""
    import railyard
    c = railyard.connect(daemon.socket, job="pytest")
    yield c
    c.close()


@pytest.fixture
def store_path(tmp_path):
    """A fresh c10d FileStore path."""
    return str(tmp_path / "store")


@pytest.fixture
def pair(daemon):
    """Two sessions of one job on the shared daemon (test_client.py, test_rings.py)."""
    import railyard
    clients = [railyard.connect(daemon.socket, job="pair") for _ in range(2)]
    yield clients
    for c in clients:
        c.close()
