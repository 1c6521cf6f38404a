"""railyardd restarts and upgrades under running jobs (docs/restarts.md).

Two ranks of one job run the correctness matrix (every collective, dtype, reduction, in and out of
place, send/recv; each result checked exactly) over and over on one daemon while the test:
  1. hands the node over twice (railyardd --takeover with the same flags): no operation fails,
     no result is wrong, both ranks move (Client::reconnects);
  2. SIGKILLs the daemon and starts a fresh one on the same socket at once: the ranks wait for it
     (RAILYARD_RECONNECT_S) and go on; only an operation the dead daemon had taken and could not
     run again fails, with UNAVAILABLE saying the daemon restarted during it;
  3. checks that RAILYARD_RECONNECT_S=0 restores the old behaviour (the session ends with the
     daemon), and that a second --takeover refuses a socket nobody serves.

Run by CTest (restart_test) with RAILYARDD and RANK_PATH in the environment.
"""

import os
import re
import secrets
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from virtual_nodes import stop, wait_for


def start(tmp, name, extra=()):
    sock = os.path.join(tmp, "r.sock")
    log = os.path.join(tmp, f"{name}.log")
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [os.environ["RAILYARDD"], f"--socket={sock}", f"--admin_socket={tmp}/admin.sock",
             f"--state_dir={tmp}", "--insecure_first_session_token", "--worker_threads=2",
             *extra], stdout=f, stderr=subprocess.STDOUT)
    wait_for(f"{name} to serve", lambda: proc.poll() is None and "msg=serving" in open(log).read()
             or (proc.poll() is not None and pytest.fail(open(log).read())), 30)
    node = re.search(r"msg=serving .*node=(\S+)", open(log).read()).group(1)
    return proc, sock, node, log


def ranks(sock, node, seconds, env_extra=None):
    """Two ranks running the matrix for `seconds` from their join; returns once both joined (a
    test that signals after a fixed sleep otherwise raced ranks still starting on a loaded
    machine: they joined the successor and never moved)."""
    nonce = secrets.token_hex(16)
    comm = f"ry1-{nonce}@local:{node}"
    ready = [os.path.join(os.path.dirname(sock), f"joined-{nonce}-{r}") for r in range(2)]
    env = dict(os.environ, **(env_extra or {}))
    procs = [subprocess.Popen(
        [os.environ["RANK_PATH"], "--mode=restart", f"--socket={sock}", f"--comm_id={comm}",
         f"--rank={r}", "--nranks=2", f"--duration_s={seconds}", "--job=restart",
         f"--ready_file={ready[r]}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    wait_for("both ranks to join", lambda: all(os.path.exists(f) for f in ready)
             or any(p.poll() is not None for p in procs), 60)
    return procs


def results(procs, timeout):
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=timeout)
        m = re.search(r"RESTART ok=(\d+) failed=(\d+) wrong=(\d+) reconnects=(\d+) cases=(\d+)",
                      text)
        assert m, text[-3000:]
        out.append(({k: int(v) for k, v in zip(("ok", "failed", "wrong", "reconnects", "cases"),
                                                m.groups())}, text))
    return out


def test_handovers_fail_nothing_and_a_crash_fails_only_what_was_taken():
    tmp = tempfile.mkdtemp(prefix="ry-restart-")
    daemons = []
    try:
        old, sock, node, _ = start(tmp, "d0")
        daemons.append(old)
        procs = ranks(sock, node, 14)
        for i in (1, 2):
            time.sleep(3)
            new, _, _, log = start(tmp, f"d{i}", ["--takeover"])
            daemons.append(new)
            old.wait(timeout=30)  # the old daemon hands its sessions over and exits
            assert old.returncode == 0
            assert "took over" in open(log).read()
            old = new
        time.sleep(3)
        os.kill(old.pid, signal.SIGKILL)
        old.wait(timeout=10)
        new, _, _, _ = start(tmp, "d3")  # the socket file is stale: a plain start replaces it
        daemons.append(new)
        outs = results(procs, 120)
        for counts, text in outs:
            print("rank:", counts, re.findall(r"FAILED .*", text))
            assert counts["wrong"] == 0, text[-3000:]
            assert counts["reconnects"] == 3, text[-3000:]
            assert counts["ok"] >= 100, text[-3000:]  # ran before, between and after
            failures = re.findall(r"FAILED .* code=(\d+): (.*)", text)
            # Handovers fail nothing; at the kill only what the daemon had taken, UNAVAILABLE.
            assert len(failures) <= 4, text[-3000:]
            for code, msg in failures:
                assert code == "14" and "restarted during this" in msg, text[-3000:]
    finally:
        for d in daemons:
            stop(d)


def test_a_sigterm_restart_fails_nothing():
    """systemctl restart, a pod deleted and started again: SIGTERM (--on_stop=drain, the default),
    then a new daemon on the socket once the old one exited. What both ranks had submitted ran;
    the rest went back to the clients, which waited for the new daemon and ran it there."""
    tmp = tempfile.mkdtemp(prefix="ry-restart-term-")
    daemons = []
    try:
        old, sock, node, log = start(tmp, "d0")
        daemons.append(old)
        procs = ranks(sock, node, 8)
        time.sleep(3)
        os.kill(old.pid, signal.SIGTERM)
        assert old.wait(timeout=30) == 0
        assert "sessions sent to the next railyardd" in open(log).read()
        new, _, _, _ = start(tmp, "d1")
        daemons.append(new)
        for counts, text in results(procs, 120):
            print("rank:", counts)
            assert counts["failed"] == 0 and counts["wrong"] == 0, text[-3000:]
            assert counts["reconnects"] == 1, text[-3000:]
            assert counts["ok"] >= 100, text[-3000:]
    finally:
        for d in daemons:
            stop(d)


def test_reconnect_zero_ends_the_session_with_the_daemon():
    tmp = tempfile.mkdtemp(prefix="ry-restart0-")
    d, sock, node, _ = start(tmp, "d0")
    try:
        procs = ranks(sock, node, 6, {"RAILYARD_RECONNECT_S": "0"})
        time.sleep(2)
        os.kill(d.pid, signal.SIGKILL)
        d.wait(timeout=10)
        for counts, text in results(procs, 60):
            assert counts["reconnects"] == 0, text[-2000:]
            assert counts["failed"] > 0 and counts["wrong"] == 0, text[-2000:]
            assert re.search(r"code=14: .*(daemon closed the session|unavailable)", text), \
                text[-2000:]
    finally:
        stop(d)


def test_takeover_without_a_daemon_to_take_over_from_says_so():
    tmp = tempfile.mkdtemp(prefix="ry-restart-none-")
    out = subprocess.run(
        [os.environ["RAILYARDD"], f"--socket={tmp}/r.sock", f"--admin_socket={tmp}/a.sock",
         f"--state_dir={tmp}", "--insecure_first_session_token", "--takeover",
         "--takeover_timeout=1s"], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "--takeover: no railyardd to take over from at" in out.stdout + out.stderr, \
        out.stdout + out.stderr


def test_a_second_daemon_without_takeover_is_refused_and_names_the_flag():
    tmp = tempfile.mkdtemp(prefix="ry-restart-twice-")
    d, sock, _, _ = start(tmp, "d0")
    try:
        out = subprocess.run(
            [os.environ["RAILYARDD"], f"--socket={sock}", f"--admin_socket={tmp}/a2.sock",
             f"--state_dir={tmp}", "--insecure_first_session_token"],
            capture_output=True, text=True, timeout=30)
        assert out.returncode != 0
        assert "railyardd --takeover" in out.stdout + out.stderr, out.stdout + out.stderr
        assert d.poll() is None
    finally:
        stop(d)


def test_sigusr2_reloads_by_handover_and_tells_systemd_the_new_main_pid():
    # systemctl reload: SIGUSR2 starts the binary at the daemon's path with --takeover; the new
    # process says MAINPID= on $NOTIFY_SOCKET (Type=notify, NotifyAccess=all).
    tmp = tempfile.mkdtemp(prefix="ry-restart-usr2-")
    notify_path = os.path.join(tmp, "notify")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(30)
    os.environ["NOTIFY_SOCKET"] = notify_path
    try:
        d, sock, node, _ = start(tmp, "d0")
    finally:
        del os.environ["NOTIFY_SOCKET"]
    successor = None
    try:
        assert notify.recv(4096).decode() == f"MAINPID={d.pid}\nREADY=1"
        procs = ranks(sock, node, 6)
        time.sleep(2)
        os.kill(d.pid, signal.SIGUSR2)
        m = re.fullmatch(r"MAINPID=(\d+)\nREADY=1", notify.recv(4096).decode())
        assert m
        successor = int(m.group(1))
        assert successor != d.pid
        d.wait(timeout=30)  # handed over, exited
        assert d.returncode == 0
        for counts, text in results(procs, 60):
            assert counts["failed"] == 0 and counts["wrong"] == 0, text[-2000:]
            assert counts["reconnects"] == 1, text[-2000:]
    finally:
        stop(d)
        if successor is not None:
            os.kill(successor, signal.SIGTERM)  # started by the daemon this test started
            wait_for("the successor to exit", lambda: not os.path.exists(f"/proc/{successor}"),
                     20)
        notify.close()


def test_a_daemonset_pod_takes_over_when_one_serves_and_the_old_one_idles():
    # --takeover_if_serving: the first pod on a node starts, the next one takes over; the one
    # handed over (--after_handover=wait) stays up, serving nothing, until SIGTERM.
    tmp = tempfile.mkdtemp(prefix="ry-restart-ds-")
    flags = ["--takeover_if_serving=true", "--after_handover=wait"]
    old, sock, node, _ = start(tmp, "d0", flags)
    new = None
    try:
        procs = ranks(sock, node, 6)
        time.sleep(2)
        new, _, _, log = start(tmp, "d1", flags)
        assert "took over" in open(log).read()
        for counts, text in results(procs, 60):
            assert counts["failed"] == 0 and counts["wrong"] == 0, text[-2000:]
            assert counts["reconnects"] == 1, text[-2000:]
        assert old.poll() is None, "the old daemon idles until SIGTERM"
        stop(old)
        # Its stop leaves the sockets to the new daemon, which still serves a new job.
        assert os.path.exists(sock) and os.path.exists(sock + ".handover")
        for counts, text in results(ranks(sock, node, 1), 60):
            assert counts["ok"] > 0 and counts["failed"] == 0, text[-2000:]
    finally:
        stop(old)
        if new is not None:
            stop(new)


def test_a_communicator_spanning_nodes_fails_fast_across_a_handover_and_says_why():
    # Not carried across a restart yet (docs/restarts.md): its ranks are told so at once, no
    # rank waits out the reconnect window for peers that will not rejoin. A communicator of two
    # other daemons (node-b and node-c, a bystander of node-a's handover; node-b also serves the
    # one that fails) runs on throughout and fails nothing.
    tmps = [tempfile.mkdtemp(prefix=f"ry-restart-mn-{n}-") for n in "abc"]
    peer = ["--peer_listen=127.0.0.1:0", "--peer_insecure"]
    a, sock_a, _, log_a = start(tmps[0], "a0", peer + ["--node_name=node-a"])
    b, sock_b, _, log_b = start(tmps[1], "b0", peer + ["--node_name=node-b"])
    c, sock_c, _, _ = start(tmps[2], "c0", peer + ["--node_name=node-c"])
    new = None
    try:
        def rank_pair(coordinator_log, socks, seconds):
            addr = re.search(r"coordinator=(\S+)", open(coordinator_log).read()).group(1)
            comm = f"ry1-{secrets.token_hex(16)}@{addr}"
            return [subprocess.Popen(
                [os.environ["RANK_PATH"], "--mode=restart", f"--socket={s}", f"--comm_id={comm}",
                 f"--rank={r}", "--nranks=2", f"--duration_s={seconds}", "--job=restart"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for r, s in enumerate(socks)]

        procs = rank_pair(log_a, (sock_a, sock_b), 4)
        bystanders = rank_pair(log_b, (sock_b, sock_c), 8)
        time.sleep(2)
        started = time.monotonic()
        new, _, _, _ = start(tmps[0], "a1", peer + ["--node_name=node-a", "--takeover"])
        outs = results(procs, 60)
        assert time.monotonic() - started < 30, "no rank waited out the reconnect window"
        counts, text = outs[0]
        assert counts["ok"] > 0 and counts["wrong"] == 0, text[-2000:]
        assert "spans 2 nodes" in text, text[-2000:]
        assert outs[1][0]["wrong"] == 0, outs[1][1][-2000:]
        for counts, text in results(bystanders, 60):
            assert counts["ok"] > 0, text[-2000:]
            assert counts["failed"] == 0 and counts["wrong"] == 0, text[-2000:]
            assert counts["reconnects"] == 0, text[-2000:]
    finally:
        for d in (a, b, c, new):
            if d is not None:
                stop(d)
