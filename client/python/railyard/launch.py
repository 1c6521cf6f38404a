"""Starts the processes of a job, torchrun style, with a fresh communicator id.

    python3 -m railyard.launch --nproc 4 [--nodes 2] [--daemons a.sock,b.sock] script.py [args]

Creates a communicator id on the first daemon and starts ``--nproc`` copies of the command with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node),
``RAILYARD_COMM_ID``, ``RAILYARD_SOCKET`` and ``RAILYARD_JOB`` set, so that each can call
:func:`railyard.init_from_env`. Ranks are split into ``--nodes`` consecutive blocks ("virtual
nodes"); node ``k`` talks to daemon ``k % len(daemons)``. Python scripts are run with the same
interpreter as the launcher. If one process fails, the others are stopped; the exit status is
the first failure's.

Note: a communicator whose ranks use different daemons needs multi-node support in railyardd;
until then such a comm fails with UNIMPLEMENTED, so use one daemon (several virtual nodes).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from .client import DEFAULT_SOCKET, connect


def rank_env(rank: int, nproc: int, nodes: int, daemons: Sequence[str], comm_id: str,
             job: str) -> Dict[str, str]:
    """The environment of rank ``rank``: ranks are split into ``nodes`` consecutive blocks."""
    per_node = -(-nproc // nodes)  # ceil
    node = rank // per_node
    local_world = min(per_node, nproc - node * per_node)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_RANK": str(rank - node * per_node),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(node),
        "RAILYARD_COMM_ID": comm_id,
        "RAILYARD_SOCKET": daemons[node % len(daemons)],
        "RAILYARD_JOB": job,
    }


def launch(command: Sequence[str], nproc: int, *, nodes: int = 1,
           daemons: Optional[Sequence[str]] = None, job: Optional[str] = None,
           timeout: Optional[float] = None) -> int:
    """Runs ``command`` as ``nproc`` ranks; returns 0 or the first failing rank's exit status.

    Args:
        command: the program and its arguments (run as is; see :func:`main` for scripts).
        nproc: number of ranks.
        nodes: number of virtual nodes (consecutive blocks of ranks).
        daemons: daemon sockets, node ``k`` uses ``daemons[k % len(daemons)]``; default
            ``[$RAILYARD_SOCKET or /run/railyard/railyard.sock]``.
        job: the job id; default ``$RAILYARD_JOB`` or ``"launch-<pid>"``.
        timeout: seconds after which every rank is stopped (exit status 124).
    """
    if nproc < 1 or nodes < 1 or nodes > nproc:
        raise ValueError(f"need 1 <= nodes ({nodes}) <= nproc ({nproc})")
    daemons = list(daemons) if daemons else [os.environ.get("RAILYARD_SOCKET") or DEFAULT_SOCKET]
    job = job or os.environ.get("RAILYARD_JOB") or f"launch-{os.getpid()}"
    with connect(daemons[0], job=job) as client:
        comm_id = client.new_comm_id()
        procs: List[subprocess.Popen] = []
        try:
            for rank in range(nproc):
                env = dict(os.environ)
                env.update(rank_env(rank, nproc, nodes, daemons, comm_id, job))
                procs.append(subprocess.Popen(list(command), env=env))
            return _wait_all(procs, timeout)
        finally:
            _stop(procs)


def _wait_all(procs: List[subprocess.Popen], timeout: Optional[float]) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            return failed[0] if failed[0] > 0 else 128 - failed[0]
        if all(c == 0 for c in codes):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            sys.stderr.write(f"railyard.launch: ranks still running after {timeout} s\n")
            return 124
        time.sleep(0.05)


def _stop(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m railyard.launch",
        description="Start NPROC ranks of a command with a fresh railyard communicator id.")
    parser.add_argument("--nproc", type=int, required=True, help="number of ranks")
    parser.add_argument("--nodes", type=int, default=0,
                        help="virtual nodes (consecutive blocks of ranks); default: one per "
                             "daemon")
    parser.add_argument("--daemons", default="",
                        help="comma-separated daemon sockets, one per node (round robin); "
                             "default $RAILYARD_SOCKET")
    parser.add_argument("--job", default=None, help="job id (default $RAILYARD_JOB)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="program and arguments; a .py file runs with this interpreter")
    args = parser.parse_args(argv)
    if not args.command:
        parser.error("no command given")
    command = list(args.command)
    if command[0].endswith(".py"):
        command.insert(0, sys.executable)
    daemons = [d for d in args.daemons.split(",") if d] or None
    nodes = args.nodes or (len(daemons) if daemons else 1)
    return launch(command, args.nproc, nodes=nodes, daemons=daemons, job=args.job,
                  timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
