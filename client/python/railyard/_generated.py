"""The modules the build generates (client/python/gen_stubs.py; never in the source tree), imported
here once so that an unbuilt source tree fails with one error that says what to do:

- ``railyard.v1``: the gRPC stubs of proto/railyard/v1/*.proto (``common_pb2`` holds the wire
  numbers of data types, reduction operators and operations);
- ``railyard._version``: ``VERSION``, project(VERSION) of the top CMakeLists.txt;
- ``railyard._layouts``: the constants of the byte layouts shared with the daemon, read from the
  C++ headers that define them (proto/railyard/v1/ring.h, fd_channel.h, spin_yield.h).
"""

from __future__ import annotations

try:
    from . import _layouts as layouts
    from ._version import VERSION
    from .v1 import common_pb2, local_pb2, local_pb2_grpc
except ImportError as _e:  # pragma: no cover - only in an unbuilt source tree
    raise ImportError(
        "railyard's generated modules (the gRPC stubs railyard.v1.*_pb2, railyard._version, "
        "railyard._layouts) are missing: use the copy the build places in <build>/python (cmake "
        "target railyard_python), or `pip install ./client/python`, or run "
        "client/python/gen_stubs.py") from _e

__all__ = ["layouts", "VERSION", "common_pb2", "local_pb2", "local_pb2_grpc"]
