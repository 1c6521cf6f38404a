#!/usr/bin/env python3
"""Generates railyard's Python gRPC stubs from proto/ (never committed).

    gen_stubs.py --proto-dir PROTO --out DIR [--copy-package SRC] [--protoc P] [--plugin P]

Runs ``protoc -I PROTO --python_out=DIR --grpc_python_out=DIR`` with ``grpc_python_plugin``, so
``railyard/v1/local.proto`` becomes ``DIR/railyard/v1/local_pb2.py`` (+ ``_pb2_grpc.py``): the
stubs are the ``railyard.v1`` subpackage of the client package and their own imports
(``from railyard.v1 import common_pb2``) resolve as package imports. With ``--copy-package``,
first copies the pure-Python package SRC (client/python/railyard) to DIR/railyard, which gives
an importable copy (the build tree's, used by the tests). Falls back to ``grpc_tools.protoc``
(pip's grpcio-tools) when protoc or the plugin is not installed.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys


def find_tool(name: str, explicit: str | None) -> str | None:
    if explicit:
        return explicit
    return shutil.which(name)


def generate(proto_dir: str, out: str, protoc: str | None = None,
             plugin: str | None = None) -> list[str]:
    protos = sorted(glob.glob(os.path.join(proto_dir, "railyard", "v1", "*.proto")))
    if not protos:
        raise SystemExit(f"gen_stubs: no .proto files under {proto_dir}/railyard/v1")
    rel = [os.path.relpath(p, proto_dir) for p in protos]
    os.makedirs(os.path.join(out, "railyard", "v1"), exist_ok=True)
    protoc = find_tool("protoc", protoc)
    plugin = find_tool("grpc_python_plugin", plugin)
    args = [f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}"] + rel
    if protoc and plugin:
        subprocess.run([protoc, f"--plugin=protoc-gen-grpc_python={plugin}"] + args,
                       check=True, cwd=proto_dir)
    else:
        try:
            from grpc_tools import protoc as grpc_protoc  # type: ignore
        except ImportError:
            raise SystemExit("gen_stubs: need protoc and grpc_python_plugin (Debian: "
                             "protobuf-compiler, protobuf-compiler-grpc) or grpcio-tools")
        import importlib.resources
        include = str(importlib.resources.files("grpc_tools") / "_proto")
        if grpc_protoc.main(["protoc", f"-I{include}"] + args) != 0:
            raise SystemExit("gen_stubs: grpc_tools.protoc failed")
    init = os.path.join(out, "railyard", "v1", "__init__.py")
    with open(init, "w") as f:
        f.write('"""Generated from proto/railyard/v1 by gen_stubs.py; do not edit."""\n')
    return sorted(glob.glob(os.path.join(out, "railyard", "v1", "*.py")))


def copy_package(src: str, out: str) -> None:
    dst = os.path.join(out, "railyard")
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", "v1")]
        target = os.path.join(dst, os.path.relpath(root, src))
        os.makedirs(target, exist_ok=True)
        for name in files:
            if name.endswith((".py", ".typed")):
                shutil.copy2(os.path.join(root, name), os.path.join(target, name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--copy-package", metavar="SRC")
    parser.add_argument("--protoc")
    parser.add_argument("--plugin")
    parser.add_argument("--stamp", help="file to touch when done (for build systems)")
    args = parser.parse_args(argv)
    if args.copy_package:
        copy_package(args.copy_package, args.out)
    generate(os.path.abspath(args.proto_dir), os.path.abspath(args.out), args.protoc,
             args.plugin)
    if args.stamp:
        with open(args.stamp, "w"):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
