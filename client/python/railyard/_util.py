"""Small helpers shared by the client's modules (client, comm, work)."""

from __future__ import annotations

import grpc

from .errors import InvalidArgumentError

#: What a process forked from one that connected is told to do instead.
SPAWN_HINT = ("gRPC does not survive fork(): start worker processes with the \"spawn\" start "
              "method (multiprocessing.set_start_method(\"spawn\") or "
              "torch.multiprocessing.spawn) and connect in the worker")


def invalid(message: str) -> InvalidArgumentError:
    """An INVALID_ARGUMENT error saying ``message``."""
    return InvalidArgumentError(grpc.StatusCode.INVALID_ARGUMENT, message)
