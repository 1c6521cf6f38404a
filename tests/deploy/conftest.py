"""Fixtures of the deployment tests: the object sets to check (plain manifests and the rendered
Helm chart, with default and non-default values) and what railyardd accepts."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import deploy_model as dm  # noqa: E402
import helm_template  # noqa: E402

# Values that move every knob the chart exposes away from its default, so that the invariants
# (probe port == --metrics_listen port, socket path == mount, ...) are checked as wired, not as
# coincidences of the defaults.
CUSTOM_VALUES = {
    "image": {"repository": "registry.example/ml/railyardd", "tag": "1.2.3"},
    "rails": [{"name": "ib0", "device": "mlx5_2:1", "transports": "rc"}],
    "daemon": {
        "socketDir": "/var/run/ry",
        "socketName": "daemon.sock",
        "adminSocketDir": "/var/run/ry-admin",
        "adminSocketName": "ctl.sock",
        "peerPort": 7500,
        "workerThreads": 8,
        "shutdownGraceSeconds": 30,
        "terminationMarginSeconds": 15,
        "logLevel": "debug",
        "algo": "hier",
        "extraArgs": ["--op_timeout=600s", "--init_timeout=5m"],
        "runAsUser": 1000,
    },
    "tokenKey": {"secretName": "ry-hmac-keys", "key": "hmac.hex"},
    "jobTokens": {"secretName": "railyard-job-tokens", "key": "tokens.txt"},
    "peerTls": {"secretName": "ry-peer-certs",
                "keys": {"cert": "peer.pem", "key": "peer-key.pem", "ca": "cluster-ca.pem"}},
    # 68719476736 (> 1e6): Helm would print a float64 value as 6.8719476736e+10.
    "quotas": {"max_sessions_per_job": 64, "max_buffer_bytes_per_job": 68719476736,
               "max_comms_per_session": "8"},
    "metrics": {"port": 9500, "serviceMonitor": {"labels": {"release": "kube-prometheus"}}},
    "resources": {"requests": {"cpu": "8", "memory": "1Gi"}, "limits": {"memory": "8Gi"}},
    "imagePullSecrets": [{"name": "regcred"}],
}


def _deployment(name: str):
    if name == "kubernetes":
        return dm.kustomization_objects()
    chart = helm_template.Chart(dm.CHART_DIR)
    if name == "helm-defaults":
        return chart.render_objects()
    return chart.render_objects(release="ry-prod", namespace="gpu-infra", values=CUSTOM_VALUES)


@pytest.fixture(params=["kubernetes", "helm-defaults", "helm-custom"])
def deployment(request):
    """(name, objects) of one way of deploying the daemon."""
    return request.param, _deployment(request.param)


@pytest.fixture(scope="session")
def flags():
    """(names railyardd accepts, their source)."""
    return dm.accepted_flags()


@pytest.fixture(scope="session")
def chart():
    return helm_template.Chart(dm.CHART_DIR)
