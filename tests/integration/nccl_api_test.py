"""Programs written for NCCL run on railyard (client/nccl, docs/nccl.md): a C++ and a C program
compiled against the CUDA toolkit's nccl.h and linked to railyard's libnccl.so.2, 4 ranks on 2
daemons (virtual nodes on loopback), on host memory. The C++ program checks every collective x
type x op in and out of place (staged and ncclMemAlloc memory), groups, send/recv, split,
shrink, non-blocking communicators, PreMulSum, ncclCommInitAll, abort and bad arguments; each
rank's exit code is its failure count. Also: the library exports the API nccl.h declares."""

import os
import re
import subprocess
import tempfile

import pytest

import virtual_nodes

LIB = os.environ.get("RAILYARD_NCCL_LIB", "")
RANKS = os.environ.get("NCCL_TEST_RANKS", "")
C_RANKS = os.environ.get("NCCL_TEST_C_RANKS", "")
NCCL_H = os.environ.get("NCCL_H", "/usr/local/cuda/include/nccl.h")

pytestmark = pytest.mark.skipif(not (LIB and RANKS), reason="libnccl not built (no CUDA toolkit)")


@pytest.fixture(scope="module")
def cluster():
    with virtual_nodes.insecure_nodes("ry-nccl-", ["nodea", "nodeb"]) as nodes:
        yield nodes


def run_ranks(tmp, sockets, program, parts="", nranks=4, timeout=240, extra_env=None):
    """Starts nranks processes of program (ranks 0..n/2-1 on the first daemon, the rest on the
    second) and returns [(rc, output)] by rank."""
    iddir = tempfile.mkdtemp(dir=tmp)
    procs = []
    for r in range(nranks):
        env = dict(os.environ, NCCL_TEST_RANK=str(r), NCCL_TEST_NRANKS=str(nranks),
                   NCCL_TEST_DIR=iddir, NCCL_TEST_PARTS=parts,
                   RAILYARD_SOCKET=sockets[0 if r < nranks // 2 else 1], RAILYARD_JOB="ncclapi",
                   **(extra_env or {}))
        procs.append(subprocess.Popen([program], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n(timed out)"
        results.append((p.returncode, out))
    return results


def assert_all_passed(results):
    for rank, (rc, out) in enumerate(results):
        assert rc == 0, f"rank {rank} exited {rc}:\n{out}"


def test_library_exports_the_nccl_api_of_nccl_h():
    exported = set(subprocess.run(["nm", "-D", "--defined-only", LIB], capture_output=True,
                                  text=True, check=True).stdout.split())
    header = open(NCCL_H).read()
    declared = set(re.findall(r"^\s*(?:ncclResult_t|const char\*|void)\s+(p?nccl\w+)\s*\(",
                              header, re.M))
    assert len(declared) >= 80, sorted(declared)
    missing = sorted(d for d in declared if d not in exported)
    assert not missing, f"nccl.h declares, libnccl.so.2 does not export: {missing}"
    # Nothing but the API: the client's gRPC, protobuf and Abseil stay private.
    others = sorted(s for s in exported
                    if re.fullmatch(r"[0-9a-fA-F]+|[A-Za-z]", s) is None
                    and not s.startswith(("nccl", "pnccl")))
    assert not others, f"exports beyond the NCCL API: {others[:10]}"


def test_matrix_groups_p2p_split_shrink_on_two_daemons(cluster):
    tmp, sockets = cluster
    results = run_ranks(tmp, sockets, RANKS, "matrix,group,p2p,split,shrink")
    assert_all_passed(results)
    for rank, (_, out) in enumerate(results):
        m = re.search(r"matrix (\d+) cases, 0 failed", out)
        assert m and int(m.group(1)) >= 300, out


def test_nonblocking_premulsum_errors_initall_abort(cluster):
    tmp, sockets = cluster
    results = run_ranks(tmp, sockets, RANKS, "nonblocking,premulsum,errors,initall,abort")
    assert_all_passed(results)


def test_c_program(cluster):
    tmp, sockets = cluster
    results = run_ranks(tmp, sockets, C_RANKS)
    assert_all_passed(results)
    assert all("C program OK" in out for _, out in results)


def test_nccl_debug_info_logs_init_and_version(cluster):
    tmp, sockets = cluster
    results = run_ranks(tmp, sockets, C_RANKS, nranks=2, extra_env={"NCCL_DEBUG": "INFO"})
    assert_all_passed(results)
    out = results[0][1]
    assert re.search(r"NCCL version 2\.28\.9\+railyard", out), out
    assert re.search(r"\[0\] NCCL INFO Init COMPLETE comm ry1-[0-9a-f]{32}@", out), out

