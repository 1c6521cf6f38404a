"""Each wire fact written once (issue 54): the Python client takes the byte layouts it shares with
the daemon (proto/railyard/v1/ring.h, fd_channel.h, spin_yield.h) from railyard._layouts, which
client/python/gen_stubs.py generates from those headers, its enum numbers from the generated
railyard.v1.common_pb2 and its version from CMakeLists.txt. Checked here against the headers read
independently (a parser of this test's own, and the C++ compiler where there is one), and the
generation must stop, naming it, when a constant it needs is gone."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import railyard
from railyard import _fd_channel, _layouts, _ring, wire
from railyard.v1 import common_pb2

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
PROTO = os.path.join(REPO, "proto")


def _gen_stubs():
    spec = importlib.util.spec_from_file_location(
        "gen_stubs_under_test", os.path.join(REPO, "client", "python", "gen_stubs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_stubs = _gen_stubs()


def _header_values(header: str) -> dict:
    """This test's own reading of a header: ``kName = expr;`` of constexpr lines and the members
    of ``enum class E { kM = n, ... }`` (as ``E::kM``), evaluated in order as Python."""
    with open(os.path.join(PROTO, "railyard", "v1", header)) as f:
        text = re.sub(r"//.*", "", f.read())
    values: dict = {}
    for name, expr in re.findall(r"constexpr[^=;(]*\b(k[A-Za-z0-9]+)\s*=\s*([^;]+);", text):
        expr = expr.replace("'", "")
        expr = re.sub(r"\b(0x[0-9A-Fa-f]+|\d+)[uUlL]*\b", r"\1", expr)
        values[name] = eval(expr, {"__builtins__": {}}, dict(values))  # noqa: S307 - our header
    for enum, body in re.findall(r"enum class (\w+)[^{]*\{([^}]*)\}", text):
        for name, number in re.findall(r"(k\w+)\s*=\s*(\d+)", body):
            values[f"{enum}::{name}"] = int(number)
    return values


def _snake(cxx: str) -> str:
    """``kOffSqTail`` -> ``OFF_SQ_TAIL``, ``Type::kPutOk`` -> ``TYPE_PUT_OK``."""
    words = []
    for part in cxx.split("::"):
        if re.match(r"k[A-Z]", part):
            part = part[1:]
        words += re.findall(r"[A-Z][a-z0-9]*", part)
    return "_".join(w.upper() for w in words)


def _expected() -> dict:
    """Generated name -> (header, C++ name, value as read here), for every constant gen_stubs.py
    is asked to generate."""
    out = {}
    for header, prefix, names in gen_stubs.WIRE_HEADERS:
        values = _header_values(header)
        for cxx in names:
            assert cxx in values, f"{header} has no {cxx} (as this test reads it)"
            out[prefix + _snake(cxx)] = (header, cxx, values[cxx])
    return out


def test_generated_layouts_equal_the_headers():
    expected = _expected()
    assert expected, "WIRE_HEADERS asks for nothing"
    for name, (header, cxx, value) in expected.items():
        assert getattr(_layouts, name, None) == value, (name, header, cxx, value)
    generated = {n for n in vars(_layouts) if n.isupper()}
    assert generated == set(expected), generated ^ set(expected)


def test_generated_layouts_equal_what_the_compiler_says(tmp_path):
    """The same, with the headers compiled: a constant whose C++ value this test's parser and
    gen_stubs.py's would both misread still differs here. Also fd_channel.h's Encode against
    the Python encoder (the header's field offsets are code, not constants)."""
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    expected = _expected()
    ns = {"ring.h": "railyard::ringproto::", "fd_channel.h": "railyard::fdproto::",
          "spin_yield.h": "railyard::ringproto::YieldPacer::"}
    prints = []
    for name, (header, cxx_name, _) in expected.items():
        qualified = ns[header] + cxx_name
        prints.append(f'  std::printf("{name} %llu\\n", static_cast<unsigned long long>'
                      f"({qualified}));")
    source = tmp_path / "facts.cc"
    source.write_text("\n".join([
        "#include <cstdio>",
        '#include "railyard/v1/ring.h"',
        '#include "railyard/v1/fd_channel.h"',
        '#include "railyard/v1/spin_yield.h"',
        "int main() {",
        *prints,
        "  railyard::fdproto::Message m;",
        "  m.type = railyard::fdproto::Type::kPutOk;",
        "  m.cookie = 0x0102030405060708ull; m.handle = 0x1112131415161718ull; m.code = 7;",
        '  m.payload = "ticket";',
        "  std::string bytes = railyard::fdproto::Encode(m);",
        '  std::printf("ENCODED ");',
        '  for (unsigned char c : bytes) std::printf("%02x", c);',
        '  std::printf("\\n");',
        "}",
    ]) + "\n")
    binary = tmp_path / "facts"
    subprocess.run([cxx, "-std=c++17", "-I", PROTO, str(source), "-o", str(binary)], check=True,
                   timeout=120)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True,
                         timeout=30).stdout
    got = dict(line.split(" ", 1) for line in out.splitlines())
    for name in expected:
        assert int(got[name]) == getattr(_layouts, name), name
    python = _fd_channel.encode(_fd_channel.PUT_OK, cookie=0x0102030405060708,
                                handle=0x1112131415161718, code=7, payload=b"ticket")
    assert python.hex() == got["ENCODED"].strip()
    assert _fd_channel.decode(bytes.fromhex(got["ENCODED"].strip())) == (
        _fd_channel.PUT_OK, 0x0102030405060708, 0x1112131415161718, 7, b"ticket")


def test_the_client_modules_take_the_generated_values():
    h = _layouts
    assert (_ring.MAGIC, _ring.VERSION, _ring.HEADER_BYTES, _ring.SQ_ENTRY, _ring.CQ_ENTRY) == (
        h.RING_MAGIC, h.RING_VERSION, h.RING_HEADER_BYTES, h.RING_SQ_ENTRY_BYTES,
        h.RING_CQ_ENTRY_BYTES)
    assert (_ring.CQ_MESSAGE_OFFSET, _ring.CQ_MESSAGE_BYTES, _ring.ALGO_BYTES,
            _ring.COMPRESSION_BYTES) == (h.RING_CQ_MESSAGE_OFFSET, h.RING_CQ_MESSAGE_BYTES,
                                         h.RING_ALGO_BYTES, h.RING_COMPRESSION_BYTES)
    assert (_ring.FLAG_GROUP_NEXT, _ring.FLAG_ERROR_FEEDBACK, _ring.FLAG_STREAM_SYNC) == (
        h.RING_FLAG_GROUP_NEXT, h.RING_FLAG_ERROR_FEEDBACK, h.RING_FLAG_STREAM_SYNC)
    for off in ("SQ_TAIL", "SQ_HEAD", "SQ_DOORBELL", "DAEMON_SLEEPING", "CQ_TAIL", "CQ_HEAD",
                "CQ_DOORBELL", "CLIENT_WAITERS"):
        assert getattr(_ring, "OFF_" + off) == getattr(h, "RING_OFF_" + off), off
    # The entry structs lay their fields where the header says.
    assert _ring.field_offsets(_ring.ENTRY.format) == [
        h.RING_SQ_REQUEST_ID, h.RING_SQ_COMM_HANDLE, h.RING_SQ_COUNT, h.RING_SQ_SEND_BUFFER,
        h.RING_SQ_SEND_OFFSET, h.RING_SQ_RECV_BUFFER, h.RING_SQ_RECV_OFFSET, h.RING_SQ_OP,
        h.RING_SQ_DTYPE, h.RING_SQ_RED_OP, h.RING_SQ_ROOT, h.RING_SQ_TIMEOUT_MS,
        h.RING_SQ_FLAGS, h.RING_SQ_EXT_SLOTS, h.RING_SQ_VEC_LEN, h.RING_SQ_ALGO,
        h.RING_SQ_COMPRESSION, h.RING_SQ_COMPRESSION_KEY]
    assert _ring.ENTRY.size == h.RING_SQ_ENTRY_BYTES
    assert _ring.ring_bytes(8, 16) == (h.RING_HEADER_BYTES + 8 * h.RING_SQ_ENTRY_BYTES +
                                       16 * h.RING_CQ_ENTRY_BYTES)
    # The yield pacer's bounds, in seconds.
    assert _ring._YIELD_LONG_S == h.YIELD_LONG_NS / 1e9
    assert _ring._YIELD_WINDOW_S == h.YIELD_WINDOW_NS / 1e9
    assert _ring._YIELD_QUIET_S == h.YIELD_QUIET_NS / 1e9
    # The fd side channel.
    assert (_fd_channel.MAGIC, _fd_channel.VERSION, _fd_channel.MAX_MESSAGE,
            _fd_channel.TICKET_CHARS, _fd_channel.HEADER.size) == (
        h.FD_MAGIC, h.FD_VERSION, h.FD_MAX_MESSAGE, h.FD_TICKET_CHARS, h.FD_HEADER_BYTES)
    assert (_fd_channel.HELLO, _fd_channel.PUT, _fd_channel.PUT_OK, _fd_channel.ERROR) == (
        h.FD_TYPE_HELLO, h.FD_TYPE_PUT, h.FD_TYPE_PUT_OK, h.FD_TYPE_ERROR)


def test_enum_numbers_are_the_protos():
    for op in railyard.ReduceOp:
        assert int(op) == common_pb2.RedOp.Value("RED_OP_" + op.name), op
    assert {o.name for o in railyard.ReduceOp} == {
        n[len("RED_OP_"):] for n in common_pb2.RedOp.keys() if n != "RED_OP_UNSPECIFIED"}
    for dt in railyard.SUPPORTED_DTYPES:
        assert wire.dtype_number(dt) == common_pb2.DataType.Value("DATA_TYPE_" + dt.name.upper())
    assert railyard.DTYPE_BFLOAT16 == common_pb2.DATA_TYPE_BFLOAT16
    assert wire.dtype_number(np.dtype(np.uint16), "bfloat16") == common_pb2.DATA_TYPE_BFLOAT16
    assert _ring.ALL_TO_ALL_V == common_pb2.COLLECTIVE_OP_ALL_TO_ALL_V


def test_version_is_cmakes():
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        want = re.search(r"project\(railyard VERSION (\S+)", f.read()).group(1)
    assert railyard.__version__ == want
    assert gen_stubs.project_version(PROTO) == want


def _proto_copy(tmp_path, header: str, edit) -> str:
    proto = tmp_path / "proto"
    shutil.copytree(PROTO, proto)
    path = proto / "railyard" / "v1" / header
    path.write_text(edit(path.read_text()))
    return str(proto)


def test_generation_fails_when_a_needed_constant_is_gone(tmp_path):
    proto = _proto_copy(tmp_path, "ring.h", lambda t: re.sub(r"kOffSqTail\b", "kOffSqTailMoved", t))
    with pytest.raises(SystemExit, match=r"ring\.h: kOffSqTail\b"):
        gen_stubs.layouts_module(proto)


def test_generation_fails_when_an_enum_member_is_gone(tmp_path):
    proto = _proto_copy(tmp_path, "fd_channel.h", lambda t: t.replace("kPutOk = 3,", ""))
    with pytest.raises(SystemExit, match=r"fd_channel\.h: Type::kPutOk"):
        gen_stubs.layouts_module(proto)


def test_generation_fails_when_a_header_is_gone(tmp_path):
    proto = tmp_path / "proto"
    shutil.copytree(PROTO, proto)
    os.remove(proto / "railyard" / "v1" / "spin_yield.h")
    with pytest.raises(SystemExit, match=r"spin_yield\.h not found"):
        gen_stubs.layouts_module(str(proto))


def test_a_changed_header_changes_the_generated_module(tmp_path):
    proto = _proto_copy(tmp_path, "spin_yield.h",
                        lambda t: t.replace("kLongNs = 2'000'000;", "kLongNs = 3'000'000;"))
    text = gen_stubs.layouts_module(proto)
    assert "\nYIELD_LONG_NS = 3000000  # kLongNs\n" in text
    namespace: dict = {}
    exec(compile(text, "_layouts.py", "exec"), namespace)  # noqa: S102 - generated here
    assert namespace["YIELD_LONG_NS"] == 3_000_000


def test_the_package_is_importable_without_private_cross_package_imports():
    """The torch backend imports no underscore name of the client package (issue 54)."""
    root = os.path.join(REPO, "client", "python", "railyard", "torch")
    bad = []
    for name in sorted(os.listdir(root)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(root, name)) as f:
            for n, line in enumerate(f, 1):
                m = re.match(r"\s*from (railyard(?:\.\w+)*) import (.+)", line)
                if m and (re.search(r"(^|\.)_", m.group(1)) or
                          re.search(r"(^|[\s,(])_\w+", m.group(2).split(" as ")[0])):
                    bad.append(f"{name}:{n}: {line.strip()}")
                if re.match(r"\s*import railyard\.(\w+\.)*_", line):
                    bad.append(f"{name}:{n}: {line.strip()}")
    assert not bad, bad


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
