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


def conf_vars(commented: bool = False):
    """KEY=value lines of railyard.conf; with commented, the commented-out examples
    (#RAILYARD_X=value) instead."""
    out = {}
    with open(CONF) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if commented:
                m = re.fullmatch(r"#(RAILYARD_[A-Z0-9_]*)=(\S*)", line)
                if m:
                    out[m.group(1)] = m.group(2)
                continue
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
    # READY=1 once serving; a successor started by reload (SIGUSR2) says MAINPID= itself.
    assert s["Type"] == "notify" and s["NotifyAccess"] == "all"
    assert s["ExecReload"].split() == ["/bin/kill", "-USR2", "$MAINPID"], "reload by handover"
    assert s["Restart"] == "on-failure"
    assert s["KillSignal"] == "SIGTERM"
    assert s["RuntimeDirectory"].split() == ["railyard", "railyard-admin"]
    assert s["StateDirectory"] == "railyard"
    assert s["ExecStart"].split()[0].endswith("/railyardd")
    assert s["EnvironmentFile"].lstrip("-") == "/etc/railyard/railyard.conf"
    assert s["NoNewPrivileges"] == "yes" and s["ProtectSystem"] == "strict"
    # Only IPC_LOCK (RDMA): buffers arrive as memfd descriptors, so no CAP_DAC_OVERRIDE to open
    # other users' files, which would let the daemon read any tenant's data on the host.
    assert s["CapabilityBoundingSet"].split() == ["CAP_IPC_LOCK"]
    assert s["AmbientCapabilities"].split() == s["CapabilityBoundingSet"].split()
    # /dev/infiniband must stay the host's; UCX patches code in place.
    for key in ("PrivateDevices", "MemoryDenyWriteExecute"):
        assert s.get(key, "no") == "no", f"{key} breaks RDMA or UCX"
    assert "AF_UNIX" in s["RestrictAddressFamilies"].split(), "the sockets and SCM_RIGHTS"


def test_conf_sets_only_environment_flags_and_fits_the_unit():
    u = unit_sections()["Service"]
    env = conf_vars()
    settable = dm.env_settable_flags()
    for key in env:
        assert key.startswith("RAILYARD_") and key[9:].lower() in settable, \
            f"{key} is not read by railyardd (DaemonFlagNames in daemon/flags.cc)"
    runtime_dirs = ["/run/" + d for d in u["RuntimeDirectory"].split()]
    # The client socket lives in the unit's first RuntimeDirectory, which systemd creates and
    # owns with RuntimeDirectoryMode (0750: group "railyard" connects).
    socket_dir = os.path.dirname(env["RAILYARD_SOCKET"])
    assert socket_dir == runtime_dirs[0] and u["RuntimeDirectoryMode"] == "0750"
    # The Admin socket in the other one, which ExecStartPre closes to the service's user alone.
    admin_dir = os.path.dirname(env["RAILYARD_ADMIN_SOCKET"])
    assert admin_dir == runtime_dirs[1] != socket_dir
    assert u["ExecStartPre"].split() == ["/bin/chmod", "0700", admin_dir]
    # The token key in the ConfigurationDirectory (read-only under ProtectSystem=strict).
    assert env["RAILYARD_TOKEN_KEY_FILE"] == "/etc/" + u["ConfigurationDirectory"] + "/token-key"
    assert not [k for k in env if "INSECURE" in k], "the demo-only token mode"
    grace = dm.duration_seconds(env["RAILYARD_SHUTDOWN_GRACE"])
    assert dm.duration_seconds(u["TimeoutStopSec"]) >= grace + 5
    dm.host_port(env["RAILYARD_METRICS_LISTEN"])


def test_commented_examples_name_environment_flags():
    """The commented-out settings an operator may enable are variables railyardd reads."""
    examples = conf_vars(commented=True)
    settable = dm.env_settable_flags()
    assert "RAILYARD_JOB_TOKENS" in examples and "RAILYARD_MAX_SESSIONS_PER_JOB" in examples
    unread = sorted(k for k in examples if k[9:].lower() not in settable)
    assert not unread, f"railyardd reads none of {unread} (DaemonFlagNames in daemon/flags.cc)"
    assert not [k for k in examples if "INSECURE" in k]


def test_unit_and_conf_never_enable_the_demo_token_mode():
    u = unit_sections()["Service"]
    for key in ("ExecStart", "ExecStartPre", "Environment"):
        assert "insecure" not in u.get(key, "").lower(), f"{key}={u.get(key)}"
    with open(CONF) as f:
        assert "insecure" not in f.read().lower()


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
