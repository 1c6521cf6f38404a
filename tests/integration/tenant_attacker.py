"""What a hostile tenant on the node runs, as its own process: `python3 tenant_attacker.py
<attack> <json args>` prints one JSON object with what each attempt got back (status code names
and messages), for tenant_isolation_test.py to judge. It talks to railyardd the way any local
process can: the client socket, the `.fd` side channel (raw bytes and SCM_RIGHTS), /dev/shm and
/proc. Every wait is bounded.
"""

import fcntl
import json
import mmap
import os
import socket
import struct
import sys
import tempfile
import time

import grpc

from railyard import _fd_channel as fdc
from railyard.v1 import admin_pb2, admin_pb2_grpc, common_pb2, local_pb2, local_pb2_grpc

SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def code_name(code):
    return grpc.StatusCode(code).name if isinstance(code, grpc.StatusCode) else code


class Raw:
    """A session made by hand: side channel + Connect stream + unary calls."""

    def __init__(self, sock, job, token, pid=None):
        self.sock_path = sock
        self.side = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.side.settimeout(10)
        self.side.connect(sock + ".fd")
        kind, _, _, _, payload = fdc.decode(self.side.recv(fdc.MAX_MESSAGE))
        assert kind == fdc.HELLO, kind
        self.ticket = payload.decode()
        self.channel = grpc.insecure_channel("unix:" + sock)
        self.stub = local_pb2_grpc.LocalStub(self.channel)
        self.session = ""
        self.error = None
        self.stream = self.stub.Connect(local_pb2.ConnectRequest(
            job_id=job, token=token, pid=pid or os.getpid(), client="attacker",
            fd_ticket=self.ticket),
            timeout=3600)
        try:
            event = next(self.stream)
            self.session = event.connected.session_id
        except grpc.RpcError as e:
            self.error = (e.code().name, e.details())

    def put(self, fds, payload=None):
        """Sends a PUT (or `payload` bytes) with `fds`; returns the reply (type, handle, code, text)
        or ("closed",) when the daemon hung up."""
        data = payload if payload is not None else fdc.encode(fdc.PUT, cookie=7)
        if fds:
            socket.send_fds(self.side, [data], fds)
        else:
            self.side.send(data)
        try:
            reply = self.side.recv(fdc.MAX_MESSAGE)
        except OSError as e:
            return ("closed", str(e))
        if not reply:
            return ("closed",)
        kind, _, handle, code, text = fdc.decode(reply)
        return (kind, handle, code, text.decode(errors="replace"))

    def side_closed(self):
        """True when the daemon closed the side channel (EOF within 5 s)."""
        self.side.settimeout(5)
        try:
            while True:
                data = self.side.recv(fdc.MAX_MESSAGE)
                if not data:
                    return True
        except OSError:
            return False

    def register(self, handle, size, **fields):
        try:
            r = self.stub.RegisterBuffer(local_pb2.RegisterBufferRequest(
                session_id=self.session, fd_handle=handle, size_bytes=size, **fields), timeout=10)
            return ("OK", r.buffer_id)
        except grpc.RpcError as e:
            return (e.code().name, e.details())

    def close(self):
        self.stream.cancel()
        self.channel.close()
        self.side.close()


def memfd(size, seals=SEALS, allocate=True):
    fd = os.memfd_create("railyard.attacker", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    if allocate:
        os.posix_fallocate(fd, 0, size)
    else:
        os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def attack_bad_descriptors(a):
    """Every descriptor that is not a sealed, allocated, read-write memfd, and every malformed
    side-channel message."""
    s = Raw(a["socket"], a["job"], a["token"])
    assert s.session, s.error
    out = {}
    size = 1 << 16
    rw = memfd(size)
    tmp = os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR, 0o600)
    os.ftruncate(tmp, size)
    r, w = os.pipe()
    pair = socket.socketpair()
    cases = {
        "unsealed_memfd": memfd(size, seals=0),
        "memfd_without_grow_seal": memfd(size, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL),
        "memfd_without_shrink_seal": memfd(size, fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL),
        "memfd_seals_not_sealed": memfd(size, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW),
        "write_sealed_memfd": memfd(size, SEALS | fcntl.F_SEAL_WRITE),
        "read_only_memfd": os.open(f"/proc/self/fd/{rw}", os.O_RDONLY),
        "sparse_memfd": memfd(size, allocate=False),
        "regular_file": tmp,
        "pipe": r,
        "dev_zero": os.open("/dev/zero", os.O_RDWR),
        "socket": pair[0].fileno(),
    }
    for name, fd in cases.items():
        reply = s.put([fd])
        out[name] = s.register(reply[1], size) if reply[0] == fdc.PUT_OK else ["put", reply]
    reply = s.put([memfd(4096)])
    out["memfd_smaller_than_size"] = s.register(reply[1], size)
    reply = s.put([memfd(4096)])
    out["size_zero"] = s.register(reply[1], 0)
    out["handle_reused"] = s.register(reply[1], 4096)
    out["handle_never_given"] = s.register(999999, 4096)
    # Memory kinds: one no daemon knows, and device memory on a daemon with no devices.
    reply = s.put([memfd(4096)])
    out["unknown_memory_kind"] = s.register(reply[1], 4096, memory=7)
    reply = s.put([memfd(4096)])
    out["host_memfd_as_device_memory"] = s.register(reply[1], 4096, memory=1, device=0)
    out["put_without_descriptor"] = list(s.put([]))
    out["put_with_two_descriptors"] = list(s.put([memfd(4096), memfd(4096)]))
    reply = s.put([memfd(4096)])
    out["good_after_all_that"] = s.register(reply[1], 4096)
    out["garbage_message"] = list(s.put([], payload=b"GET / HTTP/1.1\r\n\r\n" + b"x" * 20))
    out["garbage_closed_channel"] = s.side_closed()
    s.close()
    s2 = Raw(a["socket"], a["job"], a["token"])
    out["oversized_message"] = list(s2.put([], payload=fdc.encode(fdc.PUT) + b"y" * 400))
    s2.close()
    return out


def attack_foreign_handles(a):
    """Uses the victim's buffer id and a handle it never got, from its own session."""
    s = Raw(a["socket"], a["job"], a["token"])
    assert s.session, s.error
    good = s.put([memfd(4096)])
    own = s.register(good[1], 4096)
    out = {"own_buffer": own}
    req = local_pb2.SubmitRequest(
        session_id=s.session, comm_handle=a["victim_comm_handle"], request_id=1,
        op=common_pb2.COLLECTIVE_OP_ALL_REDUCE, dtype=common_pb2.DATA_TYPE_FLOAT32,
        red_op=common_pb2.RED_OP_SUM, count=16)
    req.send.buffer_id = a["victim_buffer_id"]
    req.recv.buffer_id = a["victim_buffer_id"]
    try:
        s.stub.Submit(req, timeout=10)
        out["submit_on_victim_comm_and_buffer"] = ("OK",)
    except grpc.RpcError as e:
        out["submit_on_victim_comm_and_buffer"] = (e.code().name, e.details())
    # Its own communicator, but the victim's buffer id.
    comm_id = s.stub.CreateCommId(local_pb2.CreateCommIdRequest(session_id=s.session),
                                  timeout=10).comm_id
    handle = s.stub.InitComm(local_pb2.InitCommRequest(session_id=s.session, comm_id=comm_id,
                                                       rank=0, nranks=1), timeout=10).comm_handle
    req.comm_handle = handle
    try:
        s.stub.Submit(req, timeout=10)
        out["submit_on_victim_buffer"] = ("OK",)
    except grpc.RpcError as e:
        out["submit_on_victim_buffer"] = (e.code().name, e.details())
    # Its own communicator and buffer, but the victim's buffer as the stream words the daemon
    # would store "done" into.
    req.send.buffer_id = own[1]
    req.recv.buffer_id = own[1]
    req.stream_sync.words.buffer_id = a["victim_buffer_id"]
    req.stream_sync.words.offset = 0
    req.stream_sync.value = 0x41414141
    try:
        s.stub.Submit(req, timeout=10)
        out["stream_words_in_victim_buffer"] = ("OK",)
    except grpc.RpcError as e:
        out["stream_words_in_victim_buffer"] = (e.code().name, e.details())
    s.close()
    return out


def fake_ipc_handle(pid, fd):
    """A legacy CUDA IPC handle as railyardd --fake_gpus makes them (FakeDeviceRuntime::ExportIpc):
    the maker's pid and the allocation's descriptor number there."""
    return b"RYFKIPC1" + struct.pack("<qi", pid, fd) + bytes(44)


def attack_foreign_cuda_ipc(a):
    """Registers the victim's device memory through a CUDA IPC handle naming the victim's process
    and descriptor, from a session that also claims the victim's pid; then its own, to show the
    path itself works for it."""
    s = Raw(a["socket"], a["job"], a["token"], pid=a["victim_pid"])
    assert s.session, s.error
    cuda = {"memory": local_pb2.MEMORY_KIND_CUDA, "device": 0}
    out = {"victim_memory": s.register(0, 4096, cuda_ipc_handle=fake_ipc_handle(
        a["victim_pid"], a["victim_fd"]), **cuda)}
    own = os.memfd_create("railyard-fake-device-0")
    os.ftruncate(own, 4096)
    out["own_memory"] = s.register(0, 4096, cuda_ipc_handle=fake_ipc_handle(os.getpid(), own),
                                   **cuda)
    out["garbage_handle"] = s.register(0, 4096, cuda_ipc_handle=os.urandom(64), **cuda)
    out["with_a_descriptor_too"] = s.register(
        7, 4096, cuda_ipc_handle=fake_ipc_handle(os.getpid(), own), **cuda)
    s.close()
    return out


def attack_look_for_buffers(a):
    """What another tenant's pod can see of the victim's memory: /dev/shm and every /proc/*/fd
    that points at a memfd it could open."""
    out = {"dev_shm": sorted(n for n in os.listdir("/dev/shm") if "railyard" in n)}
    opened = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if "memfd:railyard" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                    os.close(os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR))
                    opened.append(f"{pid}/{fd}")
            except OSError:
                pass
    out["victim_memfds_opened"] = opened
    out["pid_namespace_pids"] = len([p for p in os.listdir("/proc") if p.isdigit()])
    return out


def attack_shrink_grow(a):
    """Registers a good buffer, then tries to shrink it (the old SIGBUS kill), grow it and punch
    a hole in it, and runs an out-of-place AllReduce on it (2 MiB regions: the daemon checks
    regions of 1 MiB and more for released pages)."""
    s = Raw(a["socket"], a["job"], a["token"])
    assert s.session, s.error
    size = 4 << 20
    fd = memfd(size)
    reply = s.put([fd])
    buf = s.register(reply[1], size)
    out = {"register": buf}
    for name, length in (("shrink", 0), ("grow", 2 * size)):
        try:
            os.ftruncate(fd, length)
            out[name] = "allowed"
        except OSError as e:
            out[name] = os.strerror(e.errno)
    # Punching a hole is allowed by the kernel on a sealed memfd: the pages read back as zeros
    # and the daemon's next touch maps fresh ones (no SIGBUS).
    FALLOC_FL_PUNCH_HOLE, FALLOC_FL_KEEP_SIZE = 2, 1
    libc = __import__("ctypes").CDLL(None, use_errno=True)
    rc = libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, size // 2)
    out["punch_hole"] = "allowed" if rc == 0 else os.strerror(__import__("ctypes").get_errno())
    comm_id = s.stub.CreateCommId(local_pb2.CreateCommIdRequest(session_id=s.session),
                                  timeout=10).comm_id
    handle = s.stub.InitComm(local_pb2.InitCommRequest(session_id=s.session, comm_id=comm_id,
                                                       rank=0, nranks=1), timeout=10).comm_handle
    m = mmap.mmap(fd, size)
    struct.pack_into("<f", m, size // 2, 3.5)
    req = local_pb2.SubmitRequest(
        session_id=s.session, comm_handle=handle, request_id=5,
        op=common_pb2.COLLECTIVE_OP_ALL_REDUCE, dtype=common_pb2.DATA_TYPE_FLOAT32,
        red_op=common_pb2.RED_OP_SUM, count=size // 8)
    req.send.buffer_id = buf[1]
    req.send.offset = size // 2
    req.recv.buffer_id = buf[1]
    req.recv.offset = 0
    # Its receive lies in the hole: the daemon will not fault those pages in on its own account.
    try:
        s.stub.Submit(req, timeout=10)
        out["into_the_hole"] = ("OK",)
    except grpc.RpcError as e:
        out["into_the_hole"] = (e.code().name, e.details())
    # Once the tenant wrote them (its own pages again), the same operation runs.
    m[0:size // 2] = bytes(size // 2)
    s.stub.Submit(req, timeout=10)
    event = next(s.stream)
    out["allreduce"] = (event.completion.code, struct.unpack_from("<f", m, 0)[0])
    s.close()
    return out


def attack_connect(a):
    """Connect attempts: each (job, token) pair of a["attempts"]."""
    out = {}
    for name, (job, token) in a["attempts"].items():
        s = Raw(a["socket"], job, token)
        out[name] = ("OK",) if s.session else s.error
        s.close()
    return out


def attack_admin(a):
    """Admin on the client socket, and the admin socket itself."""
    out = {}
    for name, path in (("admin_on_client_socket", a["socket"]),
                       ("admin_socket", a["socket"] + ".admin")):
        with grpc.insecure_channel("unix:" + path) as ch:
            try:
                r = admin_pb2_grpc.AdminStub(ch).Status(admin_pb2.StatusRequest(), timeout=5)
                out[name] = ("OK", [j.job_id for j in r.jobs])
            except grpc.RpcError as e:
                out[name] = (e.code().name, e.details())
    out["uid"] = os.getuid()
    return out


def attack_quotas(a):
    """Takes each resource to its limit and one past it."""
    out = {}
    sock, job, token = a["socket"], a["job"], a["token"]
    s = Raw(sock, job, token)
    assert s.session, s.error
    # Buffers per session, then bytes per session.
    results = []
    for _ in range(a["max_buffers"] + 1):
        reply = s.put([memfd(4096)])
        results.append(s.register(reply[1], 4096)[0])
    out["buffers"] = results
    s.close()
    s = Raw(sock, job, token)
    reply = s.put([memfd(a["max_bytes"] + 4096)])
    out["bytes"] = s.register(reply[1], a["max_bytes"] + 4096)
    # Communicators per session.
    results = []
    for _ in range(a["max_comms"] + 1):
        comm_id = s.stub.CreateCommId(local_pb2.CreateCommIdRequest(session_id=s.session),
                                      timeout=10).comm_id
        try:
            s.stub.InitComm(local_pb2.InitCommRequest(session_id=s.session, comm_id=comm_id,
                                                      rank=0, nranks=1), timeout=10)
            results.append(("OK",))
        except grpc.RpcError as e:
            results.append((e.code().name, e.details()))
    out["comms"] = results
    # Descriptors sent but never registered, on one channel.
    results = []
    for _ in range(a["max_pending_fds"] + 1):
        reply = s.put([memfd(4096)])
        results.append(reply[0] if reply[0] != fdc.ERROR else ("ERROR", reply[2], reply[3]))
    out["pending_fds"] = results[-2:]
    s.close()
    # Sessions of one job.
    sessions = []
    for _ in range(a["max_sessions_per_job"] + 1):
        sessions.append(Raw(sock, job, token))
    out["sessions_per_job"] = [("OK",) if x.session else x.error for x in sessions]
    for x in sessions:
        x.close()
    # Side-channel connections that never Connect.
    conns = []
    refused = None
    for _ in range(a["max_unbound"] + 1):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        c.settimeout(10)
        c.connect(sock + ".fd")
        kind, _, _, code, text = fdc.decode(c.recv(fdc.MAX_MESSAGE))
        if kind == fdc.ERROR:
            refused = (code, text.decode())
        conns.append(c)
    out["unbound_channels"] = refused
    for c in conns:
        c.close()
    return out


def main():
    attack = sys.argv[1]
    args = json.loads(sys.argv[2])
    result = globals()["attack_" + attack](args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
