"""What a process on the node runs to deny railyardd's service to others, as its own process:
`python3 dos_attacker.py <attack> <json args>` mounts the attack, prints one JSON line with what
it got so far ("holding"), keeps the attack up until a line arrives on stdin (or 120 s pass),
releases it and prints a last JSON line. denial_of_service_test.py runs victims and newcomers
while it holds. Every wait is bounded.
"""

import fcntl
import json
import os
import resource
import select
import socket
import sys
import time

import grpc

from railyard import _fd_channel as fdc
from railyard.v1 import local_pb2, local_pb2_grpc

HOLD_LIMIT_S = 120


def hold(result):
    print(json.dumps({"holding": True, **result}), flush=True)
    select.select([sys.stdin], [], [], HOLD_LIMIT_S)


def grpc_error(call):
    try:
        call()
        return ["OK"]
    except grpc.RpcError as e:
        return [e.code().name, e.details()]


def attack_connection_flood(a):
    """Plain connections to the client socket, no token, as many as a["count"], all kept open;
    then one gRPC call on a fresh connection (what a refused caller hears)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    conns, failures = [], 0
    for _ in range(a["count"]):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(a["socket"])
            conns.append(s)
        except OSError:
            failures += 1
            s.close()
    time.sleep(1)  # the daemon accepts (or refuses) the backlog
    # The peers still connected after the daemon's verdicts: admitted, or refused and not yet
    # dropped by the refusal server.
    with grpc.insecure_channel("unix:" + a["socket"]) as ch:
        refused = grpc_error(lambda: local_pb2_grpc.LocalStub(ch).CreateCommId(
            local_pb2.CreateCommIdRequest(session_id="x"), timeout=5))
    hold({"connected": len(conns), "connect_failures": failures, "fresh_call": refused})
    for s in conns:
        s.close()
    return {"closed": len(conns)}


def attack_side_channel_flood(a):
    """Side-channel connections that never Connect, kept open."""
    conns, refused, hellos = [], None, 0
    for _ in range(a["count"]):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        c.settimeout(10)
        c.connect(a["socket"] + ".fd")
        kind, _, _, code, text = fdc.decode(c.recv(fdc.MAX_MESSAGE))
        if kind == fdc.ERROR:
            refused = refused or [code, text.decode()]
        else:
            hellos += 1
        conns.append(c)
    hold({"hellos": hellos, "refused": refused})
    for c in conns:
        c.close()
    return {}


def attack_bootstrap_flood(a):
    """InitComm calls of 2-rank communicators whose other rank never comes, a["count"] of them,
    from one session of the attacker's job, each waiting up to 120 s."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tenant_attacker import Raw
    s = Raw(a["socket"], a["job"], a["token"])
    assert s.session, s.error
    futures = []
    for _ in range(a["count"]):
        comm_id = s.stub.CreateCommId(local_pb2.CreateCommIdRequest(session_id=s.session),
                                      timeout=10).comm_id
        futures.append(s.stub.InitComm.future(local_pb2.InitCommRequest(
            session_id=s.session, comm_id=comm_id, rank=0, nranks=2, timeout_ms=120000),
            timeout=130))
    time.sleep(1)
    codes = {}
    refusal = None
    for f in futures:
        if f.done():
            e = f.exception()
            name = e.code().name if e is not None else "OK"
            codes[name] = codes.get(name, 0) + 1
            if e is not None and refusal is None:
                refusal = [name, e.details()]
        else:
            codes["waiting"] = codes.get("waiting", 0) + 1
    hold({"codes": codes, "refusal": refusal})
    for f in futures:
        f.cancel()
    s.close()
    return {}


def attack_hole_punch(a):
    """Registers a["buffers"] sealed, allocated memfds of a["size"] bytes, punches holes in all
    of them, closes its descriptors and runs AllReduces into them: the daemon's writes would
    fault the pages back in, charged to the daemon."""
    import ctypes
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tenant_attacker import Raw, memfd
    from railyard.v1 import common_pb2
    size = a["size"]
    s = Raw(a["socket"], a["job"], a["token"])
    assert s.session, s.error
    libc = ctypes.CDLL(None, use_errno=True)
    falloc_punch = 2 | 1  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
    buffers, punched = [], []
    for _ in range(a["buffers"]):
        fd = memfd(size)
        reply = s.put([fd])
        registered = s.register(reply[1], size)
        assert registered[0] == "OK", registered
        buffers.append(registered[1])
        punched.append(libc.fallocate(fd, falloc_punch, ctypes.c_long(0), ctypes.c_long(size)))
        assert os.fstat(fd).st_blocks == 0
        os.close(fd)
    comm_id = s.stub.CreateCommId(local_pb2.CreateCommIdRequest(session_id=s.session),
                                  timeout=10).comm_id
    handle = s.stub.InitComm(local_pb2.InitCommRequest(
        session_id=s.session, comm_id=comm_id, rank=0, nranks=1), timeout=10).comm_handle
    submits = []
    for i, buffer_id in enumerate(buffers):
        ref = local_pb2.BufferRef(buffer_id=buffer_id, offset=0)
        req = local_pb2.SubmitRequest(
            session_id=s.session, comm_handle=handle, request_id=i + 1,
            op=common_pb2.COLLECTIVE_OP_ALL_REDUCE, dtype=common_pb2.DATA_TYPE_FLOAT32,
            red_op=common_pb2.RED_OP_SUM,
            count=size // 4, send=ref, recv=ref)
        submits.append(grpc_error(lambda: s.stub.Submit(req, timeout=30)))
    time.sleep(1)  # anything accepted has run by now
    hold({"punched": punched, "submits": submits})
    s.close()
    return {}


def attack_mapping_flood(a):
    """Registers a["count"] buffers of 4 KiB, one memfd each: one daemon mapping each."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tenant_attacker import Raw, memfd
    sessions, codes, refusal = [], {}, None
    s = Raw(a["socket"], a["job"], a["token"])
    assert s.session, s.error
    for _ in range(a["count"]):
        fd = memfd(4096)
        reply = s.put([fd])
        os.close(fd)
        r = s.register(reply[1], 4096)
        codes[r[0]] = codes.get(r[0], 0) + 1
        if r[0] != "OK" and refusal is None:
            refusal = list(r)
    hold({"codes": codes, "refusal": refusal})
    s.close()
    return {}


def main():
    attack = sys.argv[1]
    args = json.loads(sys.argv[2])
    result = globals()["attack_" + attack](args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
