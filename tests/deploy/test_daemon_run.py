"""The DaemonSet's container args start a real railyardd whose probe endpoints answer, and which
stops within terminationGracePeriodSeconds. Only what cannot exist on a test machine is replaced:
the node address becomes 127.0.0.1, the ports free ones, the socket a temporary path, and the
rails' RDMA devices "lo" over TCP (same number of rails)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
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


def test_daemonset_args_start_a_daemon_that_passes_its_probes():
    daemon = os.environ.get("RAILYARDD")
    if not daemon:
        pytest.skip("RAILYARDD (the built daemon) not given")
    objects = dm.kustomization_objects()
    ds = dm.only(objects, "DaemonSet")
    c = dm.daemon_container(objects)
    args = dm.parse_args(c["args"])
    grace_period = ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]

    tmp = tempfile.mkdtemp(prefix="ry-deploy-", dir="/tmp")  # short: sun_path is 108 bytes
    proc = None
    try:
        spec = ds["spec"]["template"]["spec"]
        cm = dm.find(objects, "ConfigMap",
                     dm.volume_by_mount(spec, c, "/etc/railyard")["configMap"]["name"])
        topology = json.loads(cm["data"]["topology.json"])
        for rail in topology["rails"]:
            rail["device"], rail["transports"] = "lo", "tcp"
        with open(os.path.join(tmp, "topology.json"), "w") as f:
            json.dump(topology, f)
        metrics_port, peer_port = _free_port(), _free_port()
        env = {"NODE_NAME": "deploy-test-node", "NODE_IP": "127.0.0.1"}
        run = {}
        for flag, value in args.items():
            for var, sub in env.items():
                value = value.replace(f"$({var})", sub)
            run[flag] = value
        run["socket"] = os.path.join(tmp, "ry.sock")
        run["topology"] = os.path.join(tmp, "topology.json")
        run["metrics_listen"] = f"127.0.0.1:{metrics_port}"
        run["peer_listen"] = f"127.0.0.1:{peer_port}"
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
        assert os.path.exists(run["socket"])

        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=grace_period)
        except subprocess.TimeoutExpired:
            pytest.fail(f"railyardd still running {grace_period} s after SIGTERM: the kubelet "
                        "would SIGKILL it")
        assert code == 0, f"exit status {code} after SIGTERM"
        assert time.monotonic() - start < grace_period
        assert not os.path.exists(run["socket"]), "socket left behind"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
