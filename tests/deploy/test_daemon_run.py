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


def _peer_certificate(directory: str, node: str, ip: str) -> None:
    """What the peer TLS Secret holds (tls.crt, tls.key, ca.crt, as cert-manager writes them):
    a CA and a certificate it signed naming the node (DNS) and its address (IP)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed: cannot make the peer certificate the args name")

    def run(*args: str) -> None:
        out = subprocess.run([openssl, *args], capture_output=True, text=True, timeout=60,
                             cwd=directory)
        assert out.returncode == 0, f"openssl {' '.join(args)}: {out.stderr}"

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=railyard-peer-ca", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", "-new", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={node}")
    with open(os.path.join(directory, "ext.cnf"), "w") as f:
        f.write(f"subjectAltName=DNS:{node},IP:{ip}\nextendedKeyUsage=serverAuth,clientAuth\n"
                "keyUsage=critical,digitalSignature\nbasicConstraints=critical,CA:FALSE\n")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", "ext.cnf", "-out", "tls.crt")
    for name in ("ca.key", "tls.csr", "ext.cnf", "ca.srl"):
        if os.path.exists(os.path.join(directory, name)):
            os.remove(os.path.join(directory, name))
    for name in ("tls.crt", "tls.key", "ca.crt"):
        os.chmod(os.path.join(directory, name), 0o400)  # the Secret's defaultMode


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
        # The peer TLS Secret's files, for this node's name and address.
        tls_flags = ("peer_tls_cert", "peer_tls_key", "peer_tls_ca")
        assert all(f in args for f in tls_flags), "the DaemonSet runs the peer service with TLS"
        if dm.daemon_defines(daemon, "peer_tls_cert"):
            tls_dir = os.path.join(tmp, "peer-tls")
            os.mkdir(tls_dir)
            _peer_certificate(tls_dir, env["NODE_NAME"], env["NODE_IP"])
            for flag in tls_flags:
                run[flag] = os.path.join(tls_dir, os.path.basename(args[flag]))
        else:
            # A daemon built before the peer TLS flags (dm.ANNOUNCED_FLAGS): it would refuse
            # them as unknown, and runs its plaintext peer service without them.
            for flag in tls_flags:
                del run[flag]
        run["socket"] = os.path.join(tmp, "ry.sock")
        run["admin_socket"] = os.path.join(admin_dir, os.path.basename(args["admin_socket"]))
        run["token_key_file"] = key_file
        run["topology"] = os.path.join(tmp, "topology.json")
        run["metrics_listen"] = f"127.0.0.1:{metrics_port}"
        run["peer_listen"] = f"127.0.0.1:{peer_port}"
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
