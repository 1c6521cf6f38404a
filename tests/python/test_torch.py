"""The torch.distributed backend "railyard": the collectives through the dist API, and DDP trained
side by side with gloo from the same seed."""

from __future__ import annotations

import numpy as np
import pytest

import rank_tasks

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


def test_backend_registers():
    import railyard.torch
    assert dist.Backend("railyard") == "railyard"
    assert issubclass(railyard.torch.ProcessGroupRailyard, dist.ProcessGroup)


def ar(n, *shape, base_of=lambda r: r):
    """Sum over ranks of arange(shape) + base_of(rank)."""
    size = int(np.prod(shape))
    return sum(np.arange(size, dtype=np.float64).reshape(shape) + base_of(r) for r in range(n))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "int64"])
def test_collectives(ranks, store_path, n, dtype):
    results = ranks.run(rank_tasks.torch_collectives,
                        [(r, n, store_path, dtype) for r in range(n)], timeout=120)
    floating = dtype != "int64"
    for r, got in enumerate(results):
        def eq(key, want):
            np.testing.assert_allclose(got[key], want, rtol=1e-2 if dtype == "bfloat16" else 0,
                                       err_msg=f"{key} rank {r}")

        assert got["backend"] == "railyard"
        eq("all_reduce", ar(n, 5))
        eq("all_reduce_max", np.full(3, n))
        eq("all_reduce_min", np.full(3, 1))
        eq("all_reduce_prod", np.full(3, float(np.prod(np.arange(1, n + 1)))))
        if floating:
            eq("all_reduce_avg", np.full(3, (n - 1) / 2))
        m = np.arange(12, dtype=np.float64).reshape(4, 3) + r
        m[:, 1] = ar(n, 4, 3)[:, 1]
        eq("all_reduce_noncontig", m)
        eq("all_reduce_async", ar(n, 6, base_of=lambda q: 10 * q))
        eq("future_value", ar(n, 6, base_of=lambda q: 10 * q))
        assert got["work_completed"]
        eq("broadcast", np.arange(4) + 100 * (n - 1))
        if r == 0:
            eq("reduce", ar(n, 3))
        gathered = np.stack([np.arange(2) + q for q in range(n)])
        eq("all_gather", gathered)
        eq("all_gather_base", gathered.reshape(-1))
        eq("reduce_scatter", sum(np.arange(2) + 10 * q + r for q in range(n)))
        eq("reduce_scatter_base", ar(n, 2 * n)[2 * r:2 * r + 2])
        eq("all_to_all", np.stack([np.arange(2) + 100 * p + 10 * r for p in range(n)]))
        eq("all_to_all_single", np.concatenate(
            [(np.arange(2 * n) + 100 * p)[2 * r:2 * r + 2] for p in range(n)]))
        # rank p sent rows [sum(1..r), sum(1..r) + r + 1) of its (sum(1..n), 2) input to rank r.
        rows = sum(q + 1 for q in range(n))
        start = sum(q + 1 for q in range(r))
        eq("all_to_all_single_splits", np.concatenate(
            [(np.arange(rows * 2).reshape(rows, 2) + 100 * p)[start:start + r + 1]
             for p in range(n)]))
        if n > 1 and r == 1:
            eq("recv", np.arange(3) + 7)
        if r == 0:
            eq("gather", gathered)
        eq("scatter", np.arange(2) + 10 * r)
        assert got["barrier"]


def test_subgroups(ranks, store_path):
    n = 4
    results = ranks.run(rank_tasks.torch_subgroups, [(r, n, store_path) for r in range(n)],
                        timeout=120)
    for r, got in enumerate(results):
        want = float(sum(q for q in range(n) if q % 2 == r % 2))
        assert got == {"group": [want, want], "world": float(n), "group_size": 2,
                       "backend": "railyard"}, got


def test_shrink_drops_a_rank_without_a_store(ranks, store_path):
    n = 3
    results = ranks.run(rank_tasks.torch_shrink, [(r, n, store_path) for r in range(n)],
                        timeout=120)
    assert results[2] == {}
    for r in (0, 1):
        assert results[r] == {"rank": r, "size": 2, "sum": [3.0, 3.0, 3.0]}, results


def test_small_all_reduce_takes_the_lean_path_and_agrees_with_the_general_one(ranks, store_path):
    n = 2
    results = ranks.run(rank_tasks.torch_small_all_reduce, [(r, n, store_path) for r in range(n)],
                        timeout=120)
    for got in results:
        for key in [k for k in got if "/" in k]:
            values, path = got[key]
            name, count = key.split("/")
            count = int(count)
            limit = (64 << 10) // np.dtype("float16" if name == "bfloat16" else name).itemsize
            want = sum(np.arange(count) % 5 + r for r in range(n))
            np.testing.assert_allclose(values, want, err_msg=key)
            # Up to 64 KiB straight onto the rings; beyond, the general path.
            assert path == ("_HostOp" if count <= limit else "Work"), (key, path)
        col = [1.0 + 3 * i for i in range(4)]
        assert got["noncontig"] == ([2 * c + 1 for c in col], "Work")
        assert got["future"] == [float(n)] * 3 and got["completed"]


def test_operations_leave_no_reference_cycles(ranks, store_path):
    # A cycle per operation (the lean path's op held its torch Work's callback, which held the
    # op) made Python's collector run every few hundred operations and a full collection, 35-50
    # ms with torch loaded, every few thousand: a 4 B all_reduce's mean went from 20 to 40 us.
    results = ranks.run(rank_tasks.torch_cyclic_garbage, [(r, 2, store_path) for r in range(2)],
                        timeout=120)
    for got in results:
        assert len(got) == 9, got
        assert got == {name: {} for name in got}, got


def test_errors_surface_from_wait(ranks, store_path):
    results = ranks.run(rank_tasks.torch_error, [(r, 2, store_path) for r in range(2)])
    for got in results:
        assert got["sync"] is not None and got["sync"]["is_railyard"], got
        assert got["sync"]["code"] in ("INVALID_ARGUMENT", "ABORTED")
        assert got["async"] is not None and got["async"]["code"] == "ABORTED", got
        assert got["int16"] is not None and "cannot be reduced" in got["int16"]["message"]


def test_futures_and_polling_complete_without_the_background_reader(ranks, store_path):
    results = ranks.run(rank_tasks.torch_completions_nobody_drives,
                        [(r, 2, store_path) for r in range(2)], timeout=90)
    for got in results:
        assert got["future"] == [3.0, 3.0, 3.0] and got["polled"] == [30.0, 30.0], got
        # The reader dozes for 30 s: these came from get_future() waking it and from
        # is_completed() reading the ring itself.
        assert got["future_s"] < 10 and got["poll_s"] < 10, got


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_matches_gloo(ranks, tmp_path, n):
    steps = 20
    ry = ranks.run(rank_tasks.ddp_train,
                   [(r, n, str(tmp_path / "ry"), "railyard", steps) for r in range(n)],
                   timeout=150)
    gl = ranks.run(rank_tasks.ddp_train,
                   [(r, n, str(tmp_path / "gloo"), "gloo", steps) for r in range(n)],
                   timeout=150)
    for r in range(n):
        for step, (a, b) in enumerate(zip(ry[r]["losses"], gl[r]["losses"])):
            assert abs(a - b) <= 1e-6 * abs(b), (
                f"rank {r} step {step}: railyard loss {a!r}, gloo loss {b!r}")
        np.testing.assert_allclose(ry[r]["mean_losses"], gl[r]["mean_losses"], rtol=1e-6)
    # The training made progress, and every rank ends with the very same parameters.
    assert ry[0]["mean_losses"][-1] < ry[0]["mean_losses"][0]
    for r in range(1, n):
        for p0, p in zip(ry[0]["params"], ry[r]["params"]):
            np.testing.assert_array_equal(p0, p, err_msg=f"railyard rank {r} parameters")


# ---------------------------------------------------------------------------------------------
# What PyTorch's distributed suite needs beyond the basics (test_torch_distributed_suite.py runs
# the suite itself; these check values and errors directly).


def test_all_gather_coalesced(ranks, store_path):
    n = 3
    results = ranks.run(rank_tasks.torch_allgather_coalesced,
                        [(r, n, store_path) for r in range(n)], timeout=120)
    for r, got in enumerate(results):
        for q in range(n):
            np.testing.assert_array_equal(got["float"][q][0], np.full((2, 3), q))
            np.testing.assert_array_equal(got["float"][q][1], np.arange(4.0) + 10 * q)
            assert got["float"][q][2].shape == (0,)
            np.testing.assert_array_equal(got["float"][q][3], [q + 0.5])
            np.testing.assert_array_equal(got["complex"][q], [complex(q, 1), complex(2, -q)])
        for q in range(n):  # the future's value: the output lists (as gloo's)
            for i in range(4):
                np.testing.assert_array_equal(got["async_value"][q][i], got["float"][q][i])
        assert got["async_is_outputs"]
        assert got["wrong_count"]["type"] == "ValueError"
        assert f"needs {n} output lists (one per rank), got {n - 1}" in \
            got["wrong_count"]["message"]
        assert "output [0][0] holds 5 x torch.float32, its input 6 x torch.float32" in \
            got["wrong_shape"]["message"]
        assert "inputs must share a dtype, got torch.float32 and torch.float64" in \
            got["mixed_dtypes"]["message"]
        assert got["after"] == n


def test_recv_any_source(ranks, store_path):
    n = 3
    results = ranks.run(rank_tasks.torch_recv_any_source, [(r, n, store_path) for r in range(n)],
                        timeout=120)
    got = results[0]
    # Every peer's two messages, each from the rank it names, each peer's in the order sent.
    assert sorted(src for src, _ in got["any"]) == [1, 1, 2, 2]
    for src, values in got["any"]:
        assert values[0] in (100.0 * src, 100.0 * src + 1) and len(set(values)) == 1, got["any"]
    for src in (1, 2):
        assert [v[0] for s, v in got["any"] if s == src] == [100.0 * src, 100.0 * src + 1]
    assert got["any_first"] == 2
    assert got["named"] == (1, [1.0, 1.0])
    wrong = got["wrong_size"]
    assert wrong["type"] == "ValueError"
    assert "recv from any source: rank 1 sent 4 x float32, the receiving tensor holds " \
        "3 x float32" in wrong["message"]
    assert got["after_wrong"] == (1, [0.0, 1.0, 2.0, 3.0, 4.0])
    timeout = got["timeout"]
    assert timeout["type"] == "DeadlineExceededError", timeout
    assert "Timed out after 2 s" in timeout["message"] and "none of ranks 1, 2 sent" in \
        timeout["message"], timeout
    assert 1.9 <= timeout["seconds"] < 10, timeout
    assert got["after_timeout"] == (n - 1, 7.0)
    assert got["self"]["type"] == "ValueError" and "not a peer of rank 0" in \
        got["self"]["message"]


def test_timeouts(ranks, store_path):
    n = 2
    got = ranks.run(rank_tasks.torch_timeouts, [(r, n, store_path) for r in range(n)],
                    timeout=120)[0]
    barrier = got["barrier"]
    assert barrier["type"] == "DeadlineExceededError", barrier
    # The words PyTorch's suite looks for (" Timed out "), and the daemon's reason.
    assert " Timed out after 1 s: barrier seq 0 on communicator" in barrier["message"], barrier
    assert "rank 1 of 2 did not submit within 1s" in barrier["message"], barrier
    assert 0.95 <= barrier["seconds"] < 10, barrier
    assert got["after_abort"]["code"] == "ABORTED", got["after_abort"]
    opts = got["opts"]
    assert opts["type"] == "DeadlineExceededError" and "Timed out after 0.5 s" in \
        opts["message"], opts
    assert 0.45 <= opts["seconds"] < 10, opts
    wait = got["wait"]
    assert wait["type"] == "DeadlineExceededError" and "Timed out after 0.3 s" in \
        wait["message"], wait
    assert 0.25 <= wait["seconds"] < 10, wait
    assert got["later"] == [2.0, 2.0]


def test_monitored_barrier(ranks, store_path):
    n = 4
    results = ranks.run(rank_tasks.torch_monitored_barrier, [(r, n, store_path) for r in range(n)],
                        timeout=120)
    for r, got in enumerate(results):
        assert got["passed"] and got["subgroup"], got
        if r == 0:
            missing = got["missing_1"]
            assert missing["type"] == "RuntimeError", missing
            assert missing["message"].startswith(
                "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms"), missing
            assert 0.95 <= missing["seconds"] < 10, missing
            assert got["wait_all"]["message"] == \
                "[Rank 0]: Ranks 1, 2, 3 failed to pass monitoredBarrier in 500 ms", got
            assert got["zero"]["message"] == ("Rank 0 timed out in monitoredBarrier after 0 ms."
                                              "\nNo ranks successfully processed in "
                                              "monitoredBarrier."), got
            assert got["bad_timeout"]["type"] == "TypeError"
            assert "timeout must be a timedelta or seconds, got str" in \
                got["bad_timeout"]["message"]
        elif r != 1:
            other = got["missing_1"]
            assert other["type"] == "RuntimeError", other
            assert other["message"].startswith(
                f"Rank {r} successfully reached monitoredBarrier, but received errors while "
                "waiting for send/recv from rank 0."), other
            assert other["seconds"] < 10, other  # released by rank 0's failure, not a timeout


def test_sparse_all_reduce(ranks, store_path):
    n = 4
    results = ranks.run(rank_tasks.torch_sparse_all_reduce, [(r, n, store_path) for r in range(n)],
                        timeout=120)
    want = np.zeros((n, n))
    for r in range(n):
        want[r, :r + 1] = np.arange(r + 1) + r + 1
    for r, got in enumerate(results):
        for name in ("float64", "int64", "bfloat16"):
            np.testing.assert_array_equal(got[name]["dense"], want, err_msg=f"{name} rank {r}")
            assert got[name]["coalesced"] and got[name]["dtype"] == f"torch.{name}"
        np.testing.assert_array_equal(got["hybrid"], np.repeat(np.arange(n, dtype=float), 2)
                                      .reshape(n, 2))
        assert got["empty_nnz"] == 0
        assert got["csr"]["type"] == "ValueError" and \
            "needs a COO tensor, got torch.sparse_csr" in got["csr"]["message"]
        assert got["max"]["type"] == "ValueError" and \
            "sparse tensor supports SUM only, got MAX" in got["max"]["message"]
        shapes = got["shapes"]
        assert shapes["type"] == "ValueError", shapes
        others = [q for q in range(n) if q != 1] if r == 1 else [1]
        assert f"ranks {others} have tensors of another shape" in shapes["message"], shapes
        assert got["after"] == n


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_reduce_scatter_ops(ranks, store_path, dtype):
    """reduce_scatter and AVG, which gloo does not do on torch 1.13, in bfloat16 too."""
    n = 4
    results = ranks.run(rank_tasks.torch_reduce_scatter_ops,
                        [(r, n, store_path, dtype) for r in range(n)], timeout=120)
    inputs = [np.arange(2 * n) % 4 + r + 1.0 for r in range(n)]
    refs = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod, "avg": np.mean}
    for r, got in enumerate(results):
        for name, fn in refs.items():
            if name == "avg" and dtype == "int64":
                assert "list_avg" not in got
                continue
            full = fn(np.stack(inputs), axis=0)
            rtol = 1e-2 if dtype == "bfloat16" else 0
            for kind, want in (("list", full[2 * r:2 * r + 2]), ("tensor", full[2 * r:2 * r + 2]),
                               ("all_reduce", full)):
                np.testing.assert_allclose(got[f"{kind}_{name}"], want, rtol=rtol,
                                           err_msg=f"{kind} {name} rank {r}")
        assert got["bad_list"]["type"] == "ValueError" and \
            f"needs one list of {n} input tensors" in got["bad_list"]["message"]
        assert got["bad_size"]["type"] == "ValueError" and \
            f"must have world_size * 2 elements of torch.{dtype}, got {2 * n + 1}" in \
            got["bad_size"]["message"]
        assert got["after"] == n


def test_ddp_no_sync_matches_gloo(ranks, tmp_path):
    """Gradient accumulation with DDP's no_sync(): local gradients stay local (bit for bit as with
    gloo), the next synced backward averages the accumulated ones over the ranks (as gloo does,
    up to the order of the additions)."""
    n = 3
    ry = ranks.run(rank_tasks.ddp_no_sync, [(r, n, str(tmp_path / "ry"), "railyard")
                                            for r in range(n)], timeout=120)
    gl = ranks.run(rank_tasks.ddp_no_sync, [(r, n, str(tmp_path / "gl"), "gloo")
                                            for r in range(n)], timeout=120)
    for r in range(n):
        for a, b in zip(ry[r]["local"], gl[r]["local"]):
            np.testing.assert_array_equal(a, b, err_msg=f"rank {r}")
        for a, b in zip(ry[r]["synced"], gl[r]["synced"]):
            np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=f"rank {r}")
    # Under no_sync the ranks' gradients differ (different data); after the synced pass they are
    # the mean over ranks of each rank's sum of its three passes.
    assert not np.array_equal(ry[0]["local"][0], ry[1]["local"][0])
    for r in range(n):
        for i in range(2):
            np.testing.assert_array_equal(ry[r]["synced"][i], ry[0]["synced"][i])
