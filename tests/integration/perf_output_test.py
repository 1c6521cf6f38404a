"""railyard-perf prints nccl-tests 2.19's output (tools/perf/result_table.h): the header lines,
one "#  Rank" line per rank, the column header, rows and footer exactly, NCCL_TESTS_MIN_BW judged
(a failing run exits non-zero), and nccl-tests' -t -g -m -N -a -z -G flags, refused clearly where
they mean nothing here. 4 ranks on 2 daemons (virtual nodes on loopback)."""

import os
import re
import subprocess

import pytest

import virtual_nodes

PERF = os.environ["RAILYARD_PERF"]


@pytest.fixture(scope="module")
def cluster():
    with virtual_nodes.insecure_nodes("ry-perf-", ["nodea", "nodeb"]) as nodes:
        yield nodes


def test_railyard_perf_prints_nccl_tests_header_and_footer(cluster):
    tmp, sockets = cluster
    run = subprocess.run([PERF, f"--daemons={sockets[0]},{sockets[1]}", "-b", "1K", "-e", "16K",
                          "-f", "4", "-g", "2", "-n", "3", "-w", "1", "-m", "2", "-z", "1",
                          "--op", "reducescatter"],
                         env=dict(os.environ, RAILYARD_JOB="ncclapi"), capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "# nccl-tests version 2.19.0 nccl-headers=22809 nccl-library=22809"
    assert lines[1] == "# Collective test starting: reduce_scatter_perf"
    assert lines[2] == ("# nThread 1 nGpus 2 minBytes 1024 maxBytes 16384 step: 4(factor) "
                        "warmup iters: 1 iters: 3 agg iters: 2 validation: 1 graph: 0 unalign: 0")
    assert lines[3] == "# Blocking Enabled: wait and barrier after each inner iteration (-m) "
    assert lines[4:6] == ["#", "# Using devices"]
    ranks = [l for l in lines if l.startswith("#  Rank ")]
    assert len(ranks) == 4, run.stdout
    for r, line in enumerate(ranks):
        assert re.fullmatch(rf"#  Rank {r:2d} Group  0 Pid +\d+ on +node[ab] device -1 "
                            r"\[0000:00:00\] host memory, railyardd", line), line
    rows = [l for l in lines if l and not l.startswith("#")]
    assert [int(r.split()[0]) for r in rows] == [1024, 4096, 16384], run.stdout
    assert all(r.split()[8] == "0" and r.split()[12] == "0" for r in rows), run.stdout
    footer = run.stdout[run.stdout.index("# Out of bounds values"):]
    assert re.fullmatch(r"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : [0-9.e+-]+ \n"
                        r"#\n# Collective test concluded: reduce_scatter_perf\n#\n\n",
                        footer), footer
    # NCCL_TESTS_MIN_BW: judged, and a failing run exits non-zero.
    slow = subprocess.run([PERF, f"--daemons={sockets[0]}", "-b", "1K", "-e", "1K", "-n", "2"],
                          env=dict(os.environ, RAILYARD_JOB="ncclapi", NCCL_TESTS_MIN_BW="100000"),
                          capture_output=True, text=True, timeout=120)
    assert slow.returncode != 0, slow.stdout
    assert re.search(r"^# Avg bus bandwidth    : \S+ FAILED$", slow.stdout, re.M), slow.stdout
    for bad, says in [(["-t", "2"], "every rank is a process"), (["-G", "1"], "CUDA graphs")]:
        r = subprocess.run([PERF, f"--daemons={sockets[0]}", *bad], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 2 and says in r.stderr, r.stderr
