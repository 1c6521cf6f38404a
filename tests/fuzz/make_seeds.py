#!/usr/bin/python3
"""Writes the fuzz targets' seed corpora: tests/fuzz/corpus/<target>/<name>, a few small valid
and edge-case inputs per target (the committed corpus; scripts/fuzz.sh fuzzes a temporary copy
and never writes back). Protobuf inputs are serialized with modules protoc generates into a
temporary directory from proto/railyard/v1 (protobuf-compiler and python3-protobuf, both in
scripts/install-deps.sh). Deterministic: running it again rewrites the same files.

Usage: /usr/bin/python3 tests/fuzz/make_seeds.py  (from anywhere)
"""

import importlib
import json
import re
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
NONCE = "0123456789abcdef0123456789abcdef"
# daemon/comm/peer_input.h's kDataPlaneVersion: the seeds' nodes speak it, so that joins and
# layouts reach the checks past the version's (coord_old_version and member_old_coordinator
# do not).
DATA_PLANE_VERSION = int(re.search(r"kDataPlaneVersion = (\d+);", (
    ROOT / "daemon" / "comm" / "peer_input.h").read_text()).group(1))


def load_protos(tmp):
    proto_dir = ROOT / "proto"
    files = sorted(str(p.relative_to(proto_dir)) for p in (proto_dir / "railyard" / "v1").glob("*.proto"))
    subprocess.run(["protoc", f"--proto_path={proto_dir}", f"--python_out={tmp}", *files], check=True)
    sys.path.insert(0, str(tmp))
    names = ("common", "cost", "local", "peer")
    return {n: importlib.import_module(f"railyard.v1.{n}_pb2") for n in names}


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data.encode() if isinstance(data, str) else data)


def comm_id_seeds():
    t = "comm_id_fuzz"
    write(t, "tcp_coordinator", f"ry1-{NONCE}@10.0.0.1:7411")
    write(t, "local_coordinator", f"ry1-{NONCE}@local:node-a")
    write(t, "ipv6_coordinator", f"ry1-{NONCE}@[fe80::1]:7411")
    write(t, "longest_coordinator", f"ry1-{NONCE}@" + "h" * 255)
    write(t, "too_long_coordinator", f"ry1-{NONCE}@" + "h" * 256)
    write(t, "upper_hex", f"ry1-{NONCE.upper()}@host:1")
    write(t, "short_nonce", f"ry1-{NONCE[:31]}@host:1")
    write(t, "space_in_coordinator", f"ry1-{NONCE}@host 1")
    write(t, "at_in_coordinator", f"ry1-{NONCE}@a@b")
    write(t, "empty_coordinator", f"ry1-{NONCE}@")
    # gRPC target schemes a coordinator may not name, and the hosts it may.
    write(t, "unix_coordinator", f"ry1-{NONCE}@unix:/run/railyard.sock")
    write(t, "dns_coordinator", f"ry1-{NONCE}@dns:///coord.example:7411")
    write(t, "ipv4_scheme_coordinator", f"ry1-{NONCE}@ipv4:10.0.0.1:7411")
    write(t, "dns_name_coordinator", f"ry1-{NONCE}@node-7.cluster.example:65535")
    write(t, "port_zero_coordinator", f"ry1-{NONCE}@host:0")
    # The first 8 bytes are also CheckRankOf's (rank, nranks).
    write(t, "rank_limits", struct.pack("<ii", 65535, 65536) + f"ry1-{NONCE}@h".encode())
    write(t, "rank_negative", struct.pack("<ii", -1, 4))


def job_tokens_seeds():
    t = "job_tokens_fuzz"
    write(t, "two_jobs", "# job tokens\njob-a tokA\njob.b  tokB  # trailing comment\n")
    write(t, "tabs_crlf", "job-a\ttokA\r\njob-b \t tokB\r\n\r\n")
    write(t, "longest_job", "j" * 128 + " t\n")
    write(t, "too_long_job", "j" * 129 + " t\n")
    write(t, "duplicate", "a b\na c\n")
    write(t, "three_fields", "a b c\n")
    write(t, "bad_job_id", "a/b token\n")
    write(t, "only_comments", "#\n   # x\n\n")
    # Found by this target: the token was "\fl\x01..." (blanks other than ' ' did not separate).
    write(t, "regress_formfeed_separator", bytes.fromhex("6c6c200c6c010000a0cea8a0b024a00200"))


def topology_seeds():
    t = "topology_file_fuzz"
    for f in ("torus_8x16.json", "three_tier_16x8.json", "flat_128.json"):
        shutil.copy(ROOT / "examples" / "topologies" / f, CORPUS / t / f)
    write(t, "daemon_two_rails.json", json.dumps(
        {"node": "node-a", "rails": [{"name": "rail0", "device": "lo"}, {"device": "lo", "speed_gbps": 100}]}))
    write(t, "node_parts.json", json.dumps({
        "node": "n", "rails": [{"name": "r0", "device": "eth0", "numa_node": 0}],
        "gpus": [{"index": 0, "numa_node": 0}, {"index": 1, "pci_bus_id": "0000:18:00.0"}],
        "numa_nodes": [{"id": 0, "cpus": "0-3,8,10-11"}, {"id": 1, "cpus": ""}],
        "nics": [{"name": "eth0", "speed_gbps": 100, "state": "up", "rdma_device": "mlx5_0:1"}],
        "intra": {"alpha": "0.5us", "bandwidth": "450GB/s"}}))
    write(t, "torus_3d.json", json.dumps({"fabric": {
        "kind": "torus", "torus_dims": [4, 4, 4], "inter": {"alpha": "1us", "bandwidth": "400Gbit/s"},
        "cpu_overhead": "1us", "in_network_reduction": True}}))
    write(t, "two_tier_units.json", json.dumps({
        "intra": {"alpha": "500ns", "bandwidth": "50GiB/s"},
        "fabric": {"kind": "two-tier", "nodes": 2, "ranks_per_node": 4, "rails": 2,
                   "inter": {"alpha": "0.002ms", "bandwidth": "12.5 GB/s"}}}))
    write(t, "cpulist_overlapping.json", json.dumps({"numa_nodes": [{"id": 0, "cpus": "8-10,0-3,2-9,9"}]}))
    # Regressions, each refused now: 400 copies of the widest range made a 2 GiB vector (OOM);
    # an infinite rail speed became the inter bandwidth; an infinite oversubscription; a torus
    # whose dims overflowed int64 before the node limit was checked (UBSan).
    write(t, "regress_cpulist_repeated.json",
          json.dumps({"numa_nodes": [{"id": 0, "cpus": ",".join(["0-1048575"] * 400)}]}))
    write(t, "regress_infinite_rail.json",
          '{"rails":[{"speed_gbps":"Infinity"}],"fabric":{"kind":"flat","nodes":2}}')
    write(t, "regress_infinite_oversubscription.json",
          '{"fabric":{"kind":"three_tier","nodes":4,"nodes_per_rack":2,"oversubscription":"Infinity",'
          '"inter":{"bandwidth":"1GB/s"}}}')
    write(t, "regress_torus_overflow.json",
          '{"fabric":{"kind":"torus","torus_dims":[2147483647,2147483647,2147483647],'
          '"inter":{"bandwidth":"1GB/s"}}}')
    write(t, "bad_unknown_field.json", '{"rails": [], "nope": 1}')
    write(t, "unit_bandwidth", "100 Gbps")
    write(t, "unit_size", "1.5 MiB")
    write(t, "unit_huge", "1e300 TB/s")


def calibration_seeds(pb):
    t = "calibration_fuzz"
    fit = {"intra": {"alpha_s": 5e-06, "beta_bytes_per_s": 4e9},
           "inter": {"alpha_s": 6e-05, "beta_bytes_per_s": 1e9},
           "overhead_s": 5e-06, "op_overhead_s": 0.0003, "source": "fit", "op": "allreduce",
           "algorithm": "ring", "placement": "2x2", "topology": "loopback",
           "fitted_at": "2024-01-01T00:00:00Z", "nranks": 4, "nnodes": 2, "samples": 12,
           "rms_relative_error": 0.03}
    write(t, "fit.json", json.dumps(fit, indent=2))
    write(t, "minimal.json", json.dumps({k: fit[k] for k in ("intra", "inter")}))
    write(t, "zero_beta.json", json.dumps({**fit, "inter": {"alpha_s": 0, "beta_bytes_per_s": 0}}))
    write(t, "wrong_type.json", json.dumps({**fit, "nranks": "four"}))
    write(t, "not_object.json", "[1, 2]")
    # Found by this target: nnodes 1e305 converted to int (UBSan float-cast-overflow).
    write(t, "regress_int_field_overflow.json",
          '{"intra": {"alpha_s": 5e-06, "beta_bytes_per_s": 4000000000.0}, "inter": {"alpha_s": 0, '
          '"beta_bytes_per_s": 0}, "overheads": 0.0003, "sourceks": 4, "nnodes": 1e305, "sample:": 12, '
          '"rms_relative_error": 0.03}')
    write(t, "regress_infinite_fit_error.json", json.dumps(fit)[:-1] + ', "rms_relative_error": 1e999}')
    m = pb["cost"].CostModel(intra_alpha_s=5e-6, intra_beta_bytes_per_s=4e9, inter_alpha_s=6e-5,
                             inter_beta_bytes_per_s=1e9, overhead_s=5e-6, op_overhead_s=3e-4,
                             source="fit", op="allreduce", algorithm="ring", nranks=4, nnodes=2,
                             samples=12, rms_relative_error=0.03)
    write(t, "cost_model.bin", m.SerializeToString(deterministic=True))


def submit_seeds(pb):
    t = "request_decode_fuzz"
    local, common = pb["local"], pb["common"]

    def seed(name, nranks_byte, rank, **fields):
        req = local.SubmitRequest(session_id="s", comm_handle=1, request_id=7, **fields)
        write(t, name, bytes([nranks_byte, rank & 0xFF, rank >> 8]) + req.SerializeToString(deterministic=True))

    ref = local.BufferRef
    f32, i8 = common.DATA_TYPE_FLOAT32, common.DATA_TYPE_INT8
    seed("allreduce", 3, 1, op=common.COLLECTIVE_OP_ALL_REDUCE, dtype=f32, red_op=common.RED_OP_SUM,
         count=256, send=ref(buffer_id=1), recv=ref(buffer_id=2))
    seed("allreduce_inplace", 3, 0, op=common.COLLECTIVE_OP_ALL_REDUCE, dtype=f32,
         red_op=common.RED_OP_MAX, count=1024, send=ref(buffer_id=1), recv=ref(buffer_id=1))
    seed("reducescatter_inplace", 3, 2, op=common.COLLECTIVE_OP_REDUCE_SCATTER, dtype=f32,
         red_op=common.RED_OP_SUM, count=64, send=ref(buffer_id=4), recv=ref(buffer_id=4, offset=512))
    seed("allgather_inplace", 3, 1, op=common.COLLECTIVE_OP_ALL_GATHER, dtype=i8, count=25,
         send=ref(buffer_id=3, offset=25), recv=ref(buffer_id=3))
    seed("broadcast_nonroot", 7, 3, op=common.COLLECTIVE_OP_BROADCAST, dtype=common.DATA_TYPE_UINT64,
         count=16, root=2, recv=ref(buffer_id=2, offset=8))
    seed("reduce_root_algo", 7, 2, op=common.COLLECTIVE_OP_REDUCE, dtype=common.DATA_TYPE_BFLOAT16,
         red_op=common.RED_OP_AVG, count=100, root=2, send=ref(buffer_id=1), recv=ref(buffer_id=2),
         algo="ring", timeout_ms=1000)
    seed("alltoall", 3, 0, op=common.COLLECTIVE_OP_ALL_TO_ALL, dtype=common.DATA_TYPE_INT32, count=8,
         send=ref(buffer_id=1), recv=ref(buffer_id=2))
    seed("alltoallv_inplace", 2, 1, op=common.COLLECTIVE_OP_ALL_TO_ALL_V, dtype=common.DATA_TYPE_FLOAT16,
         send=ref(buffer_id=4), recv=ref(buffer_id=4), send_counts=[3, 0, 5], send_displs=[0, 3, 3],
         recv_counts=[3, 0, 5], recv_displs=[0, 3, 3])
    seed("alltoallv_overlap", 2, 0, op=common.COLLECTIVE_OP_ALL_TO_ALL_V, dtype=i8,
         send=ref(buffer_id=1), recv=ref(buffer_id=1), send_counts=[4, 4, 4], send_displs=[0, 2, 8],
         recv_counts=[4, 4, 4], recv_displs=[0, 2, 8])
    seed("send", 1, 0, op=common.COLLECTIVE_OP_SEND, dtype=f32, count=10, root=1, send=ref(buffer_id=3))
    seed("recv_self", 1, 1, op=common.COLLECTIVE_OP_RECV, dtype=f32, count=10, root=1, recv=ref(buffer_id=3))
    seed("barrier", 0, 0, op=common.COLLECTIVE_OP_BARRIER)
    seed("past_end", 3, 0, op=common.COLLECTIVE_OP_ALL_REDUCE, dtype=common.DATA_TYPE_FLOAT64,
         red_op=common.RED_OP_SUM, count=512, send=ref(buffer_id=1, offset=8), recv=ref(buffer_id=2))
    seed("overflow_count", 0xF5, 300, op=common.COLLECTIVE_OP_ALL_GATHER, dtype=common.DATA_TYPE_UINT64,
         count=(1 << 64) - 1, send=ref(buffer_id=4), recv=ref(buffer_id=4))
    seed("unknown_buffer", 3, 0, op=common.COLLECTIVE_OP_ALL_REDUCE, dtype=f32, red_op=common.RED_OP_SUM,
         count=1, send=ref(buffer_id=99), recv=ref(buffer_id=2))
    seed("unknown_algo", 3, 0, op=common.COLLECTIVE_OP_BARRIER, algo="x" * 100)
    sync = local.StreamSync
    seed("stream_sync", 3, 1, op=common.COLLECTIVE_OP_ALL_REDUCE, dtype=f32, red_op=common.RED_OP_SUM,
         count=256, send=ref(buffer_id=1), recv=ref(buffer_id=2),
         stream_sync=sync(words=ref(buffer_id=3, offset=92), value=5))
    seed("stream_sync_past_end", 1, 0, op=common.COLLECTIVE_OP_BARRIER,
         stream_sync=sync(words=ref(buffer_id=1, offset=4092), value=1))


def peer_seeds(pb):
    t = "peer_join_fuzz"
    peer = pb["peer"]

    def node(name, slot, rails=1, version=DATA_PLANE_VERSION):
        return peer.NodeInfo(node_name=name, peer_address=f"{name}:7411",
                             rail_addresses=["ab" * 8] * rails, tag_slot=slot,
                             data_plane_version=version)

    def member(name, layout):
        write(t, name, b"\x00" + layout.SerializeToString(deterministic=True))

    def coordinator(name, requests):
        out = b"\x01"
        for r in requests:
            data = r.SerializeToString(deterministic=True)
            out += struct.pack("<H", len(data)) + data
        write(t, name, out)

    member("member_two_nodes", peer.JoinCommResponse(
        nodes=[node("a", 1), node("b", 4097, 2)], node_of_rank=[0, 0, 1, 1], rails=1,
        cost_model=pb["cost"].CostModel(intra_alpha_s=5e-6, intra_beta_bytes_per_s=4e9)))
    member("member_one_node", peer.JoinCommResponse(nodes=[peer.NodeInfo(node_name="solo")],
                                                    node_of_rank=[0, 0, 0], rails=1))
    member("member_rank_past_nodes", peer.JoinCommResponse(nodes=[node("a", 1), node("b", 2)],
                                                           node_of_rank=[0, 5], rails=1))
    # Found by this target: two nodes and no ranks passed CheckLayoutFits.
    member("regress_member_no_ranks", peer.JoinCommResponse(nodes=[node("a", 1), node("b", 2)]))
    member("member_idle_node", peer.JoinCommResponse(nodes=[node("a", 1), node("b", 2)],
                                                     node_of_rank=[1, 1], rails=1))
    # Found by this target in CI: a peer certified as "a" joined as "A" (node names are exact
    # strings; auth::CertNamesNode). The fuzzer's own input, kept byte for byte.
    write(t, "regress_claim_other_case", bytes.fromhex(
        "01550002036a6f62122b7279310d303030303030303030303030303030303030303030303030303030303030"
        "303040613a3734313120022a1f0a01611206613a373431311a10616261626162616261626162616261622003"
        "55000a036a6f62122b7279312d30303030303030303030303030303030303030303030303030303030303030"
        "3140613a3734313120022a1f0a01611206613a373431311a1061626162616261626162616261626162200355"
        "000a036a6f62122b7279312d3030303030303030303030303030303030303030303030703030303030303032"
        "40613a3734313120022a1f0a01611206613a373431311a106162616261626162616261626162616220035500"
        "0a036a6f62122b7279312d303030303030303030303030303030303030303030303030303030303030303340"
        "613a3734313120022a1f0a01611206613a373431311a1061626162616261626162616261626162200355000a"
        "036a6f62122b7279312d30303030303030303030303030303030303030303030303030303030303030344061"
        "3a3734313120022a1f0a01411206613a373431311a1061626162616261626162616261626162200355000a03"
        "6a6f63122b72790186ced23030303c3030ffffffffffffffffffffffffff3aff3030303030303240613a3734"
        "181831313131201818626162610262622a1f0a01611206613a373431311a1061622061626103626162616261"
        "62616261622003"))

    # Layouts a member (the node named "me", its last rank) accepts, and one it refuses.
    member("member_me_two_nodes", peer.JoinCommResponse(
        nodes=[node("a", 1), node("me", 4, 2)], node_of_rank=[0, 1], rails=1, data_secret=7,
        integrity="crc32c"))
    member("member_me_no_secret", peer.JoinCommResponse(
        nodes=[node("a", 1), node("me", 4)], node_of_rank=[0, 1], rails=1))
    member("member_me_alone", peer.JoinCommResponse(nodes=[peer.NodeInfo(node_name="me")],
                                                    node_of_rank=[0, 0], rails=1))
    # A coordinator from before data-plane versions: its own node carries none.
    member("member_old_coordinator", peer.JoinCommResponse(
        nodes=[node("a", 1, version=0), node("me", 4)], node_of_rank=[0, 1], rails=1,
        data_secret=7))

    def join(rank, nranks, name, slot=3, comm=f"ry1-{NONCE}@a:7411", timeout_ms=0, job="job",
             integrity="", version=DATA_PLANE_VERSION):
        return peer.JoinCommRequest(job_id=job, comm_id=comm, rank=rank, nranks=nranks,
                                    node=node(name, slot, version=version), timeout_ms=timeout_ms,
                                    integrity=integrity)

    coordinator("coord_two_nodes", [join(0, 3, "a"), join(2, 3, "b", slot=9), join(1, 3, "a")])
    coordinator("coord_rank_twice", [join(0, 2, "a"), join(0, 2, "a")])
    coordinator("coord_old_version", [join(0, 2, "a", version=0), join(1, 2, "b", version=2)])
    coordinator("coord_nranks_disagree", [join(0, 2, "a"), join(1, 3, "b")])
    coordinator("coord_slot_disagree", [join(0, 2, "a", slot=1), join(1, 2, "a", slot=2)])
    coordinator("coord_timeout", [join(0, 4, "a", timeout_ms=10), join(1, 4, "b")])
    coordinator("coord_wide", [join(65535, 65536, "a", comm=f"ry1-{NONCE}@w:1")])
    # Requests alternate between an unverified peer and one certified as "a".
    coordinator("coord_two_jobs", [join(0, 2, "a"), join(1, 2, "a", job="other"),
                                   join(1, 2, "b")])
    coordinator("coord_integrity", [join(0, 2, "a", integrity="crc32c"),
                                    join(1, 2, "a", integrity="none")])
    coordinator("coord_pending_bound", [join(0, 2, "a", comm=f"ry1-{i:032x}@a:7411")
                                        for i in range(6)])
    bad_rail = join(0, 2, "a")
    bad_rail.node.rail_addresses.append("f" * 5000)
    coordinator("coord_bad_fields", [join(0, 2, "a", comm=f"ry1-{NONCE}@unix:/tmp/s"), bad_rail,
                                     join(0, 2, "a", integrity="sha1"),
                                     join(0, 2, "a", job="no spaces")])
    # Regression: each join of nranks 65536 made the coordinator hold ~7 MB (these 4 KB took 2 GB)
    # until its deadline.
    wide = []
    while sum(len(r.SerializeToString()) + 2 for r in wide) < 3990:
        wide.append(peer.JoinCommRequest(job_id="j", comm_id=f"c{len(wide)}", rank=0, nranks=65536))
    coordinator("regress_wide_joins", wide)


def fd_channel_seeds():
    t = "fd_channel_fuzz"
    # Packets: <length byte> <descriptor count byte> <bytes>. The header is RYFD v1, then
    # type, cookie, handle, code, payload length (proto/railyard/v1/fd_channel.h).
    def msg(kind, cookie=7, payload=b""):
        return struct.pack("<IHHQQII", 0x44465952, 1, kind, cookie, 0, 0, len(payload)) + payload

    def packet(data, nfds):
        return bytes([len(data), nfds]) + data
    write(t, "put_one_fd", packet(msg(2), 1))
    write(t, "put_then_put", packet(msg(2, 1), 1) + packet(msg(2, 2), 1))
    write(t, "put_without_fd", packet(msg(2), 0) + packet(msg(2, 3), 1))
    write(t, "put_three_fds", packet(msg(2), 3))
    write(t, "hello_from_client", packet(msg(1), 0))
    write(t, "bad_length", packet(msg(2)[:-4] + struct.pack("<I", 9), 1))
    write(t, "error_payload", packet(msg(4, 0, b"why"), 0))
    write(t, "garbage", packet(b"GET / HTTP/1.1\r\n\r\n", 2))
    # Found by the target: a 0-byte record reads as end of stream, and the descriptor it carried
    # leaked; and the empty record alone.
    write(t, "regress_empty_record_with_fd", packet(msg(2), 1) + bytes([0, 1]))
    write(t, "regress_empty_record", packet(msg(2), 1) + bytes([0, 0]))


def signed_token_seeds():
    t = "signed_token_fuzz"
    mac = "0" * 64
    write(t, "shape", "\x00ryt1.1800000000.job." + mac)
    write(t, "dotted_job", "\x01ryt1.1800000000.a.b.c." + mac)
    write(t, "no_expiry", "\x00ryt1..job." + mac)
    write(t, "huge_expiry", "\x00ryt1." + "9" * 40 + ".job." + mac)
    write(t, "key_file", "# keys\n" + "01" * 32 + "\n" + "7f" * 48 + "\n")
    write(t, "policy_file", "job uids=1000,1001\n* gids=5\n")
    # Found by the target (a false alarm of its own check, now narrowed to hex MACs): 64 bytes
    # after the last dot that are words of the refusal's own message.
    write(t, "message_words_as_mac",
          b"\x00ryt1.1800\xd00000#0.job.b token is malformed: the expiry is not a decimal number "
          b"of Unix")


def ring_entry_seeds():
    t = "ring_entry_fuzz"
    # proto/railyard/v1/ring.h: request_id, comm_handle, count, send buffer/offset, recv
    # buffer/offset, op, dtype, red_op, root, timeout_ms, flags, ext_slots, vec_len, algo[32],
    # reserved; AllToAllv vectors in the slots after it.
    def entry(op=1, flags=0, ext=0, vec_len=0, algo=b"", send=(1, 0), recv=(2, 0)):
        return struct.pack("<QQQQQQQIIIiIIII32sQ", 9, 3, 256, send[0], send[1], recv[0],
                           recv[1], op, 1, 1, 0, 0, flags, ext, vec_len, algo, 0)
    write(t, "allreduce", entry())
    write(t, "grouped_ring_algo", entry(flags=1, algo=b"ring"))
    vec = struct.pack("<16Q", *range(16))
    write(t, "alltoallv_4", entry(op=7, ext=1, vec_len=4) + vec + bytes(0))
    write(t, "alltoallv_short", entry(op=7, ext=2, vec_len=4) + vec)
    write(t, "vectors_on_allreduce", entry(ext=1, vec_len=4) + vec)
    write(t, "unknown_flag", entry(flags=10))
    sync = struct.pack("<QQI", 1, 8, 7).ljust(128, b"\0")
    write(t, "stream_sync", entry(flags=4, ext=1) + sync)
    write(t, "alltoallv_stream_sync", entry(op=7, flags=4, ext=2, vec_len=4) + vec + sync)
    write(t, "stream_sync_without_slot", entry(flags=4))
    write(t, "algo_unterminated", entry(algo=b"x" * 32))
    write(t, "offset_without_buffer", entry(send=(0, 64)))
    # Found by the target: AllToAllv with vec_len 0 (no extension slots) memcpy'd from a null
    # pointer (undefined behaviour, even for 0 bytes).
    write(t, "regress_alltoallv_no_vectors", entry(op=7, ext=0, vec_len=0))


def digest_summary_seeds():
    t = "digest_summary_fuzz"
    # daemon/comm/op_digest.cc: magic "RYDG", version 1, op, dtype, red_op, root at 8, count at
    # 16, seq at 24, algorithm at 32 (24 bytes), codec at 56, its parameter at 60.
    def digest(count=1024, op=0, algo=b"ring", codec=0, param=0):
        return struct.pack("<IBBBBiIQQ24sB3sI", 0x47445952, 1, op, 0, 0, 0, 0, count, 7, algo,
                           codec, b"", param)
    # daemon/comm/digest_summary.h: kind, 3 zero bytes, a, b, 4 zero bytes, then the digests.
    def head(kind, a, b):
        return struct.pack("<B3xII4x", kind, a, b)
    nodes = bytes([8])
    write(t, "agree", nodes + head(1, 0, 0xFFFFFFFF) + digest())
    write(t, "agree_carrying", nodes + head(1, 3, 0xFFFFFFFF) + digest() + bytes(range(40)))
    write(t, "disagree", nodes + head(2, 1, 6) + digest(1024) + digest(2048))
    write(t, "disagree_equal", nodes + head(2, 1, 6) + digest() + digest())
    write(t, "unreadable", nodes + head(3, 2, 5) + bytes(64) +
          b"a 10-byte operation digest, not 80".ljust(64, b"\0"))
    write(t, "missing", nodes + head(4, 2, 5) + bytes(64) + b"UNAVAILABLE: gone".ljust(64, b"\0"))
    write(t, "node_out_of_range", bytes([2]) + head(1, 3, 0xFFFFFFFF) + digest())
    write(t, "short", nodes + head(1, 0, 0xFFFFFFFF) + digest()[:20])
    # Found by the target: a topk ratio of NaN (codec 4, float bits 0x7fc00000) decoded, and a
    # digest carrying it differed from itself after a round trip.
    write(t, "regress_nan_topk_ratio", nodes + head(2, 1, 6) + digest() +
          digest(codec=4, param=0x7FC00000))


def main():
    if CORPUS.exists():
        shutil.rmtree(CORPUS)
    (CORPUS / "topology_file_fuzz").mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        pb = load_protos(pathlib.Path(tmp))
        comm_id_seeds()
        job_tokens_seeds()
        topology_seeds()
        calibration_seeds(pb)
        submit_seeds(pb)
        peer_seeds(pb)
        fd_channel_seeds()
        signed_token_seeds()
        ring_entry_seeds()
        digest_summary_seeds()
    total = sum(f.stat().st_size for f in CORPUS.rglob("*") if f.is_file())
    count = sum(1 for f in CORPUS.rglob("*") if f.is_file())
    print(f"make_seeds: {count} files, {total} bytes under {CORPUS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
