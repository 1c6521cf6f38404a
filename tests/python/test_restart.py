"""railyardd handovers and restarts under the Python client (docs/restarts.md).

- Two rank processes run checked all_reduces (in place, out of place, staged) and send/recv over
  and over while the test hands the daemon over twice (``railyardd --takeover``, same flags; the
  old one exits by itself) and then SIGKILLs it and starts a fresh one on the same socket: every
  result is exact, nothing fails across the handovers, at the kill only UNAVAILABLE failures
  saying the daemon restarted during the operation, and each rank's client moved three times.
- At a kill, what the dead daemon had taken: an in-place all_reduce and a send fail saying so,
  an out-of-place one runs again from its intact input; the other rank's copy of the failed
  collective fails too, and the communicators go on.
- ``RAILYARD_RECONNECT_S=0``: the session ends with the daemon; a bad value is refused at connect.
- With torch: a DDP loop on the railyard backend across a handover gives the very losses and
  parameters of the same steps without one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any, List

import numpy as np
import pytest

import railyard
import rank_tasks
from conftest import RankPool, railyardd_path, socket_accepts

# Every wait of this file is bounded by this (seconds), or less.
WAIT = 30.0


def _wait_for(what: str, done: Any, timeout: float = WAIT, why: Any = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s\n{why()}")
        time.sleep(0.01)


class Node:
    """The railyardd processes serving one socket, one after the other."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="rypy-rs-", dir="/tmp")  # sun_path is 108 bytes
        self.socket = os.path.join(self.dir, "ry.sock")
        self.procs: List[subprocess.Popen] = []
        self.logs: List[str] = []
        self.start()

    @property
    def daemon(self) -> subprocess.Popen:
        return self.procs[-1]

    def log(self, i: int = -1) -> str:
        with open(self.logs[i], "rb") as f:
            return f.read().decode(errors="replace")

    def logs_tail(self) -> str:
        return "\n".join(f"--- daemon {i}:\n{self.log(i)[-3000:]}" for i in range(len(self.logs)))

    def start(self, *extra: str) -> subprocess.Popen:
        """A daemon with the same flags every time (``extra``: --takeover); returns once it
        serves (its log says so: a takeover's socket answers before)."""
        log = os.path.join(self.dir, f"railyardd-{len(self.procs)}.log")
        with open(log, "wb") as f:
            proc = subprocess.Popen(
                [railyardd_path(), f"--socket={self.socket}", "--insecure_first_session_token",
                 "--node_name=pytest-restart", *extra],
                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        self.logs.append(log)
        _wait_for("railyardd to serve",
                  lambda: "msg=serving" in self.log() or proc.poll() is not None,
                  why=self.logs_tail)
        assert proc.poll() is None, self.logs_tail()
        assert socket_accepts(self.socket)
        return proc

    def hand_over(self) -> None:
        """railyardd --takeover: the old daemon hands its sessions over and exits with 0."""
        old = self.daemon
        self.start("--takeover")
        assert old.wait(WAIT) == 0, self.logs_tail()
        assert "took over" in self.log(), self.logs_tail()

    def kill(self, restart: bool = True) -> None:
        """SIGKILL, then (``restart``) a fresh daemon on the same socket (its stale file is
        replaced)."""
        self.daemon.kill()
        self.daemon.wait(WAIT)
        if restart:
            self.start()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(15)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def node():
    n = Node()
    yield n
    n.stop()


def _in_background(fn: Any, *args: Any, hung: Any = lambda: "") -> Any:
    """Runs fn(*args) on a thread; the returned function joins it and returns (or raises) what
    fn did (``hung()``: what to say when it does not finish)."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - raised again in the test's thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def join(timeout: float) -> Any:
        t.join(timeout)
        assert not t.is_alive(), f"{fn.__name__} did not finish within {timeout} s\n{hung()}"
        if "error" in box:
            raise box["error"]
        return box["value"]
    return join


def test_handovers_fail_nothing_and_a_kill_fails_only_what_the_dead_daemon_had_taken(node):
    control = os.path.join(node.dir, "control")
    os.mkdir(control)
    pool = RankPool(2, {"RAILYARD_SOCKET": node.socket, "RAILYARD_JOB": "restart",
                        "RAILYARD_TOKEN": ""})
    try:
        c = railyard.connect(node.socket, job="restart")
        comm_id = c.new_comm_id()
        c.close()

        def hung() -> str:
            return pool._stacks([0, 1]) + node.logs_tail()

        join = _in_background(pool.run, rank_tasks.restart_loop,
                              [(r, 2, comm_id, control, 60.0) for r in range(2)], 75.0,
                              hung=hung)
        # The ranks are under way once they have gone through the loop (pausing sends and
        # receives says so: each writes paused-<rank>).
        pause = os.path.join(control, "pause-p2p")
        paused = [os.path.join(control, f"paused-{r}") for r in range(2)]
        open(pause, "w").close()
        _wait_for("the ranks to start", lambda: all(map(os.path.exists, paused)), 60.0)
        os.unlink(pause)
        _wait_for("the ranks to resume their exchanges",
                  lambda: not any(map(os.path.exists, paused)))
        events = {"start": time.time()}
        time.sleep(1.0)
        for i in (1, 2):
            events[f"handover {i}"] = time.time()
            node.hand_over()  # sends and receives go on meanwhile
            events[f"handover {i} done"] = time.time()
            time.sleep(1.0)
        # A send or receive the dead daemon took while the peer's matching one was not yet
        # taken leaves that one waiting for a partner that never comes (docs/restarts.md: "fails
        # likewise or at its timeout"), a timing no test can steer: the kill happens while the
        # ranks hold theirs back. Collectives run throughout.
        open(pause, "w").close()
        _wait_for("the ranks to hold their sends and receives",
                  lambda: all(map(os.path.exists, paused)), why=hung)
        events["kill"] = time.time()
        node.kill()
        events["restarted"] = time.time()
        os.unlink(pause)
        time.sleep(1.5)
        open(os.path.join(control, "stop"), "w").close()
        results = join(WAIT)
    finally:
        pool.close()
    for rank, res in enumerate(results):
        where = f"rank {rank}: {res['failures'][:10]} {res['wrong'][:10]}\n{node.logs_tail()}"
        assert res["wrong"] == [], where
        assert res["reconnects"] == 3, where
        # Nothing fails across the handovers; at the kill only what the dead daemon had taken
        # (and the other rank's copies of those collectives), saying so.
        for t, what, code, message in res["failures"]:
            assert t >= events["kill"], (what, code, message, where)
            assert code == "UNAVAILABLE" and "restarted during this" in message, \
                (what, code, message, where)
        assert len(res["failures"]) <= 8, where
        # Every stretch between the events ran complete iterations, and the exchanges went on
        # before, between and after the handovers, and after the restart.
        for lo, hi in ((events["start"], events["handover 1"]),
                       (events["handover 1 done"], events["handover 2"]),
                       (events["handover 2 done"], events["kill"]),
                       (events["restarted"], float("inf"))):
            assert any(lo <= t < hi for t in res["iterations"]), (lo, hi, events, where)
            assert any(lo <= t < hi for t in res["exchanges"]), (lo, hi, events, where)


def _pair(node: Node, job: str) -> Any:
    """Two sessions of one job, and two communicators joined by both (rank 0 on the first)."""
    a = railyard.connect(node.socket, job=job)
    b = railyard.connect(node.socket, job=job)
    comms: List[List[Any]] = [[], []]
    for _ in range(2):
        comm_id = a.new_comm_id()
        joining = _in_background(b.comm, comm_id, 1, 2, WAIT)
        comms[0].append(a.comm(comm_id, 0, 2, timeout=WAIT))
        comms[1].append(joining(WAIT))
    return a, b, comms


def test_after_a_kill_what_was_taken_fails_or_runs_again_and_the_comms_go_on(node):
    a, b, ((in_place, out_of_place), (in_place_1, out_of_place_1)) = _pair(node, "crash")
    try:
        x = a.empty(64, np.float32)
        x[:] = 1
        src, dst = a.empty(64, np.float32), a.empty(64, np.float32)
        src[:] = np.arange(64)
        msg = a.empty(16, np.float32)
        # (Registering a buffer waits for a daemon: rank 1's are made now.)
        zeros_1 = b.zeros(64, np.float32)
        y, out_1 = b.empty(64, np.float32), b.empty(64, np.float32)
        y[:] = 10
        # Rank 1 submits nothing yet: the daemon takes these and waits for it.
        w_in = in_place.all_reduce(x, async_op=True, timeout=WAIT)
        w_out = out_of_place.all_reduce(src, out=dst, async_op=True, timeout=WAIT)
        w_send = in_place.send(msg, 1, async_op=True, timeout=WAIT)
        _wait_for("the daemon to take the three", lambda: a._rings is None or
                  a._rings.consumed_head() == 3)
        time.sleep(0.2)  # (over gRPC: Submit has returned; give the daemon a moment)
        node.kill(restart=False)
        # Rank 1's copies come while its client waits for the next daemon: they wait too.
        _wait_for("rank 1 to wait for the next daemon", lambda: b._rebuilding)
        w_in_1 = in_place_1.all_reduce(zeros_1, async_op=True, timeout=WAIT)
        w_out_1 = out_of_place_1.all_reduce(y, out=out_1, async_op=True, timeout=WAIT)
        assert not w_in_1.is_completed() and not w_out_1.is_completed()
        node.start()
        for work, op in ((w_in, "ALL_REDUCE"), (w_send, "SEND")):
            with pytest.raises(railyard.UnavailableError, match="restarted during this") as info:
                work.wait(WAIT)
            assert op in info.value.message and node.socket in info.value.message
        assert "not safe" in w_in.exception().message  # in place: its input may be gone
        # Rank 1's copy of the in-place one cannot meet rank 0's any more: it fails alike.
        with pytest.raises(railyard.UnavailableError,
                           match="on another rank of communicator") as info:
            w_in_1.wait(WAIT)
        assert "restarted during this" in info.value.message
        # Out of place: it runs again on the new daemon, from its intact input, with rank 1's.
        w_out.wait(WAIT)
        w_out_1.wait(WAIT)
        assert dst.tolist() == (np.arange(64) + 10).tolist() == out_1.tolist()
        assert src.tolist() == np.arange(64).tolist()
        # Both communicators go on, and buffers made before the kill are still the ones meant.
        x[:] = 2
        y[:] = 3
        joining = _in_background(in_place_1.all_reduce, y)
        in_place.all_reduce(x, timeout=WAIT)
        joining(WAIT)
        assert x.tolist() == y.tolist() == [5.0] * 64
        assert a.reconnects == b.reconnects == 1
        assert not a.closed and not b.closed
    finally:
        a.close()
        b.close()


def test_reconnect_zero_ends_the_session_with_the_daemon(node, monkeypatch):
    monkeypatch.setenv("RAILYARD_RECONNECT_S", "0")
    a, b, ((comm, _), _) = _pair(node, "zero")
    try:
        work = comm.all_reduce(a.zeros(8, np.float32), async_op=True, timeout=WAIT)
        start = time.monotonic()
        node.kill()
        with pytest.raises(railyard.UnavailableError) as info:
            work.wait(WAIT)
        assert node.socket in info.value.message
        assert time.monotonic() - start < 10
        # The session is over, for good: the new daemon does not take it back.
        with pytest.raises(railyard.UnavailableError):
            a.new_comm_id()
        assert a.closed and b.closed and a.reconnects == 0
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("value", ["-1", "5s", "1.5", "86401", " 7"])
def test_a_bad_reconnect_window_is_refused_at_connect(daemon, monkeypatch, value):
    monkeypatch.setenv("RAILYARD_RECONNECT_S", value)
    with pytest.raises(railyard.InvalidArgumentError,
                       match=r"RAILYARD_RECONNECT_S=.*expected seconds in \[0, 86400\]"):
        railyard.connect(daemon.socket, job="bad-window")


def test_a_ddp_loop_across_a_handover_computes_what_it_computes_without_one(node, tmp_path):
    pytest.importorskip("torch")
    control = str(tmp_path / "control")
    os.mkdir(control)
    steps = 30
    pool = RankPool(2, {"RAILYARD_SOCKET": node.socket, "RAILYARD_JOB": "ddp-restart",
                        "RAILYARD_TOKEN": ""})
    try:
        join = _in_background(pool.run, rank_tasks.ddp_across_handover,
                              [(r, 2, str(tmp_path / "store1"), steps, control)
                               for r in range(2)], 90.0)
        _wait_for("the training loop to start",
                  lambda: os.path.exists(os.path.join(control, "training")), 60.0)
        node.hand_over()
        open(os.path.join(control, "handed-over"), "w").close()
        moved = join(60.0)
        same = pool.run(rank_tasks.ddp_across_handover,
                        [(r, 2, str(tmp_path / "store2"), steps, None) for r in range(2)],
                        timeout=60.0)
    finally:
        pool.close()
    for rank in range(2):
        assert moved[rank]["reconnects"] == 1, node.logs_tail()
        assert moved[rank]["losses"] == same[rank]["losses"]
        for p, q in zip(moved[rank]["params"], same[rank]["params"]):
            np.testing.assert_array_equal(p, q)
    assert moved[0]["losses"] == moved[1]["losses"]  # all_reduced: every rank's mean
