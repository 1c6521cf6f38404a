"""What a communicator made with ``on_failure="shrink"`` does when one of its operations fails:
it asks its daemon which ranks are gone (``Local.CommCensus``: every member daemon's answer, a
node that does not answer losing all its ranks) and, when some are, joins the communicator of the
survivors in its place, as ``Comm.shrink`` would, with an id every survivor derives alike from the
same answer. The failed operation's error then names the lost ranks and nodes, and says what the
communicator is now. Runs on the thread that waits for the failed operation, never on the
session's reader."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence

import grpc

from ._generated import local_pb2
from .errors import RailyardError, error_from_code

if TYPE_CHECKING:  # pragma: no cover
    from .comm import Comm

# How long each other member daemon may take to say which of its ranks are still there.
CENSUS_TIMEOUT_MS = 2000

# The codes of a failure that a missing rank causes: a dead peer or link (UNAVAILABLE), a rank
# that died or left (ABORTED), one that never submitted (DEADLINE_EXCEEDED), a daemon stopping
# (CANCELLED). Others (a disagreement, corrupt data, a bad argument) are not a shrink's to mend.
_LOSS_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED,
               grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


def _with(error: RailyardError, note: str, lost: List[int], nodes: List[str],
          shrunk: bool = False) -> RailyardError:
    """error with note appended; lost_ranks and lost_nodes say who is gone, shrunk whether this
    failure's wait moved the communicator to the survivors' (only one wait per loss does)."""
    out = error_from_code(error.code, f"{error.message}; {note}")
    out.lost_ranks = list(lost)  # type: ignore[attr-defined]
    out.lost_nodes = list(nodes)  # type: ignore[attr-defined]
    out.shrunk = shrunk  # type: ignore[attr-defined]
    return out


def census(comm: "Comm", exclude: Sequence[int] = ()) -> local_pb2.CommCensusResponse:
    """The daemon's census of ``comm`` (its current communicator); with ``exclude``, only the
    coordinator of a shrink without those ranks (no other daemon asked)."""
    client = comm.client
    handle = comm.handle
    return client._call(
        "CommCensus", local_pb2.CommCensusRequest(comm_handle=handle,
                                                  timeout_ms=CENSUS_TIMEOUT_MS,
                                                  exclude=list(exclude)),
        timeout=CENSUS_TIMEOUT_MS / 1000.0 + 10.0,
        prepare=lambda r: setattr(r, "comm_handle", client._daemon_comm(handle)))


def after_failure(comm: "Comm", error: RailyardError, generation: int) -> RailyardError:
    """The error to raise for an operation of ``comm``'s ``generation`` that failed with
    ``error``; shrinks ``comm`` first when its communicator failed because ranks are gone."""
    with comm._shrinking:
        if comm._generation != generation:
            return _with(error, f"the communicator has since shrunk without rank(s) "
                         f"{', '.join(map(str, comm.lost_ranks))}; it is now rank {comm.rank} of "
                         f"{comm.nranks} of {comm.comm_id}", comm.lost_ranks, comm.lost_nodes)
        if not comm.handle or comm.client.closed or error.code not in _LOSS_CODES:
            return error
        try:
            answer = census(comm)
        except RailyardError as e:
            return _with(error, f"could not ask which ranks are gone: {e}", [], [])
        lost = sorted(int(r) for r in answer.lost_ranks)
        nodes = list(answer.lost_nodes)
        if not lost or comm.rank in lost:
            return error  # no rank is gone: nothing to drop
        old_id, old_handle, old_n = comm.comm_id, comm.handle, comm.nranks
        child, newrank, newn = comm._shrunk(comm._children + 1, lost, answer.coordinator)
        state = comm._state
        integrity: Optional[str] = state.integrity if state is not None else None
        where = f" (node(s) {'; '.join(nodes)})" if nodes else ""
        try:
            new = comm.client.comm(child, newrank, newn, comm.shrink_timeout,
                                   integrity=integrity)
        except RailyardError as e:
            return _with(error, f"rank(s) {', '.join(map(str, lost))} of {old_n} are gone{where}"
                         f"; joining the {newn} survivors' communicator {child} failed: {e}",
                         lost, nodes)
        comm._adopt(new)  # its shrink/grow count starts again, as the child's of Comm.shrink
        comm.lost_ranks = lost
        comm.lost_nodes = nodes
        comm._generation += 1
        try:
            comm.client._destroy_comm(old_handle)
        except RailyardError:
            pass  # the old communicator has failed already; leaving it is best effort
        return _with(error, f"rank(s) {', '.join(map(str, lost))} of {old_n} are gone{where} "
                     f"(communicator {old_id}: {answer.failure or 'failed'}); it continues "
                     f"without them as {child}, this rank now {newrank} of {newn}", lost, nodes,
                     shrunk=True)
