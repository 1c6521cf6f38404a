"""What the Python integration tests share: virtual-node daemons on loopback (railyardd with a
topology of `rails` rails on lo, a metrics endpoint on a free port and the peer plane on mutual
TLS with certificates made at test time), bounded waits, and stopping by PID."""

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.request

import peer_tls


def wait_for(what, predicate, timeout_s, interval_s=0.05):
    """predicate()'s first true value; AssertionError naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def rank_events(tmp, rank_id):
    """The JSON lines rank rank_id wrote so far to tmp/rank-<id>.jsonl (shrink_ranks.py), a line
    being written excepted."""
    path = os.path.join(tmp, f"rank-{rank_id}.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def stop(proc):
    """SIGTERM, then SIGKILL after 10 s: only processes this test started."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def start_daemon(tmp, name, rails, extra_args=(), insecure=False, pace=None):
    """Starts railyardd as virtual node `name` in tmp; returns (proc, socket, metrics address)
    once it serves both. The peer plane is mutual TLS with a certificate for `name` from the CA
    in tmp/certs (made on first use, shared by every daemon started in tmp), or plaintext with
    insecure=True (--peer_insecure). pace: every rail's topology `pace` (a bandwidth: its fair
    queue, docs/fair-share.md), None for unpaced rails. The caller stops proc."""
    if insecure:
        security = ["--peer_insecure"]
    else:
        certdir = peer_tls.make_certs(os.path.join(tmp, "certs"), name)
        security = peer_tls.tls_flags(certdir, name)
    topo = os.path.join(tmp, f"{name}.json")
    with open(topo, "w") as f:
        json.dump({"node": name, "rails": [dict({"name": f"rail{r}", "device": "lo"},
                                                **({"pace": pace} if pace else {}))
                                           for r in range(rails)]}, f)
    sock = os.path.join(tmp, f"{name}.sock")
    logpath = os.path.join(tmp, f"{name}.log")
    with open(logpath, "w") as log:
        proc = subprocess.Popen(
            [os.environ["RAILYARDD"], f"--socket={sock}", "--insecure_first_session_token", "--peer_listen=127.0.0.1:0",
             f"--topology={topo}", "--metrics_listen=127.0.0.1:0", "--worker_threads=2",
             *security, *extra_args], stdout=log, stderr=subprocess.STDOUT)

    def bound():
        assert proc.poll() is None, open(logpath).read()
        m = re.search(r"metrics_address=(\S+)", open(logpath).read())
        return m and os.path.exists(sock) and m.group(1)
    try:
        addr = wait_for(f"{name} to serve", bound, 20)
    except BaseException:
        stop(proc)
        raise
    return proc, sock, addr


@contextlib.contextmanager
def insecure_nodes(prefix, names):
    """Daemons `names` (one rail each, plaintext peer plane) in a temporary directory: yields
    (tmp, [socket, ...]); stops them on exit."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        procs = []
        try:
            sockets = []
            for name in names:
                proc, sock, _ = start_daemon(tmp, name, 1, insecure=True)
                procs.append(proc)
                sockets.append(sock)
            yield tmp, sockets
        finally:
            for p in procs:
                stop(p)
