"""Gradient compression through the torch backend (docs/compression.md): DDP on the example MLP
across two daemons (virtual nodes on loopback, two ranks each), its buckets all-reduced by
railyard.torch.compression_hook. int8 with error feedback must end within 2 % of the exact
run's final loss; top-k 1 % without error feedback must end worse than both."""

import json
import os
import threading

import numpy as np
import pytest

import rank_tasks
from conftest import Daemon, RankPool

STEPS = 300
PER_NODE = 2


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nodes")
    daemons, pools = [], []
    try:
        for i in range(2):
            topo = tmp / f"vnode{i}.json"
            topo.write_text(json.dumps({"node": f"vnode{i}", "rails": [
                {"name": "rail0", "device": "lo"}, {"name": "rail1", "device": "lo"}]}))
            d = Daemon("--peer_listen=127.0.0.1:0", "--peer_insecure", f"--topology={topo}",
                       node_name=f"vnode{i}")
            daemons.append(d)
            pools.append(RankPool(PER_NODE, {"RAILYARD_SOCKET": d.socket,
                                             "RAILYARD_JOB": "pytest-compress"}))
        yield pools
    finally:
        for p in pools:
            p.close()
        for d in daemons:
            d.stop()


def on_both_nodes(pools, task, args, timeout):
    """Runs task on ranks 0-1 (vnode0) and 2-3 (vnode1) at once, args(rank) giving each rank's
    arguments; returns every rank's result, in rank order."""
    results = [None, None]
    errors = []

    def node(i):
        try:
            results[i] = pools[i].run(task, [args(i * PER_NODE + r) for r in range(PER_NODE)],
                                      timeout=timeout)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results[0] + results[1]


def train(pools, store_path, codec, feedback):
    """Ranks 0-1 on vnode0 and 2-3 on vnode1; returns every rank's result."""
    n = 2 * PER_NODE
    return on_both_nodes(pools, rank_tasks.ddp_compressed,
                         lambda r: (r, n, store_path, codec, feedback, STEPS), 240)


def final_loss(run):
    return float(np.mean(run[0]["mean_losses"][-20:]))


def test_ddp_int8_with_error_feedback_matches_exact_and_topk_without_is_worse(two_nodes,
                                                                               tmp_path):
    exact = train(two_nodes, str(tmp_path / "exact"), "", False)
    int8 = train(two_nodes, str(tmp_path / "int8"), "int8", True)
    topk = train(two_nodes, str(tmp_path / "topk"), "topk:0.01", False)
    for name, run in (("exact", exact), ("int8", int8), ("topk", topk)):
        # Every rank applies the very same averaged gradients: the same parameters everywhere.
        for r in range(1, len(run)):
            for p0, p in zip(run[0]["params"], run[r]["params"]):
                np.testing.assert_array_equal(p0, p, err_msg=f"{name}: rank {r} parameters")
        assert run[0]["mean_losses"][-1] < run[0]["mean_losses"][0], name
    e, i, t = final_loss(exact), final_loss(int8), final_loss(topk)
    print(f"final loss (mean of the last 20 of {STEPS} steps): exact {e:.6f}, int8 + error "
          f"feedback {i:.6f}, top-k 1% without {t:.6f}")
    assert abs(i - e) <= 0.02 * e, f"int8 + error feedback ends at {i}, exact at {e}"
    assert t > i and t > e * 1.02, f"top-k 1% without error feedback ends at {t}"


def test_reduce_scatter_takes_a_codec_and_refuses_bad_ones(two_nodes):
    """The Python reduce_scatter passes compression through: across the two daemons every rank's
    chunk is within int8's error of the exact sum, and a bad codec or key is refused before
    anything runs (the communicator goes on)."""
    import railyard
    count = 4096
    creator = railyard.connect(two_nodes[0].env["RAILYARD_SOCKET"], job="pytest-compress")
    try:
        comm_id = creator.new_comm_id()
    finally:
        creator.close()
    n = 2 * PER_NODE
    got = on_both_nodes(two_nodes, rank_tasks.compressed_reduce_scatter,
                        lambda r: (r, n, comm_id, "int8", count), 120)
    inputs = [np.sin(0.01 * np.arange(n * count, dtype=np.float64) + r).astype(np.float32)
              for r in range(n)]
    exact = np.sum(np.array(inputs, dtype=np.float64), axis=0)
    for r in range(n):
        out = np.asarray(got[r]["out"], dtype=np.float64)
        want = exact[r * count:(r + 1) * count]
        # int8: each of the other node's partials (|partial| <= 2 here) off by at most
        # scale / 2 = 2 / 254; this node's own contribution is exact.
        assert np.max(np.abs(out - want)) <= 2 / 254 + 1e-5, f"rank {r}"
        assert np.max(np.abs(out - want)) > 0, "int8 ran exact: the codec was not passed"
        assert "int9" in got[r]["refused"]["codec"], got[r]["refused"]
        assert "compression_key" in got[r]["refused"]["key"], got[r]["refused"]
