"""Builds the railyard package: pyproject.toml has the metadata; this adds the generation of the
gRPC stubs (railyard.v1) from the repository's proto/ at build time (they are never committed).

The proto directory is ../../proto (a checkout of the repository), or $RAILYARD_PROTO_DIR.
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        sys.path.insert(0, HERE)
        try:
            import gen_stubs
        finally:
            sys.path.pop(0)
        proto_dir = os.environ.get("RAILYARD_PROTO_DIR",
                                   os.path.join(HERE, os.pardir, os.pardir, "proto"))
        if not os.path.isdir(os.path.join(proto_dir, "railyard", "v1")):
            raise SystemExit(f"railyard: proto sources not found at {proto_dir}; build from a "
                             "checkout of the repository or set RAILYARD_PROTO_DIR")
        gen_stubs.generate(os.path.abspath(proto_dir), os.path.abspath(self.build_lib))


def _version():
    sys.path.insert(0, HERE)
    try:
        import gen_stubs
    finally:
        sys.path.pop(0)
    proto_dir = os.environ.get("RAILYARD_PROTO_DIR",
                               os.path.join(HERE, os.pardir, os.pardir, "proto"))
    return gen_stubs.project_version(os.path.abspath(proto_dir))


setup(version=_version(), cmdclass={"build_py": BuildPyWithStubs})
