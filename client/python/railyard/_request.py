"""One operation's request fields, as the ring entry and the gRPC Submit both take them."""

from __future__ import annotations

import struct
from typing import Any, List, Optional, Tuple

from . import _ring
from ._generated import local_pb2


class _Request:
    """One operation's SubmitRequest fields. The ring path encodes them straight into a ring
    entry; only the gRPC fallback builds the protobuf message (:meth:`proto`)."""

    __slots__ = ("comm_handle", "op", "dtype", "red_op", "count", "root", "timeout_ms", "algo",
                 "compression", "error_feedback", "compression_key", "vectors", "send", "recv",
                 "request_id", "stream_sync")

    def __init__(self, comm_handle: int, op: int, dtype: int, red_op: int, count: int,
                 root: int, timeout_ms: int, algo: str, compression: str = "",
                 error_feedback: bool = False, compression_key: int = 0,
                 send_counts: Optional[List[int]] = None,
                 send_displs: Optional[List[int]] = None,
                 recv_counts: Optional[List[int]] = None,
                 recv_displs: Optional[List[int]] = None) -> None:
        if not isinstance(algo, str):
            raise TypeError(f"algo must be a str, not {type(algo).__name__}")
        if not isinstance(compression, str):
            raise TypeError(f"compression must be a str, not {type(compression).__name__}")
        self.comm_handle = comm_handle
        self.op = op
        self.dtype = dtype
        self.red_op = red_op
        self.count = count
        self.root = root
        self.timeout_ms = timeout_ms
        self.algo = algo
        self.compression = compression
        self.error_feedback = error_feedback
        self.compression_key = compression_key
        self.vectors: Optional[Tuple[List[int], ...]] = None
        if send_counts is not None:
            self.vectors = (send_counts, send_displs or [], recv_counts or [], recv_displs or [])
        self.send: Optional[Tuple[int, int]] = None  # (buffer id, offset)
        self.recv: Optional[Tuple[int, int]] = None
        self.request_id = 0
        self.stream_sync: Optional[Tuple[int, int, int]] = None  # (buffer id, offset, value)

    @classmethod
    def from_entry(cls, entry: bytes) -> "_Request":
        """The request a ring entry (and its extension slots) encodes: for sending an entry
        again over gRPC, where the session it moved to has no rings."""
        (request_id, comm, count, send_b, send_o, recv_b, recv_o, op, dtype, red_op, root,
         timeout_ms, flags, ext, vec_len, algo, compression, key) = _ring.ENTRY.unpack_from(entry)
        r = cls(comm, op, dtype, red_op, count, root, timeout_ms,
                algo.rstrip(b"\0").decode(), compression.rstrip(b"\0").decode(),
                bool(flags & _ring.FLAG_ERROR_FEEDBACK), key)
        r.request_id = request_id
        r.send = (send_b, send_o) if send_b else None
        r.recv = (recv_b, recv_o) if recv_b else None
        if vec_len:
            flat = struct.unpack_from(f"<{4 * vec_len}Q", entry, _ring.SQ_ENTRY)
            r.vectors = tuple(list(flat[i * vec_len:(i + 1) * vec_len]) for i in range(4))
        if flags & _ring.FLAG_STREAM_SYNC:
            r.stream_sync = _ring._SYNC.unpack_from(entry, ext * _ring.SQ_ENTRY)
        return r

    def proto(self, session_id: str) -> Any:
        r = local_pb2.SubmitRequest(
            session_id=session_id, request_id=self.request_id, comm_handle=self.comm_handle,
            op=self.op, dtype=self.dtype, red_op=self.red_op, count=self.count, root=self.root,
            timeout_ms=self.timeout_ms, algo=self.algo, compression=self.compression,
            error_feedback=self.error_feedback, compression_key=self.compression_key)
        for field, ref in ((r.send, self.send), (r.recv, self.recv)):
            if ref is not None:
                field.buffer_id, field.offset = ref
        if self.stream_sync is not None:
            r.stream_sync.words.buffer_id, r.stream_sync.words.offset, r.stream_sync.value = \
                self.stream_sync
        if self.vectors is not None:
            r.send_counts.extend(self.vectors[0])
            r.send_displs.extend(self.vectors[1])
            r.recv_counts.extend(self.vectors[2])
            r.recv_displs.extend(self.vectors[3])
        return r
