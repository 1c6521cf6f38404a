"""Every collective x dtypes x world sizes 1-4 against numpy references.

Each case runs the operation on arrays from client.empty (zero copy), on plain numpy arrays
(copied through staging buffers) and with async_op=True, in separate rank processes.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import rank_tasks

DTYPES = ["float32", "float64", "float16", "int8", "uint8", "int32", "uint32", "int64", "uint64"]
REDS = ["sum", "prod", "min", "max", "avg"]
WORLDS = [1, 2, 3, 4]
COUNT = 7
_seeds = itertools.count(1)


def reduce_ref(stack: np.ndarray, red: str, dtype: str) -> np.ndarray:
    """The daemon's reduction over axis 0 (docs/local-api.md; daemon/kernels/reduce.h):
    float16 accumulates in float32, integers wrap, avg = sum / n (integers truncate to zero)."""
    dt = np.dtype(dtype)
    acc = stack.astype(np.float32) if dt == np.float16 else stack
    n = stack.shape[0]
    if red == "sum" or red == "avg":
        r = np.add.reduce(acc, axis=0, dtype=acc.dtype)
        if red == "avg":
            r = r / n if dt.kind == "f" else np.trunc(r.astype(np.float64) / n)
    elif red == "prod":
        r = np.multiply.reduce(acc, axis=0, dtype=acc.dtype)
    elif red == "min":
        r = np.minimum.reduce(acc, axis=0)
    else:
        r = np.maximum.reduce(acc, axis=0)
    return np.asarray(r).astype(dt)


def assert_close(got: np.ndarray, want: np.ndarray, dtype: str, what: str) -> None:
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.dtype == np.dtype(dtype), f"{what}: dtype {got.dtype}, want {dtype}"
    assert got.size == want.size, f"{what}: {got.size} elements, want {want.size}"
    got = got.reshape(want.shape)
    if np.dtype(dtype).kind == "f":
        tol = {"float16": (2e-3, 2e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-13)}
        rtol, atol = tol[dtype]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                                   atol=atol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def run(ranks, client, n, op, dtype, count=COUNT, red="sum"):
    seed = next(_seeds)
    comm_id = client.new_comm_id()
    results = ranks.run(rank_tasks.run_collective,
                        [(r, n, comm_id, op, dtype, count, seed, red) for r in range(n)],
                        timeout=90)
    return seed, results


def check_variants(results, expected_per_rank, dtype, what):
    for rank, (res, want) in enumerate(zip(results, expected_per_rank)):
        for variant in ("shared", "plain", "async"):
            if want is None:
                assert res[variant] is None
            else:
                assert_close(res[variant], want, dtype, f"{what} rank {rank} {variant}")
        # Results of shared inputs are shared arrays; results of plain ones are plain.
        assert all(c is None or c for c in res["shared_checks"]), res["shared_checks"]


def inputs(seed, n, size, dtype, kind="sum"):
    return np.stack([rank_tasks.make_input(seed, r, size, dtype, kind) for r in range(n)])


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("red", REDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce(ranks, client, n, dtype, red):
    seed, results = run(ranks, client, n, "all_reduce", dtype, red=red)
    want = reduce_ref(inputs(seed, n, COUNT, dtype, red), red, dtype)
    check_variants(results, [want] * n, dtype, f"all_reduce {red}")


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_all_reduce_out_of_place(ranks, client, n, dtype):
    seed, results = run(ranks, client, n, "all_reduce_out", dtype)
    want = reduce_ref(inputs(seed, n, COUNT, dtype), "sum", dtype)
    check_variants(results, [want] * n, dtype, "all_reduce out=")
    assert all(all(r["input_unchanged"]) for r in results)


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter(ranks, client, n, dtype):
    seed, results = run(ranks, client, n, "reduce_scatter", dtype)
    full = reduce_ref(inputs(seed, n, n * COUNT, dtype), "sum", dtype).reshape(n, COUNT)
    check_variants(results, [full[r] for r in range(n)], dtype, "reduce_scatter")


@pytest.mark.parametrize("n", [1, 3, 4])
@pytest.mark.parametrize("red", ["max", "avg"])
def test_reduce_scatter_in_place(ranks, client, n, red):
    seed, results = run(ranks, client, n, "reduce_scatter_inplace", "float32", red=red)
    full = reduce_ref(inputs(seed, n, n * COUNT, "float32", red), red,
                      "float32").reshape(n, COUNT)
    check_variants(results, [full[r] for r in range(n)], "float32", "reduce_scatter in place")


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather(ranks, client, n, dtype):
    seed, results = run(ranks, client, n, "all_gather", dtype)
    check_variants(results, [inputs(seed, n, COUNT, dtype)] * n, dtype, "all_gather")


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["float64", "uint8"])
def test_all_gather_in_place(ranks, client, n, dtype):
    seed, results = run(ranks, client, n, "all_gather_inplace", dtype)
    check_variants(results, [inputs(seed, n, COUNT, dtype)] * n, dtype, "all_gather in place")


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast(ranks, client, n, dtype):
    seed, results = run(ranks, client, n, "broadcast", dtype)
    want = rank_tasks.make_input(seed, n - 1, COUNT, dtype)
    check_variants(results, [want] * n, dtype, "broadcast")


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("red", ["sum", "min", "avg"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce(ranks, client, n, dtype, red):
    seed, results = run(ranks, client, n, "reduce", dtype, red=red)
    root = n // 2
    want = reduce_ref(inputs(seed, n, COUNT, dtype, red), red, dtype)
    zeros = np.zeros(COUNT, dtype)  # the other ranks' out is untouched
    check_variants(results, [want if r == root else zeros for r in range(n)], dtype, "reduce")


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all(ranks, client, n, dtype):
    seed, results = run(ranks, client, n, "all_to_all", dtype)
    x = inputs(seed, n, n * COUNT, dtype).reshape(n, n, COUNT)  # [sender][receiver]
    check_variants(results, [x[:, r] for r in range(n)], dtype, "all_to_all")


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all_v(ranks, client, n, dtype):
    seed, results = run(ranks, client, n, "all_to_all_v", dtype)
    sends = []
    for s in range(n):
        sc = [(s + p) % 3 + 1 for p in range(n)]
        x = rank_tasks.make_input(seed, s, sum(sc), dtype)
        offsets = np.cumsum([0] + sc)
        sends.append([x[offsets[p]:offsets[p + 1]] for p in range(n)])
    want = [np.concatenate([sends[s][r] for s in range(n)]) for r in range(n)]
    check_variants(results, want, dtype, "all_to_all_v")


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_send_recv_ring(ranks, client, n, dtype):
    seed, results = run(ranks, client, n, "send_recv", dtype)
    want = [rank_tasks.make_input(seed, (r - 1) % n, COUNT, dtype) for r in range(n)]
    check_variants(results, want, dtype, "send/recv")


@pytest.mark.parametrize("n", WORLDS)
def test_barrier(ranks, client, n):
    _, results = run(ranks, client, n, "barrier", "float32")
    check_variants(results, [None] * n, "float32", "barrier")


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
def test_large_multi_chunk(ranks, client, op):
    """Larger than the daemon's chunk (256 KiB): several steps of its plan."""
    n, count, dtype = 4, 100_003, "float32"
    seed, results = run(ranks, client, n, op, dtype, count=count)
    if op == "all_reduce":
        want = [reduce_ref(inputs(seed, n, count, dtype), "sum", dtype)] * n
    elif op == "all_gather":
        want = [inputs(seed, n, count, dtype)] * n
    else:
        full = reduce_ref(inputs(seed, n, n * count, dtype), "sum", dtype).reshape(n, count)
        want = [full[r] for r in range(n)]
    check_variants(results, want, dtype, op)
