"""Loads the deployment files and answers questions about them for the tests in this folder.

Sources of truth the manifests are checked against:
  - the flags railyardd accepts: `$RAILYARDD --helpfull` of the built daemon (CTest passes its
    path), else the ABSL_FLAG definitions under daemon/;
  - the flags the environment may set (RAILYARD_<FLAG>): DaemonFlagNames() in daemon/flags.cc;
  - the topology file schema: proto/railyard/v1/topology.proto, compiled with protoc.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import tempfile
from typing import Any, Dict, Iterable, List, Optional, Tuple

import yaml

REPO = os.environ.get("RAILYARD_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
KUBE_DIR = os.path.join(REPO, "deploy", "kubernetes")
CHART_DIR = os.path.join(REPO, "deploy", "helm", "railyard")


def load_yaml_docs(path: str) -> List[Dict[str, Any]]:
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    for d in docs:
        assert isinstance(d, dict), f"{path}: a document is a {type(d).__name__}, not an object"
    return docs


def kustomization_objects() -> List[Dict[str, Any]]:
    """The objects deploy/kubernetes/kustomization.yaml lists, with its image override applied."""
    kust = load_yaml_docs(os.path.join(KUBE_DIR, "kustomization.yaml"))[0]
    objects: List[Dict[str, Any]] = []
    for res in kust["resources"]:
        objects.extend(load_yaml_docs(os.path.join(KUBE_DIR, res)))
    for image in kust.get("images", []):
        for obj in objects:
            for c in containers(obj):
                repo, _, _ = c["image"].rpartition(":")
                if repo == image["name"]:
                    c["image"] = f"{image.get('newName', repo)}:{image['newTag']}"
    return objects


EXAMPLE_JOB = os.path.join(KUBE_DIR, "examples", "allreduce-job.yaml")


def example_objects() -> List[Dict[str, Any]]:
    """The documents of examples/allreduce-job.yaml: the job's token Secret and the Job."""
    return load_yaml_docs(EXAMPLE_JOB)


def example_job() -> Dict[str, Any]:
    return only(example_objects(), "Job")


# ---- object helpers -------------------------------------------------------------------------

def pod_spec(obj: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    if obj.get("kind") in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
        return obj["spec"]["template"]["spec"]
    if obj.get("kind") == "Pod":
        return obj["spec"]
    return None


def containers(obj: Dict[str, Any]) -> List[Dict[str, Any]]:
    spec = pod_spec(obj)
    if spec is None:
        return []
    return list(spec.get("initContainers", [])) + list(spec.get("containers", []))


def only(objects: Iterable[Dict[str, Any]], kind: str) -> Dict[str, Any]:
    found = [o for o in objects if o.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def find(objects: Iterable[Dict[str, Any]], kind: str, name: str) -> Dict[str, Any]:
    for o in objects:
        if o.get("kind") == kind and o["metadata"]["name"] == name:
            return o
    raise AssertionError(f"no {kind} named {name!r} among the objects")


def daemon_container(objects: Iterable[Dict[str, Any]]) -> Dict[str, Any]:
    ds = only(objects, "DaemonSet")
    found = [c for c in ds["spec"]["template"]["spec"]["containers"]
             if c.get("command", [""])[0].endswith("/railyardd")]
    assert len(found) == 1, "the DaemonSet needs exactly one container running railyardd"
    return found[0]


def parse_args(args: List[str]) -> Dict[str, str]:
    """--name=value arguments to {name: value}; other shapes are rejected (unambiguous)."""
    flags: Dict[str, str] = {}
    for a in args:
        m = re.fullmatch(r"--([a-z_][a-z0-9_]*)=(.*)", a, re.DOTALL)
        assert m, f"argument {a!r} is not of the form --flag=value"
        assert m.group(1) not in flags, f"--{m.group(1)} given twice"
        flags[m.group(1)] = m.group(2)
    return flags


def host_port(value: str) -> Tuple[str, int]:
    host, sep, port = value.rpartition(":")
    assert sep and host and port.isdigit(), f"{value!r} is not host:port"
    return host, int(port)


def named_port(container: Dict[str, Any], port: Any) -> int:
    """A probe's or Service's port (number or container port name) as a number."""
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    raise AssertionError(f"container {container['name']} declares no port named {port!r}")


def duration_seconds(text: str) -> float:
    """An absl duration flag value (e.g. 10s, 1m30s, 500ms) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|ns|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"{text!r} is not a duration"
    return sum(float(n) * units[u] for n, u in parts)


def volume_by_mount(spec: Dict[str, Any], container: Dict[str, Any],
                    mount_path: str) -> Dict[str, Any]:
    """The volume mounted at mount_path in container."""
    mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"] == mount_path]
    assert mounts, f"container {container['name']} mounts nothing at {mount_path}"
    name = mounts[0]["name"]
    vols = [v for v in spec.get("volumes", []) if v["name"] == name]
    assert vols, f"mount {mount_path} refers to volume {name!r}, which the pod does not define"
    return vols[0]


def mount_covering(container: Dict[str, Any], path: str) -> Dict[str, Any]:
    """The volume mount whose mountPath is the longest prefix directory of path."""
    best = None
    for m in container.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best["mountPath"].rstrip("/")):
                best = m
    assert best is not None, f"no volume of container {container['name']} holds {path}"
    return best


def labels_match(selector: Dict[str, str], labels: Dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def env_value(container: Dict[str, Any], name: str) -> Optional[str]:
    for e in container.get("env", []):
        if e["name"] == name:
            return e.get("value")
    return None


def env_entry(container: Dict[str, Any], name: str) -> Dict[str, Any]:
    found = [e for e in container.get("env", []) if e["name"] == name]
    assert len(found) == 1, f"container {container['name']} sets {name} {len(found)} times"
    return found[0]


def volumes_of(obj: Dict[str, Any], container: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The pod volumes that container mounts."""
    names = {m["name"] for m in container.get("volumeMounts", [])}
    return [v for v in pod_spec(obj).get("volumes", []) if v["name"] in names]


def path_within(path: str, directory: str) -> bool:
    """path is directory or lies below it (both absolute, no trailing slash needed)."""
    path, directory = path.rstrip("/") or "/", directory.rstrip("/") or "/"
    return path == directory or path.startswith(directory + "/") or directory == "/"


# ---- what railyardd accepts -----------------------------------------------------------------

def source_flags() -> set:
    """The ABSL_FLAG names defined under daemon/."""
    names = set()
    for path in glob.glob(os.path.join(REPO, "daemon", "**", "*.cc"), recursive=True):
        with open(path) as f:
            names.update(re.findall(r"ABSL_FLAG\(\s*[\w:<>]+\s*,\s*(\w+)\s*,", f.read()))
    return names


def accepted_flags() -> Tuple[set, str]:
    """(flag names railyardd accepts, where that came from)."""
    daemon = os.environ.get("RAILYARDD")
    if daemon:
        out = subprocess.run([daemon, "--helpfull"], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
        names = set(re.findall(r"^\s+--([a-z_][a-z0-9_]*) \(", text, re.MULTILINE))
        assert "socket" in names, f"cannot read the flags from `{daemon} --helpfull`:\n{text}"
        return names, f"{daemon} --helpfull"
    return source_flags(), "ABSL_FLAG definitions under daemon/"


def env_settable_flags() -> set:
    """Flags that RAILYARD_<FLAG> may set: DaemonFlagNames() in daemon/flags.cc."""
    with open(os.path.join(REPO, "daemon", "flags.cc")) as f:
        text = f.read()
    m = re.search(r"DaemonFlagNames\(\)\s*\{.*?\{(.*?)\}", text, re.DOTALL)
    assert m, "DaemonFlagNames() not found in daemon/flags.cc"
    return set(re.findall(r'"(\w+)"', m.group(1)))


def topology_message_class():
    """The NodeTopology message class, built from proto/ with protoc (no generated stubs)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    protoc = os.environ.get("PROTOC", "protoc")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "topology.desc")
        subprocess.run([protoc, f"-I{os.path.join(REPO, 'proto')}", "--include_imports",
                        f"--descriptor_set_out={out}", "railyard/v1/topology.proto"],
                       check=True, capture_output=True, timeout=60)
        with open(out, "rb") as f:
            fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for fd in fds.file:
        pool.Add(fd)
    desc = pool.FindMessageTypeByName("railyard.v1.NodeTopology")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)
