"""The DaemonSet's container args start a real railyardd whose probe endpoints answer, whose
Admin API answers railctl on the Admin socket the manifest names, and which stops within
terminationGracePeriodSeconds. Only what cannot exist on a test machine is replaced: the node
address becomes 127.0.0.1, the ports free ones, the sockets, the token key (the Secret's file) and
the Admin directory (the emptyDir) temporary paths, the peer TLS Secret's files a certificate made
for the node name and 127.0.0.1, and the rails' RDMA devices "lo" over TCP (same number of
rails). Needs the daemon with --token_key_file and --admin_socket, and railctl with
--admin_socket and `token issue`."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

import deploy_model as dm


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def _railctl(daemon: str) -> str:
    """railctl of the same build as the daemon (CTest passes the daemon's path only)."""
    path = os.environ.get("RAILCTL") or os.path.join(
        os.path.dirname(os.path.dirname(daemon)), "tools", "railctl")
    assert os.access(path, os.X_OK), f"no railctl at {path} (set RAILCTL)"
    return path


_PEER_TLS = ("peer_tls_cert", "peer_tls_key", "peer_tls_ca")


def _peer_tls(run: dict, tmp: str, node: str) -> None:
    """The peer plane's mutual TLS files (the Secret's in the manifest) become certificates made
    now by scripts/peer-certs.sh for `node` at 127.0.0.1. A manifest with --peer_insecure keeps
    it."""
    if run.get("peer_insecure") in ("true", "1", ""):
        return
    certs = os.path.join(tmp, "peer-tls")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                          "peer-certs.sh")
    out = subprocess.run([script, certs, f"{node}=127.0.0.1"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, f"peer-certs.sh: {out.stderr}"
    run["peer_tls_cert"] = os.path.join(certs, f"{node}.pem")
    run["peer_tls_key"] = os.path.join(certs, f"{node}-key.pem")
    run["peer_tls_ca"] = os.path.join(certs, "ca.pem")


def test_daemonset_args_start_a_daemon_that_passes_its_probes():
    daemon = os.environ.get("RAILYARDD")
    if not daemon:
        pytest.skip("RAILYARDD (the built daemon) not given")
    railctl = _railctl(daemon)
    objects = dm.kustomization_objects()
    ds = dm.only(objects, "DaemonSet")
    c = dm.daemon_container(objects)
    args = dm.parse_args(c["args"])
    grace_period = ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]

    tmp = tempfile.mkdtemp(prefix="ry-deploy-", dir="/tmp")  # short: sun_path is 108 bytes
    proc = None
    try:
        spec = ds["spec"]["template"]["spec"]
        topo_mount = dm.mount_covering(c, args["topology"])
        cm = dm.find(objects, "ConfigMap",
                     dm.volume_by_mount(spec, c, topo_mount["mountPath"])["configMap"]["name"])
        topology = json.loads(cm["data"][os.path.relpath(args["topology"],
                                                         topo_mount["mountPath"])])
        for rail in topology["rails"]:
            rail["device"], rail["transports"] = "lo", "tcp"
        with open(os.path.join(tmp, "topology.json"), "w") as f:
            json.dump(topology, f)
        # The token key Secret's file: one 32-byte HMAC key in hex, mode 0400 as projected.
        key_file = os.path.join(tmp, "token-key", "key")
        os.mkdir(os.path.dirname(key_file))
        with open(key_file, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        os.chmod(key_file, 0o400)
        # The Admin emptyDir as the init container leaves it: the daemon's, mode 0700.
        admin_dir = os.path.join(tmp, "admin")
        os.mkdir(admin_dir, 0o700)
        os.chmod(admin_dir, 0o700)
        metrics_port, peer_port = _free_port(), _free_port()
        env = {"NODE_NAME": "deploy-test-node", "NODE_IP": "127.0.0.1"}
        run = {}
        for flag, value in args.items():
            for var, sub in env.items():
                value = value.replace(f"$({var})", sub)
            run[flag] = value
        # The peer TLS Secret's files become certificates made now for this node and address.
        assert all(f in args for f in _PEER_TLS), "the DaemonSet runs the peer service with TLS"
        run["socket"] = os.path.join(tmp, "ry.sock")
        run["admin_socket"] = os.path.join(admin_dir, os.path.basename(args["admin_socket"]))
        run["token_key_file"] = key_file
        run["topology"] = os.path.join(tmp, "topology.json")
        run["metrics_listen"] = f"127.0.0.1:{metrics_port}"
        run["peer_listen"] = f"127.0.0.1:{peer_port}"
        _peer_tls(run, tmp, env["NODE_NAME"])
        run["state_dir"] = os.path.join(tmp, "state")
        os.mkdir(run["state_dir"])
        log = open(os.path.join(tmp, "daemon.log"), "w+")
        clean_env = {k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_")}
        proc = subprocess.Popen([daemon] + [f"--{k}={v}" for k, v in run.items()],
                                stdout=log, stderr=subprocess.STDOUT, env=clean_env)
        base = f"http://127.0.0.1:{metrics_port}"
        deadline = time.monotonic() + 20
        status = {}
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            status = {p: _get(base + p) for p in ("/healthz", "/readyz")}
            if all(v == 200 for v in status.values()):
                break
            time.sleep(0.2)
        log.seek(0)
        assert proc.poll() is None, f"railyardd exited {proc.returncode}:\n{log.read()}"
        assert status == {"/healthz": 200, "/readyz": 200}, f"{status}\n{log.read()}"
        assert _get(base + "/metrics") == 200
        # The client socket and the buffer side channel beside it: what the pods mount.
        for path in (run["socket"], run["socket"] + ".fd"):
            assert stat.S_ISSOCK(os.stat(path).st_mode), f"{path} is not a socket"
        # The Admin socket, owner only, where the manifest says; railctl reaches it there (as
        # `kubectl exec ... railctl status` does with railctl's default, the manifest's path).
        admin = os.stat(run["admin_socket"])
        assert stat.S_ISSOCK(admin.st_mode) and stat.S_IMODE(admin.st_mode) == 0o600, \
            oct(admin.st_mode)
        assert stat.S_IMODE(os.stat(admin_dir).st_mode) == 0o700
        out = subprocess.run([railctl, "status", f"--admin_socket={run['admin_socket']}"],
                             capture_output=True, text=True, timeout=30, env=clean_env)
        assert out.returncode == 0, f"railctl status: {out.stderr}"
        assert "deploy-test-node" in out.stdout, out.stdout
        # The data-plane version an operator compares across nodes during an upgrade.
        assert re.search(r"^railyardd \S+ \(data plane [1-9]\d*\) on ", out.stdout, re.M), \
            out.stdout
        # The documented way to mint a job's token works with a key file as the Secret holds it.
        job = dm.example_job()["metadata"]["name"]
        out = subprocess.run([railctl, "token", "issue", "--job", job, "--ttl", "24h",
                              "--key", key_file], capture_output=True, text=True, timeout=30,
                             env=clean_env)
        assert out.returncode == 0, f"railctl token issue: {out.stderr}"
        token = out.stdout.strip()
        m = re.fullmatch(r"ryt1\.(\d+)\.([^.]+)\.([0-9a-f]+)", token)
        assert m and m.group(2) == job, token
        assert 23 * 3600 < int(m.group(1)) - time.time() <= 24 * 3600 + 60, token

        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=grace_period)
        except subprocess.TimeoutExpired:
            pytest.fail(f"railyardd still running {grace_period} s after SIGTERM: the kubelet "
                        "would SIGKILL it")
        assert code == 0, f"exit status {code} after SIGTERM"
        assert time.monotonic() - start < grace_period
        for path in (run["socket"], run["socket"] + ".fd", run["admin_socket"]):
            assert not os.path.exists(path), f"{path} left behind"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
