"""Exceptions raised by the Railyard client.

Every error is a :class:`RailyardError` carrying the gRPC status code (``code``, a
:class:`grpc.StatusCode`) and the message (``message``, usually the daemon's own words). Each
code has its own subclass, so callers can catch exactly what they expect::

    try:
        comm.all_reduce(x)
    except railyard.DeadlineExceededError as e:   # also a builtin TimeoutError
        ...

Several subclasses also derive from the closest builtin exception (``ValueError``,
``TimeoutError``, ``ConnectionError``, ``PermissionError``, ``LookupError``,
``NotImplementedError``) so generic handlers keep working.
"""

from __future__ import annotations

from typing import Dict, Type

import grpc

__all__ = [
    "RailyardError",
    "CancelledError",
    "UnknownError",
    "InvalidArgumentError",
    "DeadlineExceededError",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "AbortedError",
    "OutOfRangeError",
    "UnimplementedError",
    "InternalError",
    "UnavailableError",
    "DataLossError",
    "UnauthenticatedError",
    "error_from_code",
    "error_from_rpc",
]


class RailyardError(Exception):
    """Base class of every Railyard error.

    Attributes:
        code: the gRPC status code (:class:`grpc.StatusCode`) of the failure.
        message: the human-readable reason, as given by the daemon when it came from the daemon.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.name}, {self.message!r})"

    def __reduce__(self):  # picklable across processes (multiprocessing)
        return (_rebuild, (self.code.value[0], self.message))


class CancelledError(RailyardError):
    """The operation was cancelled, typically because the client disconnected."""


class UnknownError(RailyardError):
    """An error with no better classification."""


class InvalidArgumentError(RailyardError, ValueError):
    """A request was malformed, or ranks disagreed on a collective (which aborts the comm)."""


class DeadlineExceededError(RailyardError, TimeoutError):
    """A timeout expired: in the daemon (ranks missing) or on the client (``wait(timeout)``)."""


class NotFoundError(RailyardError, LookupError):
    """A handle (buffer, communicator, session) does not exist in this job."""


class AlreadyExistsError(RailyardError):
    """Something that must be unique already exists (e.g. a rank joined twice)."""


class PermissionDeniedError(RailyardError, PermissionError):
    """The job's token did not match."""


class ResourceExhaustedError(RailyardError):
    """Out of shared memory or another daemon resource."""


class FailedPreconditionError(RailyardError):
    """The operation is not possible in the current state (e.g. the client is closed)."""


class AbortedError(RailyardError):
    """The communicator was aborted by an earlier failure; the message gives the original reason."""


class OutOfRangeError(RailyardError, ValueError):
    """A value was out of range."""


class UnimplementedError(RailyardError, NotImplementedError):
    """Not supported by this daemon (e.g. a communicator spanning several daemons)."""


class InternalError(RailyardError):
    """An internal error in the daemon or the client."""


class UnavailableError(RailyardError, ConnectionError):
    """The daemon is not reachable, went away, or a peer rank left its communicator."""


class DataLossError(RailyardError):
    """Unrecoverable data loss."""


class UnauthenticatedError(RailyardError, PermissionError):
    """Missing credentials."""


_BY_CODE: Dict[grpc.StatusCode, Type[RailyardError]] = {
    grpc.StatusCode.CANCELLED: CancelledError,
    grpc.StatusCode.UNKNOWN: UnknownError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.ABORTED: AbortedError,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRangeError,
    grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DATA_LOSS: DataLossError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}
_CODE_BY_INT: Dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}


def status_code(code: int) -> grpc.StatusCode:
    """The :class:`grpc.StatusCode` of a google.rpc code number (UNKNOWN when out of range)."""
    return _CODE_BY_INT.get(code, grpc.StatusCode.UNKNOWN)


def error_from_code(code, message: str) -> RailyardError:
    """The exception for a status ``code`` (a :class:`grpc.StatusCode` or its number)."""
    if not isinstance(code, grpc.StatusCode):
        code = status_code(int(code))
    return _BY_CODE.get(code, RailyardError)(code, message)


def error_from_rpc(err: grpc.RpcError, context: str = "") -> RailyardError:
    """Converts a failed gRPC call, keeping its code and the daemon's message."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    message = f"{context}: {details}" if context else (details or "")
    return error_from_code(code or grpc.StatusCode.UNKNOWN, message)


def _rebuild(code: int, message: str) -> RailyardError:
    return error_from_code(code, message)
