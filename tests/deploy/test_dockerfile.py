"""deploy/docker/Dockerfile, checked without a Docker daemon: stages and their references, that
the copied binaries are CMake targets at those paths, that the runtime stage's packages exist in
Debian 12 and provide every shared library the built binaries need, and the image contract the
Kubernetes manifests rely on (entrypoint, user, exposed metrics port, example paths)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from typing import Dict, List, Tuple

import pytest

import deploy_model as dm

DOCKERFILE = os.path.join(dm.REPO, "deploy", "docker", "Dockerfile")
BINARIES = {"railyardd": "daemon", "railctl": "tools", "railyard-perf": "tools"}


def instructions() -> List[Tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, pending = [], ""
    with open(DOCKERFILE) as f:
        for line in f:
            stripped = line.strip()
            if stripped.startswith("#") and not pending:
                continue
            if stripped.startswith("#"):
                continue  # comment lines inside a continuation are skipped by Docker too
            if stripped.endswith("\\"):
                pending += stripped[:-1] + " "
                continue
            full = (pending + stripped).strip()
            pending = ""
            if full:
                word, _, rest = full.partition(" ")
                out.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continuation"
    return out


def stages() -> List[Dict]:
    args = {}
    result: List[Dict] = []
    for word, rest in instructions():
        if word == "ARG" and not result:
            k, _, v = rest.partition("=")
            args[k] = v
        elif word == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert m, f"FROM {rest}"
            image = re.sub(r"\$\{(\w+)\}", lambda v: args[v.group(1)], m.group(1))
            result.append({"image": image, "name": m.group(2), "body": []})
        else:
            assert result, f"{word} before the first FROM"
            result[-1]["body"].append((word, rest))
    return result


def apt_packages(stage: Dict) -> List[str]:
    pkgs = []
    for word, rest in stage["body"]:
        if word == "RUN" and "apt-get install" in rest:
            cmd = rest.split("apt-get install", 1)[1].split("&&", 1)[0]
            pkgs += [w for w in shlex.split(cmd) if not w.startswith("-")]
    return pkgs


def test_stages_and_references():
    st = stages()
    names = [s["name"] for s in st]
    assert names == ["build", "runtime", "examples"], names
    for s in st:
        base = s["image"]
        assert base.startswith("debian:bookworm") or base in names, f"base image {base}"
    seen = set()
    for s in st:
        for word, rest in s["body"]:
            if word == "COPY":
                m = re.match(r"--from=(\S+)", rest)
                if m:
                    assert m.group(1) in seen, f"COPY --from={m.group(1)} before that stage"
        seen.add(s["name"])


def test_copied_binaries_are_cmake_targets_at_those_paths():
    runtime = stages()[1]
    copies = [rest for word, rest in runtime["body"] if word == "COPY"]
    sources = shlex.split(copies[0])[1:-1]  # drop --from=build and the destination
    assert sorted(os.path.basename(s) for s in sources) == sorted(BINARIES)
    for src in sources:
        name = os.path.basename(src)
        folder = BINARIES[name]
        assert src == f"/build/{folder}/{name}", f"{src}: the build puts {name} in {folder}/"
        cmake = os.path.join(dm.REPO, folder, "CMakeLists.txt")
        with open(cmake) as f:
            assert re.search(rf"add_executable\(\s*{re.escape(name)}\b", f.read()), \
                f"{name} is not an executable target of {folder}/CMakeLists.txt"
    # The build stage builds into /build.
    build_runs = " ".join(rest for word, rest in stages()[0]["body"] if word == "RUN")
    assert "RAILYARD_BUILD_DIR=/build scripts/build.sh" in build_runs


def test_build_stage_installs_the_build_packages_of_install_deps():
    with open(os.path.join(dm.REPO, "scripts", "install-deps.sh")) as f:
        block = re.search(r"^packages=\($(.*?)^\)$", f.read(), re.MULTILINE | re.DOTALL)
    assert block, "no packages=( ... ) list in scripts/install-deps.sh"
    deps = {w for line in block.group(1).splitlines() for w in line.split("#")[0].split()}
    build = set(apt_packages(stages()[0]))
    # Every development package of install-deps.sh but those of tests (libclang-rt-14-dev: the
    # fuzz targets' runtimes), benchmarks and the MPI peers: a library added there for the build
    # must reach the image build too.
    not_for_the_image = {"libgtest-dev", "libgmock-dev", "libbenchmark-dev", "libopenmpi-dev",
                         "libmpich-dev", "libclang-rt-14-dev"}
    needed = {p for p in deps if p.endswith("-dev")} - not_for_the_image
    needed |= {"build-essential", "cmake", "ninja-build", "pkg-config", "protobuf-compiler",
               "protobuf-compiler-grpc", "python3"}
    assert needed <= build, f"build stage lacks {sorted(needed - build)}"
    assert build - {"ca-certificates"} <= deps, \
        f"build stage installs what install-deps.sh does not: {sorted(build - deps)}"


def test_runtime_contract():
    runtime = stages()[1]
    body = dict((w, r) for w, r in runtime["body"] if w != "RUN" and w != "COPY")
    assert body["ENTRYPOINT"] == '["/usr/local/bin/railyardd"]'
    user = body["USER"].split(":")[0]
    assert user not in ("root", "0"), "the runtime image runs as a non-root user"
    assert "9464/tcp" in body["EXPOSE"].split()
    assert "RAILYARD_METRICS_LISTEN=0.0.0.0:9464" in body["ENV"]
    assert "railctl" in body["HEALTHCHECK"]
    # The DaemonSet runs the entrypoint's binary.
    assert dm.daemon_container(dm.kustomization_objects())["command"] == \
        ["/usr/local/bin/railyardd"]


def test_runtime_directories_for_the_sockets():
    """The image user can create both sockets: the client directory is the one volume, the Admin
    directory is the user's alone and no volume, so that nothing sharing the client volume
    reaches Admin; the daemon and the healthcheck use the same Admin socket in it."""
    runtime = stages()[1]
    user = dict((w, r) for w, r in runtime["body"] if w == "USER")["USER"].split(":")[0]
    runs = " ".join(rest for word, rest in runtime["body"] if word == "RUN")
    dirs = dict((path, (owner, mode)) for owner, mode, path in
                re.findall(r"install -d -o (\S+) -g \S+ -m (\d+) (\S+)", runs))
    assert dirs == {"/run/railyard": (user, "0750"), "/run/railyard-admin": (user, "0700")}, dirs
    volumes = [rest for word, rest in runtime["body"] if word == "VOLUME"]
    assert volumes == ['["/run/railyard"]'], volumes
    env = dict((w, r) for w, r in runtime["body"] if w == "ENV")["ENV"]
    admin = re.search(r"RAILYARD_ADMIN_SOCKET=(\S+)", env).group(1)
    assert os.path.dirname(admin) == "/run/railyard-admin", admin
    assert os.path.dirname(re.search(r"RAILYARD_SOCKET=(\S+)", env).group(1)) == "/run/railyard"
    # The healthcheck asks the Admin API on that socket, not on the client socket.
    health = dict((w, r) for w, r in runtime["body"] if w == "HEALTHCHECK")["HEALTHCHECK"]
    assert health.endswith(f'CMD ["/usr/local/bin/railctl", "status", "--admin_socket={admin}"]'), \
        health


def test_no_shared_memory_plumbing():
    """Nothing in the image build or its defaults shares /dev/shm or an IPC namespace."""
    for word, rest in instructions():
        assert "/dev/shm" not in rest and "--ipc" not in rest, f"{word} {rest}"


def test_examples_stage_matches_the_example_job():
    examples = stages()[2]
    copies = [shlex.split(rest) for word, rest in examples["body"] if word == "COPY"]
    dests = {c[-1]: c[-2] for c in copies}
    job = dm.example_job()["spec"]["template"]["spec"]["containers"][0]
    script = job["command"][-1]
    assert dests["/opt/railyard/examples/python"] == "examples/python"
    assert script.startswith("/opt/railyard/examples/python/")
    assert dests[dm.env_value(job, "PYTHONPATH")] == "/build/python"
    assert {"python3", "python3-grpcio", "python3-protobuf", "python3-numpy"} <= \
        set(apt_packages(examples))


def _apt_usable() -> bool:
    if shutil.which("apt-cache") is None or shutil.which("dpkg-query") is None:
        return False
    out = subprocess.run(["apt-cache", "policy", "libc6"], capture_output=True, text=True)
    return "Candidate: (none)" not in out.stdout and "Candidate:" in out.stdout


def _apt_candidates(pkgs: List[str]) -> Dict[str, str]:
    """package -> candidate version ("(none)" when apt knows no installable version)."""
    out = subprocess.run(["apt-cache", "policy", *pkgs], capture_output=True, text=True,
                         timeout=120).stdout
    return dict(re.findall(r"^(\S+):\n(?:  .*\n)*?  Candidate: (\S+)", out, re.MULTILINE))


def test_runtime_packages_exist_in_debian_12():
    if not _apt_usable():
        pytest.skip("no apt package lists on this machine")
    with open("/etc/os-release") as f:
        if "bookworm" not in f.read():
            pytest.skip("not Debian 12: its apt lists cannot answer for the image")
    pkgs = apt_packages(stages()[1]) + apt_packages(stages()[2])
    found = _apt_candidates(pkgs)
    missing = [p for p in pkgs if found.get(p, "(none)") == "(none)"]
    assert not missing, f"not Debian 12 packages: {missing}"


def test_runtime_packages_provide_every_library_of_the_binaries():
    """Each shared library the built binaries load (ldd), by the Debian package that owns it
    (dpkg), is installed by the runtime stage, directly or as a dependency."""
    daemon = os.environ.get("RAILYARDD")
    if not daemon or not _apt_usable() or shutil.which("ldd") is None:
        pytest.skip("needs the built binaries (RAILYARDD), ldd and apt lists")
    if os.environ.get("RAILYARD_SANITIZED"):
        pytest.skip("sanitizer build: its runtime libraries are not the image's")
    build = os.path.dirname(os.path.dirname(daemon))
    binaries = [daemon] + [os.path.join(build, "tools", b) for b in ("railctl", "railyard-perf")]
    libs = set()
    for b in binaries:
        if os.path.exists(b):
            ldd = subprocess.run(["ldd", b], capture_output=True, text=True, timeout=30).stdout
            libs.update(re.findall(r"=> (/\S+)", ldd))
    # Debian 12 merges /lib into /usr/lib; dpkg knows each file under one of the two names.
    candidates = {}
    for lib in libs:
        for path in {lib, os.path.realpath(lib)}:
            for alias in {path, re.sub(r"^/usr/lib/", "/lib/", path),
                          re.sub(r"^/lib/", "/usr/lib/", path)}:
                candidates[alias] = lib
    q = subprocess.run(["dpkg-query", "-S", *sorted(candidates)], capture_output=True,
                       text=True, timeout=60)
    owner = {}
    for pkg, path in re.findall(r"^([^:\s]+)(?::\S+)?: (\S+)$", q.stdout, re.MULTILINE):
        owner[candidates[path]] = pkg
    listed = apt_packages(stages()[1])
    out = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends",
                          "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces",
                          "--no-enhances", *listed], capture_output=True, text=True, timeout=120)
    closure = set(listed) | set(re.findall(r"^([a-z0-9][^\s:]*)$", out.stdout, re.MULTILINE))
    base = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}  # in debian:bookworm-slim
    # Libraries no Debian package owns (e.g. a CUDA toolkit's, when the build found nvcc) are
    # not checked: the image builds with RAILYARD_WITH_CUDA=OFF.
    missing = {}
    for lib, pkg in owner.items():
        if pkg not in closure and pkg not in base:
            missing.setdefault(pkg, set()).add(os.path.basename(lib))
    assert owner, "dpkg owns none of the binaries' libraries"
    assert not missing, f"runtime stage lacks packages for: {missing}"
