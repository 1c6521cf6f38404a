"""deploy/systemd: the unit passes `systemd-analyze verify` (which only warns, so any output is a
failure here), and its settings agree with railyard.conf and with what railyardd accepts."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess

import pytest

import deploy_model as dm

UNIT = os.path.join(dm.REPO, "deploy", "systemd", "railyardd.service")
CONF = os.path.join(dm.REPO, "deploy", "systemd", "railyard.conf")


def unit_sections():
    parser = configparser.ConfigParser(strict=False, interpolation=None,
                                       comment_prefixes=("#", ";"), delimiters=("=",))
    parser.optionxform = str  # systemd keys are case-sensitive
    with open(UNIT) as f:
        parser.read_file(f)
    return parser


def conf_vars():
    out = {}
    with open(CONF) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = re.fullmatch(r"([A-Z_][A-Z0-9_]*)=(\S*)", line)
            assert m, f"railyard.conf:{n}: not KEY=value: {line!r}"
            out[m.group(1)] = m.group(2)
    return out


def test_unit_shape():
    u = unit_sections()
    assert set(u.sections()) == {"Unit", "Service", "Install"}
    s = u["Service"]
    assert s["Type"] == "simple", "railyardd does not call sd_notify"
    assert s["Restart"] == "on-failure"
    assert s["KillSignal"] == "SIGTERM"
    assert s["RuntimeDirectory"] == "railyard" and s["StateDirectory"] == "railyard"
    assert s["ExecStart"].split()[0].endswith("/railyardd")
    assert s["EnvironmentFile"].lstrip("-") == "/etc/railyard/railyard.conf"
    assert s["NoNewPrivileges"] == "yes" and s["ProtectSystem"] == "strict"
    assert set(s["CapabilityBoundingSet"].split()) == {"CAP_DAC_OVERRIDE", "CAP_IPC_LOCK"}
    assert s["AmbientCapabilities"].split() == s["CapabilityBoundingSet"].split()
    # /dev/shm and /dev/infiniband must stay the host's.
    for key in ("PrivateDevices", "PrivateIPC", "MemoryDenyWriteExecute"):
        assert s.get(key, "no") == "no", f"{key} breaks shared memory, RDMA or UCX"


def test_conf_sets_only_environment_flags_and_fits_the_unit():
    u = unit_sections()["Service"]
    env = conf_vars()
    settable = dm.env_settable_flags()
    for key in env:
        assert key.startswith("RAILYARD_") and key[9:].lower() in settable, \
            f"{key} is not read by railyardd (DaemonFlagNames in daemon/flags.cc)"
    # The socket lives in the unit's RuntimeDirectory, which systemd creates and owns.
    assert os.path.dirname(env["RAILYARD_SOCKET"]) == "/run/" + u["RuntimeDirectory"]
    grace = dm.duration_seconds(env["RAILYARD_SHUTDOWN_GRACE"])
    assert dm.duration_seconds(u["TimeoutStopSec"]) >= grace + 5
    dm.host_port(env["RAILYARD_METRICS_LISTEN"])


def test_conf_is_honoured_by_railyardd():
    """Every variable in railyard.conf reaches its flag: `railyardd --helpfull` prints
    "currently: <value>" for a flag set away from its default."""
    daemon = os.environ.get("RAILYARDD")
    if not daemon:
        pytest.skip("RAILYARDD (the built daemon) not given")
    env = {k: v for k, v in conf_vars().items()}
    out = subprocess.run([daemon, "--helpfull"], env=dict(os.environ, **env),
                         capture_output=True, text=True, timeout=30)
    text = re.sub(r"\s+", " ", out.stdout + out.stderr)
    for key, value in env.items():
        flag = key[9:].lower()
        m = re.search(rf"--{flag} \(.*?\); default: (\S*?);( currently: (\S*?);)?", text)
        assert m, f"--{flag} missing from --helpfull"
        default, current = m.group(1).strip('"'), (m.group(3) or "").strip('"')
        if default != value:
            assert current == value, f"{key}={value} did not set --{flag} (currently {current!r})"


def test_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    # verify checks that ExecStart exists: point it at the built daemon (or any executable).
    binary = os.environ.get("RAILYARDD") or shutil.which("true")
    with open(UNIT) as f:
        text = f.read().replace("/usr/local/bin/railyardd", binary)
    unit = tmp_path / "railyardd.service"
    unit.write_text(text)
    out = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    # Lines about other units of the host (systemd loads its default dependencies) are not ours.
    ours = [l for l in (out.stdout + out.stderr).splitlines() if "railyardd" in l]
    assert out.returncode == 0 and not ours, "\n".join(ours) or out.stderr
