"""The client's end of the buffer side channel (proto/railyard/v1/fd_channel.h in the source
tree): a SOCK_SEQPACKET connection to ``<socket>.fd``, opened before ``Local.Connect``, whose HELLO
ticket Connect names, and over which each buffer's memfd goes (SCM_RIGHTS) for a one-time handle.
The constants are the header's own (gen_stubs.py generates railyard._layouts from it).
"""

from __future__ import annotations

import socket as _socket
import struct
import threading
from typing import Tuple

from ._generated import layouts as _h

MAGIC = _h.FD_MAGIC  # "RYFD"
VERSION = _h.FD_VERSION
HELLO, PUT, PUT_OK, ERROR = _h.FD_TYPE_HELLO, _h.FD_TYPE_PUT, _h.FD_TYPE_PUT_OK, _h.FD_TYPE_ERROR
HEADER = struct.Struct("<IHHQQII")  # magic, version, type, cookie, handle, code, length
MAX_MESSAGE = _h.FD_MAX_MESSAGE
TICKET_CHARS = _h.FD_TICKET_CHARS
if HEADER.size != _h.FD_HEADER_BYTES or MAX_MESSAGE != HEADER.size + _h.FD_MAX_PAYLOAD:
    raise ImportError(f"railyard._fd_channel: a {HEADER.size}-byte header, where "
                      f"proto/railyard/v1/fd_channel.h has {_h.FD_HEADER_BYTES} (and messages "
                      f"of at most {_h.FD_MAX_MESSAGE} bytes)")


def encode(kind: int, cookie: int = 0, handle: int = 0, code: int = 0,
           payload: bytes = b"") -> bytes:
    return HEADER.pack(MAGIC, VERSION, kind, cookie, handle, code, len(payload)) + payload


def decode(data: bytes) -> Tuple[int, int, int, int, bytes]:
    """``(type, cookie, handle, code, payload)``; ``ValueError`` for a malformed message."""
    if len(data) < HEADER.size:
        raise ValueError("fd channel message shorter than its header")
    magic, version, kind, cookie, handle, code, length = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or length != len(data) - HEADER.size:
        raise ValueError("malformed fd channel message")
    return kind, cookie, handle, code, data[HEADER.size:]


class ChannelError(Exception):
    """The daemon answered with ERROR (``code`` is a grpc status code number), or the channel
    broke (``code`` 14, UNAVAILABLE)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class FdChannel:
    """Connects to ``<client_socket>.fd`` and reads the HELLO ticket. Thread-safe."""

    def __init__(self, client_socket: str, timeout: float) -> None:
        self.path = client_socket + ".fd"
        self._lock = threading.Lock()
        self._cookies = 1
        self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(self.path)
            kind, _, _, code, payload = self._receive()
        except BaseException:
            self._sock.close()
            raise
        if kind == ERROR:
            self._sock.close()
            raise ChannelError(code, "railyardd refused the fd side channel: " +
                               payload.decode(errors="replace"))
        if kind != HELLO or len(payload) != TICKET_CHARS:
            self._sock.close()
            raise ChannelError(13, "the fd side channel did not start with a HELLO ticket")
        self.ticket = payload.decode()

    def _receive(self) -> Tuple[int, int, int, int, bytes]:
        try:
            data = self._sock.recv(MAX_MESSAGE)
        except _socket.timeout:
            raise ChannelError(4, f"railyardd's fd side channel {self.path} did not answer in "
                                  "time") from None
        except OSError as e:
            raise ChannelError(14, f"railyardd's fd side channel {self.path}: {e}") from None
        if not data:
            raise ChannelError(14, f"railyardd's fd side channel {self.path} closed")
        try:
            return decode(data)
        except ValueError as e:
            raise ChannelError(13, str(e)) from None

    def put(self, fd: int, timeout: float) -> int:
        """Sends ``fd``; returns the handle RegisterBuffer names. ``ChannelError`` otherwise."""
        with self._lock:
            cookie = self._cookies
            self._cookies += 1
            self._sock.settimeout(timeout)
            try:
                _socket.send_fds(self._sock, [encode(PUT, cookie)], [fd])
            except OSError as e:
                raise ChannelError(14, f"sending a buffer descriptor on {self.path}: {e}") from None
            kind, got_cookie, handle, code, payload = self._receive()
        if got_cookie != cookie:
            raise ChannelError(13, "the fd side channel answered another request")
        if kind == ERROR:
            raise ChannelError(code, payload.decode(errors="replace"))
        if kind != PUT_OK:
            raise ChannelError(13, "unexpected message on the fd side channel")
        return handle

    def close(self) -> None:
        self._sock.close()
