"""One rank of auto_shrink_test: joins a communicator made with on_failure="shrink" and runs
checked AllReduces on it until told to stop, going on through every loss of ranks. Spawned as
its own process (gRPC channels do not survive fork).

Each rank contributes (id + 1) * (j % 7 + 1) at element j, where id is the rank's number in the
original communicator (a grown rank's is given): the sum is exact in float64 and independent of
how many operations each survivor finished before a failure. The last two elements carry flags
every rank agrees on, since all see the same sum: whether the harness asked to grow (a file
`grow` in the work directory) and whether it asked to stop (`stop`).

Progress goes to <dir>/rank-<id>.jsonl, one JSON object per line: "ok" every 10 operations,
"shrunk" with the error's lost ranks and nodes and the time of the first good operation after
it, "grown", "wrong" (never expected), and "done".

argv: JSON {"socket", "job", "token", "comm_id", "rank", "nranks", "id", "members", "dir",
"grow_to" (0: none), "grow_members"}.
"""

import json
import os
import sys
import time

import numpy as np

import railyard

N = 4096 + 2  # payload and two flags


def main():
    a = json.loads(sys.argv[1])
    me = a["id"]
    members = list(a["members"])  # original ids, in current rank order
    log = open(os.path.join(a["dir"], f"rank-{me}.jsonl"), "a", buffering=1)

    def say(**kw):
        log.write(json.dumps(dict(kw, t=time.time(), id=me)) + "\n")

    client = railyard.connect(a["socket"], a["job"], a["token"])
    comm = client.comm(a["comm_id"], a["rank"], a["nranks"], timeout=60, on_failure="shrink",
                       shrink_timeout=30)
    pattern = (np.arange(N - 2) % 7 + 1).astype(np.float64)
    x = client.empty(N, np.float64)
    ops = 0
    shrunk_at = None  # time of the last failure, until an operation succeeds after it
    grown = not a.get("grow_to")  # a rank that joined by the grow has grown already
    while True:
        x[:-2] = (me + 1) * pattern
        x[-2] = 1.0 if os.path.exists(os.path.join(a["dir"], "grow")) else 0.0
        x[-1] = 1.0 if os.path.exists(os.path.join(a["dir"], "stop")) else 0.0
        try:
            comm.all_reduce(x, timeout=30)
        except railyard.RailyardError as e:
            lost = getattr(e, "lost_ranks", None)
            if not getattr(e, "shrunk", False):
                say(event="failed", error=str(e)[:2000])
                raise
            gone = set(lost)
            members = [m for i, m in enumerate(members) if i not in gone]
            shrunk_at = time.time()
            say(event="shrunk", lost=lost, lost_nodes=getattr(e, "lost_nodes", []),
                nranks=comm.nranks, rank=comm.rank, members=members, error=str(e)[:2000])
            if comm.nranks != len(members) or members[comm.rank] != me:
                say(event="wrong", what="renumbering", nranks=comm.nranks, rank=comm.rank)
                return 1
            continue
        ops += 1
        expected = sum(m + 1 for m in members) * pattern
        if not np.array_equal(x[:-2], expected):
            bad = int(np.flatnonzero(x[:-2] != expected)[0])
            say(event="wrong", at=bad, got=float(x[bad]), want=float(expected[bad]),
                members=members, nranks=comm.nranks)
            return 1
        if shrunk_at is not None:
            say(event="resumed", after_s=time.time() - shrunk_at, nranks=comm.nranks)
            shrunk_at = None
        if ops % 10 == 0:
            say(event="ok", ops=ops, nranks=comm.nranks)
        if x[-1] > 0:
            break
        if x[-2] > 0 and not grown:
            # Every rank saw the flag in the same sum: all grow now, in the same order.
            grow_to = a["grow_to"]
            if comm.rank == 0:
                tmp = os.path.join(a["dir"], "grow-id.tmp")
                with open(tmp, "w") as f:
                    f.write(comm.grow_id(grow_to))
                os.rename(tmp, os.path.join(a["dir"], "grow-id"))
            new = comm.grow(grow_to, timeout=60)
            comm.close()
            comm = new
            members = members + list(a["grow_members"])
            grown = True
            say(event="grown", nranks=comm.nranks, rank=comm.rank, members=members)
    say(event="done", ops=ops, nranks=comm.nranks, members=members)
    comm.close()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
