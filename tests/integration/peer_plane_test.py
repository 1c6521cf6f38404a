"""The peer plane tried the way an attacker that reaches the peer port would (issue: "An
authenticated peer plane"): two virtual nodes (vnode0, vnode1) with mutual TLS and certificates
from a cluster CA made at test time by openssl; a victim job with one rank on each; attacks run
as separate processes (peer_attacker.py):

- without a certificate the CA signed (plaintext, no client certificate, another CA's), every
  JoinComm, AbortComm and Heartbeat fails at the handshake;
- with a CA-signed certificate for another node name, claiming a member is refused;
- as a cluster node that is not a member: no abort, no heartbeat, no joining the victim's
  communicator under another job, and malformed joins are refused naming the field;
- as a coordinator that hands back forged layouts: each is refused naming what is wrong.

After every attack the victim's communicator still computes across both daemons, and both
daemons still serve.

Run by CTest (peer_plane_test) with RAILYARDD, PEER_CERTS (scripts/peer-certs.sh) and PYTHONPATH
(the built Python client) in the environment.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent import futures

import numpy as np
import pytest

import railyard
from virtual_nodes import start_daemon, stop, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
NODES = ("vnode0", "vnode1")


def make_certs(out, *nodes):
    subprocess.run([os.environ["PEER_CERTS"], out, *nodes], check=True, capture_output=True,
                   timeout=60)
    return {"ca": os.path.join(out, "ca.pem"),
            **{n: (os.path.join(out, f"{n}.pem"), os.path.join(out, f"{n}-key.pem"))
               for n in nodes}}


def tls_flags(certs, node):
    cert, key = certs[node]
    return [f"--peer_tls_cert={cert}", f"--peer_tls_key={key}", f"--peer_tls_ca={certs['ca']}"]


def both(f0, f1, timeout=60):
    with futures.ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(f0), pool.submit(f1)
        return a.result(timeout), b.result(timeout)


@pytest.fixture(scope="module")
def cluster():
    tmp = tempfile.mkdtemp(prefix="ry-peer-")
    certs = make_certs(os.path.join(tmp, "ca"), *NODES, "evil")
    other = make_certs(os.path.join(tmp, "other-ca"), "vnode1", "evil")
    daemons = {}
    try:
        for n in NODES:
            proc, sock, _ = start_daemon(tmp, n, 1, tls_flags(certs, n))
            log = os.path.join(tmp, f"{n}.log")
            peer = wait_for(f"{n} peer address",
                            lambda: re.search(r"peer_address=(\S+)", open(log).read()), 10)
            daemons[n] = {"proc": proc, "socket": sock, "peer": peer.group(1), "log": log}
        yield {"tmp": tmp, "certs": certs, "other": other, "daemons": daemons}
    finally:
        for d in daemons.values():
            stop(d["proc"])
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def victim(cluster):
    d = cluster["daemons"]
    c0 = railyard.connect(d["vnode0"]["socket"], "victim", "victim-token")
    c1 = railyard.connect(d["vnode1"]["socket"], "victim", "victim-token")
    comm_id = c0.new_comm_id()
    comms = both(lambda: c0.comm(comm_id, 0, 2, timeout=30),
                 lambda: c1.comm(comm_id, 1, 2, timeout=30))
    yield {"clients": (c0, c1), "comms": comms, "comm_id": comm_id}
    for c in comms:
        c.close()
    c0.close()
    c1.close()


def victim_intact(cluster, victim):
    """The victim's communicator still computes across both daemons, and both still serve."""
    c0, c1 = victim["clients"]
    x0 = c0.empty(1024, np.float32)
    x1 = c1.empty(1024, np.float32)
    x0[:] = np.arange(1024, dtype=np.float32)
    x1[:] = 1000
    both(lambda: victim["comms"][0].all_reduce(x0, timeout=30),
         lambda: victim["comms"][1].all_reduce(x1, timeout=30))
    expected = np.arange(1024, dtype=np.float32) + 1000
    assert np.array_equal(x0, expected) and np.array_equal(x1, expected)
    for n, d in cluster["daemons"].items():
        assert d["proc"].poll() is None, f"{n} died: " + open(d["log"]).read()[-4000:]


def attack(args, mode="client"):
    out = subprocess.run([sys.executable, os.path.join(HERE, "peer_attacker.py"), mode, "-"],
                         input=json.dumps(args), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout.strip().splitlines()[-1])
    for a, (code, details) in zip(args.get("attempts", []), results):  # the answers, for the log
        print(f"  {a['rpc']} {a.get('from_node', a.get('node_name', ''))} -> {code}: "
              f"{details[:200]}")
    return results


def the_three(victim, claimed_node):
    """JoinComm, AbortComm and Heartbeat, each claiming to be claimed_node."""
    return [{"rpc": "join", "job": "victim", "comm_id": victim["comm_id"], "rank": 1,
             "nranks": 2, "node_name": claimed_node},
            {"rpc": "abort", "job": "victim", "comm_id": victim["comm_id"],
             "from_node": claimed_node},
            {"rpc": "heartbeat", "from_node": claimed_node}]


def test_without_a_certificate_of_the_cluster_ca_nothing_gets_past_the_handshake(cluster, victim):
    coordinator = cluster["daemons"]["vnode0"]["peer"]
    certs, other = cluster["certs"], cluster["other"]
    clients = {
        "plaintext": {"address": coordinator, "plaintext": True},
        "no_client_certificate": {"address": coordinator, "ca": certs["ca"]},
        "another_ca": {"address": coordinator, "ca": certs["ca"], "cert": other["vnode1"][0],
                       "key": other["vnode1"][1]},
    }
    for name, client in clients.items():
        results = attack({**client, "attempts": the_three(victim, "vnode1")})
        assert [code for code, _ in results] == ["UNAVAILABLE"] * 3, (name, results)
        victim_intact(cluster, victim)


def test_a_certificate_for_another_node_cannot_speak_for_a_member(cluster, victim):
    evil_cert, evil_key = cluster["certs"]["evil"]
    results = attack({"address": cluster["daemons"]["vnode0"]["peer"], "ca": cluster["certs"]["ca"],
                      "cert": evil_cert, "key": evil_key,
                      "attempts": the_three(victim, "vnode1")})
    assert [code for code, _ in results] == ["PERMISSION_DENIED"] * 3, results
    for _, details in results:
        assert "vnode1" in details and "evil" in details, results  # what was claimed, and by whom
    victim_intact(cluster, victim)


def test_a_cluster_node_that_is_not_a_member_cannot_act_on_the_victims_communicator(
        cluster, victim):
    evil_cert, evil_key = cluster["certs"]["evil"]
    comm_id = victim["comm_id"]
    nonce = comm_id[4:36]
    attempts = [
        {"rpc": "abort", "job": "victim", "comm_id": comm_id, "from_node": "evil"},
        {"rpc": "heartbeat", "from_node": "evil"},
        # Another job reusing the victim's id (the communicator is bound to its job).
        {"rpc": "join", "job": "mallory", "comm_id": comm_id, "rank": 0, "nranks": 2},
        # Malformed joins, each naming the field.
        {"rpc": "join", "job": "mallory", "comm_id": comm_id, "rank": 0, "nranks": 1 << 20},
        {"rpc": "join", "job": "mallory", "comm_id": comm_id, "rank": 5, "nranks": 2},
        {"rpc": "join", "job": "mallory", "comm_id": comm_id, "rank": 0, "nranks": 2,
         "rail_addresses": ["ucx:" + "f" * (256 << 10)]},
        {"rpc": "join", "job": "mallory", "comm_id": comm_id, "rank": 0, "nranks": 2,
         "rail_addresses": ["ucx:x"] * 10000},
        {"rpc": "join", "job": "mallory", "comm_id": f"ry1-{nonce}@unix:/run/x.sock", "rank": 0,
         "nranks": 2},
        {"rpc": "join", "job": "../etc", "comm_id": comm_id, "rank": 0, "nranks": 2},
        # A daemon of another data-plane version (a rolling upgrade half done), for a new id.
        {"rpc": "join", "job": "mallory", "comm_id": f"ry1-{'cd' * 16}@{comm_id.split('@')[1]}",
         "rank": 0, "nranks": 2, "data_plane_version": 0},
    ]
    results = attack({"address": cluster["daemons"]["vnode0"]["peer"], "ca": cluster["certs"]["ca"],
                      "cert": evil_cert, "key": evil_key, "attempts": attempts})
    codes = [code for code, _ in results]
    assert codes[:3] == ["PERMISSION_DENIED"] * 3, results
    assert codes[3:9] == ["INVALID_ARGUMENT"] * 6, results
    assert codes[9] == "FAILED_PRECONDITION", results
    details = [d for _, d in results]
    assert "nranks" in details[3] and "rank 5" in details[4], results
    assert "rail_addresses" in details[5] and "rail_addresses" in details[6], results
    assert "unix:" in details[7] and "job" in details[8], results
    assert "node evil speaks no data-plane version" in details[9], results
    victim_intact(cluster, victim)
    # vnode1's view: the forged abort must not have reached it either.
    results = attack({"address": cluster["daemons"]["vnode1"]["peer"], "ca": cluster["certs"]["ca"],
                      "cert": evil_cert, "key": evil_key, "attempts": attempts[:2]})
    assert [code for code, _ in results] == ["PERMISSION_DENIED"] * 2, results
    victim_intact(cluster, victim)


FORGERIES = {
    "negative_index": "node_of_rank[0] is -1",
    "index_past_nodes": "node_of_rank[1] is 7",
    "wrong_rank_count": "rank",
    "member_absent": "this daemon",
    "member_elsewhere": "this daemon",
    "huge_rail_address": "rail_addresses",
    "old_coordinator": "nodes[0].data_plane_version: node evil speaks no data-plane version",
}


@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_a_forged_layout_from_a_coordinator_is_refused_naming_what_is_wrong(cluster, victim, kind):
    evil_cert, evil_key = cluster["certs"]["evil"]
    forger = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "peer_attacker.py"), "coordinator",
         json.dumps({"cert": evil_cert, "key": evil_key, "layout": kind, "serve_s": 60})],
        stdout=subprocess.PIPE, text=True)
    try:
        port = int(forger.stdout.readline().split()[1])
        c = railyard.connect(cluster["daemons"]["vnode0"]["socket"], "lured", "lured-token")
        comm_id = f"ry1-{'ab' * 16}@127.0.0.1:{port}"
        start = time.monotonic()
        with pytest.raises(railyard.RailyardError) as err:
            c.comm(comm_id, 0, 2, timeout=10)
        assert time.monotonic() - start < 20
        print(f"  forged layout {kind} -> {err.value}"[:300])
        want = "FAILED_PRECONDITION" if kind == "old_coordinator" else "INVALID_ARGUMENT"
        assert err.value.code.name == want, err.value
        assert FORGERIES[kind] in str(err.value), err.value
        c.close()
    finally:
        forger.kill()
        forger.wait(10)
    victim_intact(cluster, victim)


def test_a_coordinator_without_a_cluster_certificate_is_not_believed(cluster, victim):
    cert, key = cluster["other"]["evil"]
    forger = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "peer_attacker.py"), "coordinator",
         json.dumps({"cert": cert, "key": key, "layout": "negative_index", "serve_s": 60})],
        stdout=subprocess.PIPE, text=True)
    try:
        port = int(forger.stdout.readline().split()[1])
        c = railyard.connect(cluster["daemons"]["vnode0"]["socket"], "lured", "lured-token")
        start = time.monotonic()
        with pytest.raises(railyard.RailyardError) as err:
            c.comm(f"ry1-{'cd' * 16}@127.0.0.1:{port}", 0, 2, timeout=3)
        assert time.monotonic() - start < 20
        print(f"  coordinator of another CA -> {err.value} after "
              f"{time.monotonic() - start:.1f} s"[:400])
        assert err.value.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED"), err.value
        c.close()
    finally:
        forger.kill()
        forger.wait(10)
    victim_intact(cluster, victim)


def test_a_bystander_job_gets_checked_results_after_every_attack(cluster, victim):
    # Runs last: railyard-perf with result checking (-c 1) across both mTLS daemons, as a job
    # that saw none of the attacks.
    d = cluster["daemons"]
    out = subprocess.run(
        [os.environ["RAILYARD_PERF"], "--op", "allreduce", "-b", "8", "-e", "1M", "-f", "8",
         "-n", "3", "-w", "1", "-c", "1", "--daemons",
         f"{d['vnode0']['socket']},{d['vnode1']['socket']}", "--ranks-per-daemon", "1"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "RAILYARD_JOB": "bystander", "RAILYARD_TOKEN": "bystander-token"})
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines()
            if line.strip() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [8, 64, 512, 4096, 32768, 262144], out.stdout
    # The #wrong columns (out-of-place, in-place) of every size: no element differs.
    assert all(r[8] == "0" and r[12] == "0" for r in rows), out.stdout
    assert "Out of bounds values : 0 OK" in out.stdout, out.stdout
    victim_intact(cluster, victim)
