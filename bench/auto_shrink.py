#!/usr/bin/python3
"""How long survivors stop when ranks die under an on_failure="shrink" communicator (issue 58):
NODES railyardd on loopback (1 rail on lo, mutual TLS), RANKS ranks each running checked float64
AllReduces of 32 KiB (tests/integration/shrink_ranks.py). Each round SIGKILLs one rank's process
(its daemon lives), then a whole node (its daemon and ranks; every other round the communicator's
coordinator), then, with 4 nodes or more, freezes node 1's daemon (SIGSTOP: silent, no socket
closed), and times each survivor from the failure to its first good AllReduce on the shrunk
communicator. Prints, per kind of failure, the median and the worst over rounds of the slowest
survivor's pause.

    /usr/bin/python3 bench/auto_shrink.py [--nodes 4] [--ranks 2] [--rounds 6] [--build build]
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

from virtual_nodes import rank_events as events, start_daemon, stop, wait_for  # noqa: E402

RANKS = os.path.join(REPO, "tests", "integration", "shrink_ranks.py")


def resumed(tmp, ids, nranks, since):
    """Each survivor's first good operation on the nranks communicator, seconds after since."""
    def seen():
        out = []
        for i in ids:
            evs = events(tmp, i)
            bad = [e for e in evs if e["event"] in ("wrong", "failed")]
            if bad:
                raise AssertionError(bad[0])
            r = [e for e in evs if e["event"] == "resumed" and e["nranks"] == nranks]
            if not r:
                return None
            out.append(r[0]["t"] - since)
        return out
    return wait_for(f"survivors at {nranks} ranks", seen, 60)


def progressed(tmp, ids, more):
    start = {i: max([e["ops"] for e in events(tmp, i) if e["event"] == "ok"] + [0]) for i in ids}
    wait_for("progress", lambda: all(
        max([e["ops"] for e in events(tmp, i) if e["event"] == "ok"] + [0]) >= start[i] + more
        for i in ids), 60)


def one_round(nodes, per, coordinator_dies, env):
    with tempfile.TemporaryDirectory(prefix="ry-autoshrink-") as tmp:
        daemons, procs, frozen = [], {}, []
        try:
            for n in range(nodes):
                proc, sock, _ = start_daemon(tmp, f"n{n}", 1, ["--peer_timeout=2s"])
                daemons.append((proc, sock))
            peer = re.search(r"peer_address=(\S+)", open(os.path.join(tmp, "n0.log")).read())
            comm_id = f"ry1-{os.urandom(16).hex()}@{peer.group(1)}"
            total = nodes * per
            for i in range(total):
                args = {"socket": daemons[i // per][1], "comm_id": comm_id, "rank": i,
                        "nranks": total, "id": i, "members": list(range(total)), "dir": tmp,
                        "job": "bench", "token": "bench-token"}
                procs[i] = subprocess.Popen([sys.executable, RANKS, json.dumps(args)], env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            alive = list(range(total))
            progressed(tmp, alive, 20)
            # A rank's process (the last rank of node 1).
            victim = 2 * per - 1
            t = time.time()
            os.kill(procs[victim].pid, signal.SIGKILL)
            alive.remove(victim)
            rank_pause = max(resumed(tmp, alive, len(alive), t))
            progressed(tmp, alive, 20)
            # A node: node 0 (the coordinator) or the last.
            node = 0 if coordinator_dies else nodes - 1
            t = time.time()
            for i in range(node * per, node * per + per):
                os.kill(procs[i].pid, signal.SIGKILL)
                alive.remove(i)
            os.kill(daemons[node][0].pid, signal.SIGKILL)
            node_pause = max(resumed(tmp, alive, len(alive), t))
            freeze_pause = None
            if nodes >= 4:
                # A node that falls silent without closing a socket (a hung or partitioned
                # machine): SIGSTOP node 1's daemon. Found by heartbeats (--peer_timeout), then
                # the census's deadline (2 s) for its answer.
                progressed(tmp, alive, 20)
                t = time.time()
                os.kill(daemons[1][0].pid, signal.SIGSTOP)
                frozen.append(daemons[1][0])
                for i in range(per, 2 * per):
                    if i in alive:
                        alive.remove(i)
                freeze_pause = max(resumed(tmp, alive, len(alive), t))
            open(os.path.join(tmp, "stop"), "w").close()
            for i in alive:
                procs[i].wait(timeout=60)
            return rank_pause, node_pause, freeze_pause
        finally:
            for p in procs.values():
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)
            for proc in frozen:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            for proc, _ in daemons:
                if proc.poll() is None:
                    stop(proc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    build = os.path.abspath(os.path.join(REPO, a.build))
    os.environ["RAILYARDD"] = os.path.join(build, "daemon", "railyardd")
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
    rank_p, node_p, coord_p, frozen_p = [], [], [], []
    for r in range(a.rounds):
        rp, np_, fp = one_round(a.nodes, a.ranks, r % 2 == 1, env)
        rank_p.append(rp)
        (coord_p if r % 2 == 1 else node_p).append(np_)
        if fp is not None:
            frozen_p.append(fp)
        print(f"# round {r}: rank killed {rp * 1000:.1f} ms, "
              f"{'coordinator' if r % 2 else 'other'} node killed {np_ * 1000:.1f} ms"
              + (f", node frozen {fp * 1000:.1f} ms" if fp is not None else ""), flush=True)
    print(f"# auto-shrink pause: {a.nodes} railyardd x {a.ranks} ranks on loopback, "
          f"--peer_timeout=2s, {a.rounds} rounds; ms from SIGKILL to the slowest survivor's "
          "first good AllReduce on the shrunk communicator")
    print(f"{'failure':>22}  {'p50':>8}  {'max':>8}  rounds")
    for name, xs in (("rank process", rank_p), ("node (not coordinator)", node_p),
                     ("node (coordinator)", coord_p), ("node frozen (SIGSTOP)", frozen_p)):
        if xs:
            print(f"{name:>22}  {statistics.median(xs) * 1000:8.1f}  {max(xs) * 1000:8.1f}  "
                  + " ".join(f"{x * 1000:.1f}" for x in xs))


if __name__ == "__main__":
    main()
