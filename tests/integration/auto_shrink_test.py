"""Communicators made with on_failure="shrink" outlive lost ranks (issue 58, "Shrink" and "Grow"):
three virtual nodes on loopback (mutual TLS peer plane), two ranks on each, every rank running
checked AllReduces (shrink_ranks.py) while the test

  1. SIGKILLs one rank's process (rank 3, on n1): the other five go on in a communicator of five,
     renumbered, each failed operation's error naming rank 3;
  2. SIGKILLs node n0 (its daemon, the communicator's coordinator, and its two ranks): the three
     left go on in a communicator of three, coordinated by n1 now, the error naming ranks 0 and 1
     and node n0;
  3. grows the communicator back to six with three ranks on a replacement node n3, which join
     with the id the survivors derive (Comm.grow_id).

Every result of every operation is checked exactly (a wrong one fails the test); the seconds from
each kill to the survivors' first good operation on the shrunk communicator are printed.

Run by CTest (auto_shrink_test) with RAILYARDD and PYTHONPATH (the built Python client).
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from virtual_nodes import rank_events as events, start_daemon, stop, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = ["--peer_timeout=2s"]
JOB, TOKEN = "elastic", "elastic-token"


def no_wrong(tmp, ids):
    for i in ids:
        for e in events(tmp, i):
            assert e["event"] not in ("wrong", "failed"), e


def spawn_rank(tmp, args):
    log = open(os.path.join(tmp, f"rank-{args['id']}.out"), "w")
    return subprocess.Popen([sys.executable, os.path.join(HERE, "shrink_ranks.py"),
                             json.dumps(dict(args, dir=tmp, job=JOB, token=TOKEN))],
                            stdout=log, stderr=subprocess.STDOUT)


def ops_done(tmp, i):
    return max([e["ops"] for e in events(tmp, i) if e["event"] == "ok"] + [0])


def wait_progress(tmp, ids, more, what, timeout=60):
    """Every rank in ids does `more` further operations (in tens)."""
    start = {i: ops_done(tmp, i) for i in ids}

    def done():
        no_wrong(tmp, ids)
        return all(ops_done(tmp, i) >= start[i] + more for i in ids)
    wait_for(what, done, timeout)


def shrunk(tmp, ids, nranks, timeout=60):
    def seen():
        no_wrong(tmp, ids)
        out = {}
        for i in ids:
            s = [e for e in events(tmp, i) if e["event"] == "shrunk" and e["nranks"] == nranks]
            r = [e for e in events(tmp, i) if e["event"] == "resumed" and e["nranks"] == nranks]
            if not s or not r:
                return None
            out[i] = (s[0], r[0])
        return out
    return wait_for(f"ranks {ids} to go on as {nranks}", seen, timeout)


def test_survivors_shrink_past_a_dead_rank_and_a_dead_node_and_grow_back():
    with tempfile.TemporaryDirectory(prefix="ry-shrink-") as tmp:
        daemons, ranks = {}, {}
        try:
            for n in ("n0", "n1", "n2"):
                proc, sock, _ = start_daemon(tmp, n, 1, FLAGS)
                daemons[n] = (proc, sock)
            peer = re.search(r"peer_address=(\S+)", open(os.path.join(tmp, "n0.log")).read())
            comm_id = f"ry1-{os.urandom(16).hex()}@{peer.group(1)}"
            for i in range(6):
                node = f"n{i // 2}"
                ranks[i] = spawn_rank(tmp, {"socket": daemons[node][1], "comm_id": comm_id,
                                            "rank": i, "nranks": 6, "id": i,
                                            "members": list(range(6)), "grow_to": 6,
                                            "grow_members": [6, 7, 8]})
            wait_progress(tmp, range(6), 20, "six ranks to run")

            # 1. A rank's process dies; its daemon lives.
            killed = time.time()
            os.kill(ranks[3].pid, signal.SIGKILL)
            ranks[3].wait(timeout=10)
            five = [0, 1, 2, 4, 5]
            seen = shrunk(tmp, five, 5)
            for i, (s, r) in seen.items():
                assert s["lost"] == [3], s
                assert "rank(s) 3 of 6 are gone" in s["error"], s
                assert s["members"] == five and s["rank"] == five.index(i), s
            print("rank 3 killed: survivors resumed after "
                  + ", ".join(f"{max(r['t'] - killed, 0):.3f}" for _, r in seen.values()) + " s")
            wait_progress(tmp, five, 20, "five ranks to run")

            # 2. A node dies: the coordinator's daemon and its two ranks.
            killed = time.time()
            for i in (0, 1):
                os.kill(ranks[i].pid, signal.SIGKILL)
            os.kill(daemons["n0"][0].pid, signal.SIGKILL)
            for i in (0, 1):
                ranks[i].wait(timeout=10)
            daemons["n0"][0].wait(timeout=10)
            three = [2, 4, 5]
            seen = shrunk(tmp, three, 3)
            for i, (s, r) in seen.items():
                # Numbered in the communicator of five: ids 0 and 1 were its ranks 0 and 1.
                assert s["lost"] == [0, 1], s
                assert any("n0" in n for n in s["lost_nodes"]), s
                assert s["members"] == three and s["rank"] == three.index(i), s
            print("node n0 killed: survivors resumed after "
                  + ", ".join(f"{max(r['t'] - killed, 0):.3f}" for _, r in seen.values()) + " s")
            wait_progress(tmp, three, 20, "three ranks to run")

            # 3. A replacement node; the survivors grow back to six.
            proc, sock, _ = start_daemon(tmp, "n3", 1, FLAGS)
            daemons["n3"] = (proc, sock)
            open(os.path.join(tmp, "grow"), "w").close()
            grow_id = wait_for("the grow id", lambda: os.path.exists(os.path.join(tmp, "grow-id"))
                               and open(os.path.join(tmp, "grow-id")).read(), 60)
            assert grow_id.split("@")[1] != peer.group(1), "the dead n0 still coordinates"
            full = three + [6, 7, 8]
            for k, i in enumerate((6, 7, 8)):
                ranks[i] = spawn_rank(tmp, {"socket": sock, "comm_id": grow_id, "rank": 3 + k,
                                            "nranks": 6, "id": i, "members": full})
            wait_progress(tmp, full, 20, "six ranks again")
            for i in three:
                assert any(e["event"] == "grown" and e["nranks"] == 6 for e in events(tmp, i))

            open(os.path.join(tmp, "stop"), "w").close()
            for i in full:
                assert ranks[i].wait(timeout=60) == 0, open(os.path.join(tmp, f"rank-{i}.out")).read()
            no_wrong(tmp, full)
            for i in full:
                done = [e for e in events(tmp, i) if e["event"] == "done"]
                assert done and done[0]["nranks"] == 6 and done[0]["members"] == full, done
        finally:
            for p in ranks.values():
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)
            for proc, _ in daemons.values():
                stop(proc)
