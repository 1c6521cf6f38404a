"""deploy/prometheus: the alerting rules pass `promtool check rules` and their unit tests
(`promtool test rules alerts_test.yml`), prometheus.yml loads them, and they watch what the
daemon exports: the collective rules are on railyard_comm_stalled_seconds, and the warning fires
before the default --op_timeout fails the stalled op (after which `railctl diagnose` has nothing
to show); the rail rule is on railyard_link_stalls_total, one alert per link."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

import deploy_model as dm

PROM_DIR = os.path.join(dm.REPO, "deploy", "prometheus")
RULES = os.path.join(PROM_DIR, "alerts.yml")
RULES_TEST = os.path.join(PROM_DIR, "alerts_test.yml")
CONFIG = os.path.join(PROM_DIR, "prometheus.yml")
DASHBOARD = os.path.join(dm.REPO, "deploy", "grafana", "railyard.json")
COLLECTIVE_ALERTS = {"RailyardCollectiveStalled": "warning", "RailyardCollectiveHung": "critical"}
LINK_ALERTS = {"RailyardRailDown": "warning"}
ALERTS = {**COLLECTIVE_ALERTS, **LINK_ALERTS}


def promtool(*args):
    tool = shutil.which("promtool") or "/usr/bin/promtool"
    if not os.path.exists(tool):
        pytest.skip("promtool is not installed (Debian package prometheus)")
    out = subprocess.run([tool, *args], capture_output=True, text=True, timeout=60,
                         cwd=PROM_DIR)
    print(out.stdout + out.stderr)
    return out


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def rules():
    return [r for g in load(RULES)["groups"] for r in g["rules"]]


def seconds(duration: str) -> float:
    """A Prometheus duration of one unit (15s, 1m, 1h)."""
    m = re.fullmatch(r"(\d+)(s|m|h)", duration)
    assert m, f"unsupported duration {duration!r}"
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def threshold(expr: str) -> float:
    m = re.search(r">\s*(\d+(?:\.\d+)?)\s*$", expr)
    assert m, f"no `> N` threshold at the end of {expr!r}"
    return float(m.group(1))


def default_op_timeout_s() -> int:
    with open(os.path.join(dm.REPO, "daemon", "flags.cc")) as f:
        m = re.search(r"ABSL_FLAG\(absl::Duration, op_timeout, absl::Seconds\((\d+)\)", f.read())
    assert m, "the default of --op_timeout is not in daemon/flags.cc"
    return int(m.group(1))


def test_promtool_checks_rules():
    out = promtool("check", "rules", RULES)
    assert out.returncode == 0
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout


def test_promtool_rule_unit_tests_pass():
    out = promtool("test", "rules", RULES_TEST)
    assert out.returncode == 0
    assert "SUCCESS" in out.stdout


def test_prometheus_config_loads_the_rules():
    assert "alerts.yml" in load(CONFIG)["rule_files"]
    out = promtool("check", "config", CONFIG)
    assert out.returncode == 0
    assert "SUCCESS: 1 rule files found" in out.stdout


def test_rules_watch_the_stall_gauge_per_job_and_daemon():
    by_name = {r["alert"]: r for r in rules()}
    assert set(by_name) == set(ALERTS)
    for name in COLLECTIVE_ALERTS:
        rule = by_name[name]
        assert "railyard_comm_stalled_seconds" in rule["expr"], name
        # One alert per job and daemon: the operator needs both to run railctl diagnose.
        assert re.search(r"by \(job, instance\)", rule["expr"]), name
        assert rule["labels"]["severity"] == ALERTS[name]
        for key in ("summary", "description"):
            text = rule["annotations"][key]
            assert "{{ $labels.job }}" in text and "{{ $labels.instance }}" in text, (name, key)
        assert "railctl diagnose --job {{ $labels.job }}" in rule["annotations"]["description"]


def test_the_rail_rule_watches_the_link_stall_counter_per_link():
    by_name = {r["alert"]: r for r in rules()}
    for name, severity in LINK_ALERTS.items():
        rule = by_name[name]
        assert "increase(railyard_link_stalls_total[" in rule["expr"], name
        # One alert per link: the operator needs the node, the peer and the rail to check it.
        assert re.search(r"by \(instance, node, peer, rail\)", rule["expr"]), name
        assert threshold(rule["expr"]) == 0, name
        assert rule["labels"]["severity"] == severity
        for key in ("summary", "description"):
            text = rule["annotations"][key]
            for label in ("node", "peer", "rail"):
                assert "{{ $labels.%s }}" % label in text, (name, key, label)
    # The counter the rule watches is the daemon's.
    with open(os.path.join(dm.REPO, "daemon", "metrics", "daemon_metrics.cc")) as f:
        assert '"railyard_link_stalls_total"' in f.read()


def test_warning_fires_before_the_default_op_timeout():
    by_name = {r["alert"]: r for r in rules()}
    stalled, hung = by_name["RailyardCollectiveStalled"], by_name["RailyardCollectiveHung"]
    assert threshold(stalled["expr"]) < threshold(hung["expr"])
    glob = load(CONFIG)["global"]
    # Worst case: the op crosses the threshold just after a scrape and an evaluation.
    latest = (threshold(stalled["expr"]) + seconds(stalled["for"])
              + seconds(glob["scrape_interval"]) + seconds(glob["evaluation_interval"]))
    assert latest < default_op_timeout_s(), \
        "the warning must fire while the stalled op is still in flight to diagnose"
    # Past the default timeout the daemon would have failed the op itself, as the page says.
    assert threshold(hung["expr"]) > default_op_timeout_s()
    assert f"--op_timeout ({default_op_timeout_s()} s)" in hung["annotations"]["description"]


def test_unit_tests_cover_every_alert_firing_and_not():
    cases = [c for t in load(RULES_TEST)["tests"] for c in t["alert_rule_test"]]
    for name in ALERTS:
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"no test where {name} fires"
        assert any(not c["exp_alerts"] for c in mine), f"no test where {name} stays silent"
        labels = ({"job", "instance", "severity"} if name in COLLECTIVE_ALERTS
                  else {"instance", "node", "peer", "rail", "severity"})
        for c in mine:
            for a in c["exp_alerts"]:
                assert labels <= set(a["exp_labels"]), (name, c)
                assert "railctl diagnose --job" in a["exp_annotations"]["description"]


def test_dashboard_plots_the_stall_in_the_jobs_row():
    with open(DASHBOARD) as f:
        panels = json.load(f)["panels"]
    rows = sorted((p["gridPos"]["y"], p["title"]) for p in panels if p["type"] == "row")
    jobs_y = dict((t, y) for y, t in rows)["Jobs"]
    next_y = min((y for y, _ in rows if y > jobs_y), default=float("inf"))
    stall = [p for p in panels if any("railyard_comm_stalled_seconds" in t["expr"]
                                      for t in p.get("targets", []))]
    assert [p["title"] for p in stall] == ["Stalled communicators per job"]
    assert jobs_y < stall[0]["gridPos"]["y"] < next_y
