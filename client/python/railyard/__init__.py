"""Railyard: collectives through the node's railyardd daemon, from Python.

Three lines::

    import railyard
    comm = railyard.connect().comm(comm_id, rank, nranks)   # comm_id from client.new_comm_id()
    comm.all_reduce(x)                                        # x: a numpy array, summed in place

Arrays from ``client.empty(shape, dtype)`` live in shared memory mapped by the daemon, so
collectives on them copy nothing; other arrays are copied in and out (slower). Errors raise
:class:`RailyardError` subclasses carrying the gRPC code and the daemon's message.

``import railyard.torch`` registers the ``"railyard"`` backend with ``torch.distributed``.
"""

from . import _generated
from ._device import DeviceArray
from ._streams import CudaStreamOps, StreamOps
from .client import DEFAULT_SOCKET, Client, connect, init_from_env
from .comm import Comm
from .wire import DTYPE_BFLOAT16, SUPPORTED_DTYPES, ReduceOp
from .work import Work
from .errors import (
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    RailyardError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
)

#: project(VERSION) of the top CMakeLists.txt (generated into railyard._version by the build).
__version__ = _generated.VERSION

__all__ = [
    "connect", "init_from_env", "Client", "Comm", "Work", "DeviceArray", "ReduceOp",
    "StreamOps", "CudaStreamOps",
    "DEFAULT_SOCKET",
    "SUPPORTED_DTYPES", "DTYPE_BFLOAT16",
    "RailyardError", "AbortedError", "AlreadyExistsError", "CancelledError", "DataLossError",
    "DeadlineExceededError", "FailedPreconditionError", "InternalError", "InvalidArgumentError",
    "NotFoundError", "OutOfRangeError", "PermissionDeniedError", "ResourceExhaustedError",
    "UnauthenticatedError", "UnavailableError", "UnimplementedError", "UnknownError",
]
