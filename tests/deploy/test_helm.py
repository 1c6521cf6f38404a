"""The Helm chart: with default values it renders the objects of deploy/kubernetes; its values
are wired where they belong; the offline renderer behaves like Helm on the constructs it
supports and refuses the others. Plus `kubectl kustomize` of deploy/kubernetes when kubectl is
installed (it works offline; `kubectl apply/create --dry-run=client` does not: both need an API
server for discovery)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

import deploy_model as dm
import helm_template
from conftest import CUSTOM_VALUES


def _first_difference(a, b, path="spec"):
    """The path and the two values where a and b first differ (for a readable failure)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path}: {a!r} (deploy/kubernetes) != {b!r} (helm)"


def _by_key(objects):
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_default_values_render_the_plain_manifests(chart):
    plain = _by_key(o for o in dm.kustomization_objects() if o["kind"] != "Namespace")
    helm = _by_key(chart.render_objects(release="railyard", namespace="railyard"))
    assert sorted(plain) == sorted(helm)
    for key, p in plain.items():
        h = helm[key]
        assert p["apiVersion"] == h["apiVersion"], key
        assert p["metadata"]["namespace"] == h["metadata"]["namespace"], key
        # Helm adds its own labels (chart, version, managed-by); the plain ones must all be there.
        assert dm.labels_match(p["metadata"]["labels"], h["metadata"]["labels"]), key
        assert p["metadata"].get("annotations") == h["metadata"].get("annotations"), key
        if key[0] == "ConfigMap":
            assert p["data"].keys() == h["data"].keys()
            for k in p["data"]:
                assert json.loads(p["data"][k]) == json.loads(h["data"][k]), (key, k)
        else:
            assert p["spec"] == h["spec"], f"{key}: {_first_difference(p['spec'], h['spec'])}"


def test_custom_values_are_wired(chart):
    objs = chart.render_objects(release="ry-prod", namespace="gpu-infra", values=CUSTOM_VALUES)
    ds = dm.only(objs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    c = dm.daemon_container(objs)
    args = dm.parse_args(c["args"])
    assert ds["metadata"]["name"] == "ry-prod-railyard"
    assert c["image"] == "registry.example/ml/railyardd:1.2.3"
    assert args["socket"] == "/var/run/ry/daemon.sock"
    assert args["algo"] == "hier" and args["log_level"] == "debug"
    assert args["worker_threads"] == "8" and args["shutdown_grace"] == "30s"
    assert spec["terminationGracePeriodSeconds"] == 45
    assert c["args"][-2:] == ["--op_timeout=600s", "--init_timeout=5m"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert args["admin_socket"] == "/var/run/ry-admin/ctl.sock"
    assert args["token_key_file"] == "/etc/railyard/token-key/hmac.hex"
    assert args["job_tokens"] == "/etc/railyard/job-tokens/tokens.txt"
    # Quotas: integers as integers (not 6.8719476736e+10), strings as given, in name order.
    quota_args = [a for a in c["args"] if a.startswith("--max_")]
    assert quota_args == ["--max_buffer_bytes_per_job=68719476736", "--max_comms_per_session=8",
                          "--max_sessions_per_job=64"], quota_args
    assert spec["securityContext"] == {"fsGroup": 1000}
    cm = dm.only(objs, "ConfigMap")
    assert json.loads(cm["data"]["topology.json"]) == {"rails": CUSTOM_VALUES["rails"]}
    sm = dm.only(objs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus"
    assert sm["spec"]["namespaceSelector"]["matchNames"] == ["gpu-infra"]


def _quota_args(objs):
    return [a for a in dm.daemon_container(objs)["args"] if a.startswith("--max_")]


def test_quota_flags_are_rendered_only_when_set(chart):
    assert _quota_args(chart.render_objects()) == [], "the defaults set no quota"
    every = {"max_sessions": 512, "max_sessions_per_job": 64, "max_buffers_per_session": 4096,
             "max_buffer_bytes_per_session": 17179869184, "max_buffers_per_job": 16384,
             "max_buffer_bytes_per_job": 1000000, "max_comms_per_session": 32,
             "max_comms_per_job": 128, "max_metric_jobs": 100}
    assert _quota_args(chart.render_objects(values={"quotas": every})) == \
        [f"--{k}={v}" for k, v in sorted(every.items())]
    one = chart.render_objects(values={"quotas": {"max_comms_per_job": 3}})
    assert _quota_args(one) == ["--max_comms_per_job=3"]
    # A quota given as 0 is set (to 0), not dropped as "empty".
    assert _quota_args(chart.render_objects(values={"quotas": {"max_metric_jobs": 0}})) == \
        ["--max_metric_jobs=0"]
    # null removes a key, as with Helm (-f values with `max_sessions: null`).
    base = helm_template.Chart(dm.CHART_DIR)
    base.values = dict(base.values, quotas={"max_sessions": 9, "max_comms_per_job": 2})
    assert _quota_args(base.render_objects(values={"quotas": {"max_sessions": None}})) == \
        ["--max_comms_per_job=2"]
    # The rest of the args are the same with and without quotas.
    plain = [a for a in dm.daemon_container(chart.render_objects())["args"]]
    assert [a for a in dm.daemon_container(one)["args"] if not a.startswith("--max_")] == plain


@pytest.mark.parametrize("values, message", [
    ({"tokenKey": {"secretName": ""}}, "without either railyardd refuses every Connect"),
    ({"daemon": {"adminSocketDir": "/run/railyard"}}, "adminSocketDir must not be"),
    ({"daemon": {"adminSocketDir": "/run/railyard/admin"}}, "adminSocketDir must not be"),
    ({"daemon": {"socketDir": "/run/railyard-admin/client"}}, "adminSocketDir must not be"),
    ({"daemon": {"extraArgs": ["--insecure_first_session_token=true"]}}, "demos only"),
    ({"daemon": {"extraArgs": ["--insecure_first_session_token"]}}, "demos only"),
    ({"quotas": {"sessions": 3}}, "quotas.sessions: not a quota flag"),
])
def test_chart_refuses_unsafe_or_broken_values(chart, values, message):
    with pytest.raises(helm_template.ChartFailure, match=message):
        chart.render(values=values)


def test_static_job_tokens_alone(chart):
    objs = chart.render_objects(values={"tokenKey": {"secretName": ""},
                                        "jobTokens": {"secretName": "tok"}})
    c = dm.daemon_container(objs)
    args = dm.parse_args(c["args"])
    assert "token_key_file" not in args
    assert args["job_tokens"] == "/etc/railyard/job-tokens/job_tokens"
    spec = dm.only(objs, "DaemonSet")["spec"]["template"]["spec"]
    secrets = [v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v]
    assert secrets == ["tok", "railyard-peer-tls"]  # the job tokens, and the peer certificate
    assert "/etc/railyard/token-key" not in {m["mountPath"] for m in c["volumeMounts"]}


def test_optional_objects_and_annotations_switch_off(chart):
    objs = chart.render_objects(values={"metrics": {"annotations": False,
                                                    "serviceMonitor": {"enabled": False}},
                                        "priorityClassName": ""})
    assert "ServiceMonitor" not in {o["kind"] for o in objs}
    ds = dm.only(objs, "DaemonSet")
    assert "annotations" not in ds["spec"]["template"]["metadata"]
    assert "annotations" not in dm.only(objs, "Service")["metadata"]
    assert "priorityClassName" not in ds["spec"]["template"]["spec"]


def test_notes_tell_pods_how_to_connect(chart):
    notes = chart.render(release="ry-prod", namespace="gpu-infra",
                         values=CUSTOM_VALUES)["NOTES.txt"]
    assert "RAILYARD_SOCKET=/var/run/ry/daemon.sock" in notes
    assert "hostPath /var/run/ry -> /var/run/ry (readOnly" in notes
    assert "/var/run/ry/daemon.sock.fd" in notes
    assert "hostPath /dev/shm" not in notes and "-> /dev/shm" not in notes
    assert "RAILYARD_TOKEN=" in notes and "secretKeyRef" in notes
    assert ":9500/metrics" in notes
    # The key Secret, as the DaemonSet mounts it, and the mint command with the mounted key.
    assert "kubectl -n gpu-infra create secret generic ry-hmac-keys --from-file=hmac.hex=key" \
        in notes
    assert "railctl token keygen --out key" in notes
    assert "railctl token issue --job <job id> --ttl 24h --key /etc/railyard/token-key/hmac.hex" \
        in notes
    assert "exec <pod> -c railyardd -- railctl status --admin_socket=/var/run/ry-admin/ctl.sock" \
        in notes
    assert 'Secret gpu-infra/railyard-job-tokens, key "tokens.txt"' in notes


def test_notes_name_what_the_daemonset_mounts(chart):
    objs = chart.render_objects()
    notes = chart.render()["NOTES.txt"]
    c = dm.daemon_container(objs)
    key_file = dm.parse_args(c["args"])["token_key_file"]
    spec = dm.only(objs, "DaemonSet")["spec"]["template"]["spec"]
    secret = dm.volume_by_mount(spec, c, dm.mount_covering(c, key_file)["mountPath"])["secret"]
    assert (f"create secret generic {secret['secretName']} "
            f"--from-file={secret['items'][0]['key']}=key") in notes
    assert f"--key {key_file}" in notes
    assert "Static job tokens" not in notes


# ---- the renderer itself --------------------------------------------------------------------

def _render(tmp_path, template, values=None, helpers=""):
    d = tmp_path / "chart"
    (d / "templates").mkdir(parents=True, exist_ok=True)
    (d / "Chart.yaml").write_text("name: t\nversion: 1.0.0\nappVersion: '2'\n")
    (d / "values.yaml").write_text(yaml.safe_dump(values or {}))
    (d / "templates" / "t.yaml").write_text(template)
    (d / "templates" / "_h.tpl").write_text(helpers)
    return helm_template.Chart(str(d)).render(release="r", namespace="n")["t.yaml"]


def test_renderer_matches_go_template_semantics(tmp_path):
    # Expected strings are what Helm 3 prints for the same template and values.
    assert _render(tmp_path, "a: {{ .Values.x }}\n", {"x": 3}) == "a: 3\n"
    assert _render(tmp_path, "a:\n  {{- if .Values.on }} yes{{ end }}\nb: 1\n",
                   {"on": True}) == "a: yes\nb: 1\n"
    assert _render(tmp_path, "a: {{ .Values.on }}", {"on": False}) == "a: false"
    assert _render(tmp_path, "{{- range .Values.l }}\n- {{ . | quote }}\n{{- end }}",
                   {"l": ["x", 2]}) == '\n- "x"\n- "2"'
    assert _render(tmp_path, "l:\n  {{- toYaml .Values.m | nindent 2 }}",
                   {"m": {"b": 1, "a": [1]}}) == "l:\n  a:\n  - 1\n  b: 1"
    assert _render(tmp_path, '{{ include "h" . }}', helpers='{{- define "h" -}}\n'
                   '{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 3 }}\n{{- end }}') == "r-t"
    assert _render(tmp_path, '{{ .Values.t | default .Chart.AppVersion }}', {"t": ""}) == "2"
    assert _render(tmp_path, "{{ add .Values.a 10 }}", {"a": 5}) == "15"
    assert _render(tmp_path, "{{ toJson .Values.m }}", {"m": {"b": "x", "a": 1}}) == \
        '{"a":1,"b":"x"}'
    assert _render(tmp_path, "{{/* a comment */}}x") == "x"
    # range with variables: maps in key order, lists with their index.
    assert _render(tmp_path, "{{- range $k, $v := .Values.m }}{{ $k }}={{ $v }};{{ end }}",
                   {"m": {"b": "x", "a": 1}}) == "a=1;b=x;"
    assert _render(tmp_path, "{{- range $i, $v := .Values.l }}{{ $i }}:{{ $v.n }} {{ end }}",
                   {"l": [{"n": "p"}, {"n": "q"}]}) == "0:p 1:q "
    assert _render(tmp_path, "{{- range $v := .Values.l }}[{{ $v }}{{ . }}]{{ end }}",
                   {"l": ["a"]}) == "[aa]"
    assert _render(tmp_path, "{{ or .Values.a .Values.b }}|{{ or .Values.a .Values.c }}",
                   {"a": "", "b": "y", "c": ""}) == "y|"
    assert _render(tmp_path, '{{ hasPrefix "ab" .Values.s }} {{ hasPrefix "b" .Values.s }}',
                   {"s": "abc"}) == "true false"
    assert _render(tmp_path, '{{ kindIs "string" .Values.s }} {{ kindIs "float64" .Values.n }}',
                   {"s": "1", "n": 1}) == "true true"


def test_renderer_prints_numbers_like_helm(tmp_path):
    # Helm decodes values files through JSON: numbers are float64, printed by fmt's %v.
    values = {"small": 999999, "big": 1000000, "bytes": 68719476736, "frac": 0.25,
              "tiny": 0.00001, "neg": -1234567}
    assert _render(tmp_path, "{{ .Values.small }} {{ .Values.big }} {{ .Values.bytes }} "
                   "{{ .Values.frac }} {{ .Values.tiny }} {{ .Values.neg }}", values) == \
        "999999 1e+06 6.8719476736e+10 0.25 1e-05 -1.234567e+06"
    assert _render(tmp_path, "{{ .Values.bytes | int64 }} {{ .Values.big | quote }}", values) == \
        '68719476736 "1e+06"'
    # Marshalled (toYaml, toJson), integral float64 values print as integers.
    assert _render(tmp_path, "{{ toJson .Values.m }}", {"m": {"n": 68719476736}}) == \
        '{"n":68719476736}'
    assert helm_template.go_float(123456.0) == "123456"
    assert helm_template.go_float(1234567.0) == "1.234567e+06"
    assert helm_template.go_float(1.5e-4) == "0.00015"


@pytest.mark.parametrize("template", [
    "{{ .Values.missing }}",             # Helm would print nothing: a typo must not pass here
    "{{ with .Values.x }}{{ end }}",     # not implemented
    "{{ upper .Values.x }}",             # unknown function
    "{{ if .Values.x }}",                # unclosed block
    "{{ $y }}",                          # undefined variable
    '{{ fail "stop" }}',                 # the chart's own failure
    "{{ eq .Values.n 1 }}",              # float64 value vs int literal: a Go template error
    '{{ printf "%d" .Values.n }}',       # Go prints %!d(float64=1)
    "{{ .Values.x | int64 }}",           # string to int64 is not modelled
])
def test_renderer_refuses_what_it_does_not_implement(tmp_path, template):
    with pytest.raises(helm_template.TemplateError):
        _render(tmp_path, template, {"x": "v", "n": 1})


def test_kubectl_kustomize_builds_the_same_objects():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (not packaged for Debian 12 beside kubernetes-client)")
    out = subprocess.run([kubectl, "kustomize", dm.KUBE_DIR], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, KUBECONFIG="/dev/null"))
    assert out.returncode == 0, out.stderr
    built = _by_key(d for d in yaml.safe_load_all(out.stdout) if d)
    mine = _by_key(dm.kustomization_objects())
    assert built == mine
