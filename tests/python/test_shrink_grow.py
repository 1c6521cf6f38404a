"""Comm.shrink and Comm.grow (issue 58's explicit shrink and grow, as ncclCommShrink and
ncclCommGrow): survivors renumbered without an id handed around, a new rank joining with the id
an existing rank obtains; and the derived ids agree with the C++ client's."""

import os

import numpy as np
import pytest

import rank_tasks
from railyard._comm_ids import derived_comm_id


def test_derived_ids_match_the_cpp_clients():
    # The same pair as tests/integration/shrink_grow_test.cc checks in C++.
    assert (derived_comm_id("ry1-0123456789abcdef0123456789abcdef@10.0.0.1:7070", "shrink/1/3")
            == "ry1-3fd3c6c74204b9cc3950258877052ad2@10.0.0.1:7070")


def test_shrink_then_grow(ranks, client, tmp_path):
    n = 4
    comm_id = client.new_comm_id()
    res = ranks.run(rank_tasks.shrink_and_grow,
                    [(r, n, comm_id, str(tmp_path / "grow-id")) for r in range(n)], timeout=120)
    assert [r.get("full") for r in res[:3]] == [6.0, 6.0, 6.0], res
    assert res[1] == {"full": 6.0}, res
    # Ranks 0 and 2 survive as 0 and 1 of 2: 1 + 3.
    assert (res[0]["shrunk_rank"], res[2]["shrunk_rank"]) == (0, 1), res
    assert res[0]["shrunk"] == res[2]["shrunk"] == 4.0, res
    # Grown to 3 with the pool's last rank as rank 2: 1 + 2 + 3.
    assert [res[r]["grown_rank"] for r in (0, 2, 3)] == [0, 1, 2], res
    assert all(res[r]["grown"] == 6.0 and res[r]["grown_n"] == 3 for r in (0, 2, 3)), res


def test_bad_shrink_and_grow_arguments(client):
    import railyard
    comm = client.comm(client.new_comm_id(), 0, 1)
    try:
        for bad in ([5], [0], [-1]):
            with pytest.raises(railyard.InvalidArgumentError):
                comm.shrink(bad)
        with pytest.raises(railyard.InvalidArgumentError):
            comm.grow(1)
        with pytest.raises(railyard.InvalidArgumentError):
            comm.grow_id(0)
    finally:
        comm.close()


def test_on_failure_shrink_goes_on_without_a_rank_that_left(ranks, client):
    n = 3
    comm_id = client.new_comm_id()
    res = ranks.run(rank_tasks.auto_shrink_after_a_departure,
                    [(r, n, comm_id) for r in range(n)], timeout=120)
    assert [r["first"] for r in res] == [6.0, 6.0, 6.0], res
    for r in (0, 1):
        assert res[r]["error"] == "AbortedError", res[r]
        assert res[r]["lost"] == [2] and res[r]["lost_ranks"] == [2], res[r]
        assert res[r]["shrunk"] is True, res[r]
        assert "rank(s) 2 of 3 are gone" in res[r]["message"], res[r]
        assert (res[r]["rank"], res[r]["nranks"]) == (r, 2), res[r]
        assert res[r]["after"] == 3.0, res[r]  # 1 + 2


def test_bad_on_failure_and_census_arguments(client):
    import railyard
    from railyard._generated import local_pb2
    comm_id = client.new_comm_id()
    for bad in ("restart", "", None, 1):
        with pytest.raises(railyard.InvalidArgumentError, match="on_failure"):
            client.comm(comm_id, 0, 1, on_failure=bad)
    for bad in (0, -1, "5", True, float("nan")):
        with pytest.raises(railyard.InvalidArgumentError, match="shrink_timeout"):
            client.comm(comm_id, 0, 1, on_failure="shrink", shrink_timeout=bad)
    comm = client.comm(comm_id, 0, 1, on_failure="shrink")
    try:
        healthy = client._call("CommCensus", local_pb2.CommCensusRequest(comm_handle=comm.handle))
        assert list(healthy.lost_ranks) == [] and healthy.failure_code == 0, healthy
        assert healthy.coordinator == comm_id.split("@", 1)[1], healthy
        with pytest.raises(railyard.InvalidArgumentError, match="30000"):
            client._call("CommCensus", local_pb2.CommCensusRequest(comm_handle=comm.handle,
                                                                   timeout_ms=30001))
        for bad in ([5], [-1], [0, 0]):  # out of range; more ranks than the communicator has
            with pytest.raises(railyard.InvalidArgumentError, match="exclude"):
                client._call("CommCensus", local_pb2.CommCensusRequest(comm_handle=comm.handle,
                                                                       exclude=bad))
        with pytest.raises(railyard.NotFoundError, match="not a communicator of this session"):
            client._call("CommCensus", local_pb2.CommCensusRequest(comm_handle=987654))
        # A healthy communicator's failed operation (a bad root is refused at once) shrinks nothing.
        with pytest.raises(railyard.InvalidArgumentError):
            comm.broadcast(np.zeros(4, np.float32), root=3)
        assert comm.nranks == 1 and comm.lost_ranks == []
    finally:
        comm.close()
