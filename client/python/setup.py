"""Builds the railyard package: pyproject.toml has the metadata; this adds the generation of the
gRPC stubs (railyard.v1) from the repository's proto/ at build time (they are never committed).

The proto directory is ../../proto (a checkout of the repository), or $RAILYARD_PROTO_DIR.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _gen_stubs():
    sys.path.insert(0, HERE)
    try:
        import gen_stubs
    finally:
        sys.path.pop(0)
    return gen_stubs


def _proto_dir():
    return os.path.abspath(os.environ.get("RAILYARD_PROTO_DIR",
                                          os.path.join(HERE, os.pardir, os.pardir, "proto")))


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        proto_dir = _proto_dir()
        if not os.path.isdir(os.path.join(proto_dir, "railyard", "v1")):
            raise SystemExit(f"railyard: proto sources not found at {proto_dir}; build from a "
                             "checkout of the repository or set RAILYARD_PROTO_DIR")
        _gen_stubs().generate(proto_dir, os.path.abspath(self.build_lib))


# The session rings' hot path in C++ (native/ringcore.cc). Optional: where it cannot be compiled
# (no C++ compiler or Python headers) the package runs its pure-Python rings.
_RINGCORE = Extension("railyard._ringcore", sources=[os.path.join("native", "ringcore.cc")],
                      include_dirs=[_proto_dir()], language="c++",
                      extra_compile_args=["-std=c++17", "-O2"], optional=True)

setup(version=_gen_stubs().project_version(_proto_dir()),
      cmdclass={"build_py": BuildPyWithStubs},
      ext_modules=[_RINGCORE])
