"""What a hostile process that reaches the peer port runs, as its own process, for
peer_plane_test.py to judge. Two modes:

    python3 peer_attacker.py client '<json>'     (or '-': the JSON on stdin)
        dials a daemon's Peer service (TLS with the given CA / cert / key, or without a client
        certificate, or plaintext) and makes each attempt in order; prints one JSON list of
        [status code name, details] per attempt.
    python3 peer_attacker.py coordinator '<json>'
        serves a Peer service that answers every JoinComm with a forged layout; prints
        "port N" once it listens, then one JSON line per JoinComm it answered; exits after
        `serve_s` seconds.

Every wait is bounded.
"""

import json
import os
import re
import sys
import threading
from concurrent import futures

import grpc

from railyard.v1 import peer_pb2, peer_pb2_grpc


def read(path):
    with open(path, "rb") as f:
        return f.read()


def channel(args):
    options = [("grpc.ssl_target_name_override", args["target_name"])] \
        if args.get("target_name") else []
    if args.get("plaintext"):
        return grpc.insecure_channel(args["address"])
    creds = grpc.ssl_channel_credentials(
        root_certificates=read(args["ca"]),
        private_key=read(args["key"]) if args.get("key") else None,
        certificate_chain=read(args["cert"]) if args.get("cert") else None)
    return grpc.secure_channel(args["address"], creds, options=options)


# daemon/comm/peer_input.h's kDataPlaneVersion: what the attacker claims unless told otherwise.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                       "daemon", "comm", "peer_input.h")) as _header:
    DATA_PLANE_VERSION = int(re.search(r"kDataPlaneVersion = (\d+);", _header.read()).group(1))


def node_info(a):
    return peer_pb2.NodeInfo(node_name=a.get("node_name", "evil"),
                             peer_address=a.get("peer_address", "127.0.0.1:1"),
                             rail_addresses=a.get("rail_addresses", ["ucx:evil/rail0:00:00000000"]),
                             tag_slot=a.get("tag_slot", 16),
                             data_plane_version=a.get("data_plane_version", DATA_PLANE_VERSION))


def attempt(stub, a):
    try:
        if a["rpc"] == "join":
            stub.JoinComm(peer_pb2.JoinCommRequest(
                job_id=a["job"], comm_id=a["comm_id"], rank=a.get("rank", 0),
                nranks=a.get("nranks", 2), node=node_info(a), timeout_ms=a.get("timeout_ms", 2000)),
                timeout=a.get("timeout_s", 10))
        elif a["rpc"] == "abort":
            stub.AbortComm(peer_pb2.AbortCommRequest(
                job_id=a["job"], comm_id=a["comm_id"], code=10, message="forged abort",
                from_node=a["from_node"]), timeout=10)
        elif a["rpc"] == "heartbeat":
            stub.Heartbeat(peer_pb2.HeartbeatRequest(from_node=a["from_node"]), timeout=10)
        else:
            raise ValueError(a["rpc"])
        return ["OK", ""]
    except grpc.RpcError as e:
        return [e.code().name, e.details() or ""]


def run_client(args):
    with channel(args) as ch:
        stub = peer_pb2_grpc.PeerStub(ch)
        print(json.dumps([attempt(stub, a) for a in args["attempts"]]), flush=True)


def forged_layout(kind, req):
    """A layout built to break the member that asked (req is its JoinCommRequest)."""
    me = req.node
    evil = peer_pb2.NodeInfo(node_name="evil", peer_address="127.0.0.1:9",
                             rail_addresses=list(me.rail_addresses), tag_slot=16,
                             data_plane_version=DATA_PLANE_VERSION)
    out = peer_pb2.JoinCommResponse(rails=1, data_secret=0x5EC12E7)
    n = req.nranks
    if kind == "old_coordinator":
        # Well formed, from a coordinator of a railyardd before data-plane versions.
        evil.data_plane_version = 0
        out.nodes.extend([evil, me])
        ranks = [0] * n
        ranks[req.rank] = 1
        out.node_of_rank.extend(ranks)
    elif kind == "negative_index":
        out.nodes.extend([me, evil])
        out.node_of_rank.extend([-1] + [1] * (n - 1))
    elif kind == "index_past_nodes":
        out.nodes.extend([me, evil])
        out.node_of_rank.extend([0] + [7] * (n - 1))
    elif kind == "wrong_rank_count":
        out.nodes.extend([me, evil])
        out.node_of_rank.extend([0] + [1] * n)  # n + 1 ranks
    elif kind == "member_absent":
        other = peer_pb2.NodeInfo(node_name="other", peer_address="127.0.0.1:8",
                                  rail_addresses=list(me.rail_addresses), tag_slot=17)
        out.nodes.extend([evil, other])
        out.node_of_rank.extend([0] + [1] * (n - 1))
    elif kind == "member_elsewhere":
        # The member is listed, but its rank is placed on the attacker's node.
        out.nodes.extend([me, evil])
        ranks = [1] * n
        ranks[(req.rank + 1) % n] = 0
        out.node_of_rank.extend(ranks)
    elif kind == "huge_rail_address":
        big = peer_pb2.NodeInfo(node_name="evil", peer_address="127.0.0.1:9",
                                rail_addresses=["ucx:" + "a" * (1 << 20)], tag_slot=16)
        out.nodes.extend([me, big])
        out.node_of_rank.extend([0] + [1] * (n - 1))
    else:
        raise ValueError(kind)
    return out


class ForgingPeer(peer_pb2_grpc.PeerServicer):
    def __init__(self, kind):
        self.kind = kind

    def JoinComm(self, request, context):
        print(json.dumps({"join_from": request.node.node_name, "rank": request.rank}), flush=True)
        return forged_layout(self.kind, request)

    def Heartbeat(self, request, context):
        return peer_pb2.HeartbeatResponse(node_name="evil")

    def AbortComm(self, request, context):
        return peer_pb2.AbortCommResponse()


def run_coordinator(args):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    peer_pb2_grpc.add_PeerServicer_to_server(ForgingPeer(args["layout"]), server)
    creds = grpc.ssl_server_credentials([(read(args["key"]), read(args["cert"]))])
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    print(f"port {port}", flush=True)
    done = threading.Event()
    done.wait(args.get("serve_s", 30))
    server.stop(1).wait(5)


if __name__ == "__main__":
    mode = sys.argv[1]
    args = json.loads(sys.stdin.read() if sys.argv[2] == "-" else sys.argv[2])
    {"client": run_client, "coordinator": run_coordinator}[mode](args)
