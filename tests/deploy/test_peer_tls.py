"""Mutual TLS of the peer service in every deployment: the DaemonSet passes --peer_tls_cert,
--peer_tls_key and --peer_tls_ca from a read-only mount of the peer certificate's Secret
(cert-manager's layout: tls.crt, tls.key, ca.crt), no manifest or default render passes the
plaintext --peer_insecure, the chart renders it only when asked, its cert-manager Certificate
and the example one (examples/peer-tls-certificate.yaml) issue the Secret the DaemonSet mounts
with the names the daemons check, and the systemd settings name the same three files."""

from __future__ import annotations

import ipaddress
import os
import re

import pytest

import deploy_model as dm
import helm_template
from conftest import CUSTOM_VALUES

PEER_TLS_DIR = "/etc/railyard/peer-tls"
TLS_FLAGS = ("peer_tls_cert", "peer_tls_key", "peer_tls_ca")
EXAMPLE = os.path.join(dm.KUBE_DIR, "examples", "peer-tls-certificate.yaml")

# What a Secret holds, per deployment: (secretName, {flag: key}).
EXPECTED_SECRET = {
    "kubernetes": ("railyard-peer-tls", {"peer_tls_cert": "tls.crt", "peer_tls_key": "tls.key",
                                         "peer_tls_ca": "ca.crt"}),
    "helm-defaults": ("railyard-peer-tls", {"peer_tls_cert": "tls.crt",
                                            "peer_tls_key": "tls.key", "peer_tls_ca": "ca.crt"}),
    "helm-custom": ("ry-peer-certs", {"peer_tls_cert": "peer.pem", "peer_tls_key": "peer-key.pem",
                                      "peer_tls_ca": "cluster-ca.pem"}),
}

# cert-manager.io/v1 Certificate: the spec fields these files may use, and the enums they use.
CERTIFICATE_SPEC_FIELDS = {"secretName", "issuerRef", "dnsNames", "ipAddresses", "duration",
                           "renewBefore", "privateKey", "usages", "isCA", "commonName",
                           "secretTemplate", "subject", "uris", "emailAddresses"}
KEY_USAGES = {"signing", "digital signature", "content commitment", "key encipherment",
              "key agreement", "data encipherment", "cert sign", "crl sign", "encipher only",
              "decipher only", "any", "server auth", "client auth", "code signing",
              "email protection", "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user",
              "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc"}
PRIVATE_KEY = {"algorithm": {"RSA", "ECDSA", "Ed25519"}, "encoding": {"PKCS1", "PKCS8"},
               "rotationPolicy": {"Never", "Always"}}
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"


def _daemon(objects):
    c = dm.daemon_container(objects)
    return c, dm.parse_args(c["args"]), dm.only(objects, "DaemonSet")["spec"]["template"]["spec"]


def _peer_tls_volume(objects):
    c, args, spec = _daemon(objects)
    mounts = {dm.mount_covering(c, args[f])["mountPath"] for f in TLS_FLAGS}
    assert len(mounts) == 1, f"the three TLS files come from one mount, not {mounts}"
    (mount_path,) = mounts
    return dm.volume_by_mount(spec, c, mount_path)


def check_certificate(cert, where):
    """A cert-manager.io/v1 Certificate a daemon can use as server and as client of the peer
    service, naming nodes by DNS name and IP address. Returns its spec."""
    assert cert["apiVersion"] == "cert-manager.io/v1" and cert["kind"] == "Certificate", where
    spec = cert["spec"]
    unknown = set(spec) - CERTIFICATE_SPEC_FIELDS
    assert not unknown, f"{where}: fields a Certificate does not have: {sorted(unknown)}"
    assert re.fullmatch(r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?", spec["secretName"]), where
    ref = spec["issuerRef"]
    assert ref["name"] and ref.get("kind", "Issuer") in ("Issuer", "ClusterIssuer"), where
    assert ref.get("group", "cert-manager.io") == "cert-manager.io", where
    duration = dm.duration_seconds(spec["duration"])
    assert dm.duration_seconds(spec["renewBefore"]) < duration and duration >= 3600, where
    for k, allowed in PRIVATE_KEY.items():
        if k in spec.get("privateKey", {}):
            assert spec["privateKey"][k] in allowed, f"{where}: privateKey.{k}"
    usages = spec.get("usages", [])
    assert set(usages) <= KEY_USAGES, f"{where}: usages {usages}"
    if not spec.get("isCA"):
        # A daemon serves its peer service and dials the others with the same certificate.
        assert {"server auth", "client auth"} <= set(usages), f"{where}: usages {usages}"
        assert spec["dnsNames"], f"{where}: no node names"
        for name in spec["dnsNames"]:
            # A node name, or a wildcard for exactly one label below a domain.
            assert re.fullmatch(rf"(\*\.)?{_DNS_LABEL}(\.{_DNS_LABEL})*", name), \
                f"{where}: dnsNames {name!r}"
            assert not name.startswith("*.") or "." in name[2:], f"{where}: {name!r} too wide"
        for ip in spec.get("ipAddresses", []):
            ipaddress.ip_address(ip)  # no wildcards or ranges: one address each
    return spec


# ---- the DaemonSet, every way of deploying it -----------------------------------------------

def test_daemonset_passes_the_tls_files_of_the_mounted_secret(deployment):
    name, objects = deployment
    c, args, spec = _daemon(objects)
    secret_name, keys = EXPECTED_SECRET[name]
    for flag, key in keys.items():
        assert args[flag] == f"{PEER_TLS_DIR}/{key}", f"{name}: --{flag}={args.get(flag)}"
    mount = dm.mount_covering(c, args["peer_tls_key"])
    assert mount["mountPath"] == PEER_TLS_DIR and mount["readOnly"] is True, f"{name}: {mount}"
    assert "subPath" not in mount, f"{name}: a subPath mount never sees a renewed Secret"
    vol = _peer_tls_volume(objects)
    assert set(vol) == {"name", "secret"}, f"{name}: peer TLS volume {vol}"
    secret = vol["secret"]
    assert secret["secretName"] == secret_name, f"{name}: {secret['secretName']}"
    # Exactly the three files the flags name, at those names, owner-readable only (the key is
    # the node's credential towards every other daemon).
    assert secret["items"] == [{"key": k, "path": k} for k in keys.values()], secret["items"]
    assert secret["defaultMode"] == 0o400, f"{name}: mode {oct(secret['defaultMode'])}"
    assert secret.get("optional", False) is False, "without the certificate: no start"
    # Only the daemon sees it (the init container mounts its three directories, no more).
    ds = dm.only(objects, "DaemonSet")
    users = [x["name"] for x in dm.containers(ds)
             if vol["name"] in {m["name"] for m in x.get("volumeMounts", [])}]
    assert users == ["railyardd"], f"{name}: {users}"
    # A non-root daemon reads the 0400 files by the pod's fsGroup.
    uid = c["securityContext"]["runAsUser"]
    if uid != 0:
        assert spec["securityContext"]["fsGroup"] == c["securityContext"]["runAsGroup"]


def test_peer_listen_comes_with_tls_not_plaintext(deployment):
    """The daemon refuses --peer_listen without TLS or --peer_insecure; the deployments choose
    TLS, all three files of it."""
    name, objects = deployment
    _, args, _ = _daemon(objects)
    assert "peer_listen" in args
    assert set(TLS_FLAGS) <= set(args), f"{name}: {sorted(set(TLS_FLAGS) - set(args))} missing"
    assert "peer_insecure" not in args, f"{name}: plaintext peer traffic"
    assert len({args[f] for f in TLS_FLAGS}) == 3, f"{name}: one file for two flags"


def test_no_deployment_file_passes_peer_insecure():
    """Plain text of the manifests (examples included), the systemd files and the Dockerfile,
    and every template the chart renders with its defaults (NOTES.txt included)."""
    roots = [dm.KUBE_DIR, os.path.join(dm.REPO, "deploy", "systemd"),
             os.path.join(dm.REPO, "deploy", "docker")]
    files = [os.path.join(r, f) for top in roots for r, _, fs in os.walk(top) for f in fs]
    assert EXAMPLE in files and len(files) >= 10
    for path in files:
        with open(path) as f:
            assert "peer_insecure" not in f.read(), path
    chart = helm_template.Chart(dm.CHART_DIR)
    for values in ({}, CUSTOM_VALUES):
        for template, text in chart.render(values=values).items():
            assert "peer_insecure" not in text and "PLAINTEXT" not in text, template


# ---- the chart ------------------------------------------------------------------------------

def test_chart_renders_peer_insecure_only_when_asked_and_loudly(chart):
    rendered = chart.render(values={"peerTls": {"insecure": True}})
    text = rendered["daemonset.yaml"]
    objs = chart.render_objects(values={"peerTls": {"insecure": True}})
    c, args, spec = _daemon(objs)
    assert args["peer_insecure"] == "true"
    assert not set(TLS_FLAGS) & set(args), "plaintext and certificates at once"
    assert PEER_TLS_DIR not in {m["mountPath"] for m in c["volumeMounts"]}
    assert "peer-tls" not in {v["name"] for v in spec["volumes"]}
    # The comment right above the flag, and the notes, say what it means.
    lines = text.splitlines()
    (at,) = [i for i, l in enumerate(lines) if l.strip() == "- --peer_insecure=true"]
    before = lines[at - 2:at]
    assert all(l.strip().startswith("#") for l in before) and "PLAINTEXT" in before[0], before
    assert "WARNING" in rendered["NOTES.txt"] and "PLAINTEXT" in rendered["NOTES.txt"]
    # Everything else is as without it.
    plain = [a for a in dm.daemon_container(chart.render_objects())["args"]
             if not a.startswith("--peer_tls_")]
    assert [a for a in c["args"] if a != "--peer_insecure=true"] == plain


def test_chart_defaults_render_no_certificate(chart):
    assert "Certificate" not in {o["kind"] for o in chart.render_objects()}
    assert "Certificate" not in {o["kind"] for o in chart.render_objects(values=CUSTOM_VALUES)}


CERT_MANAGER = {"enabled": True,
                "issuerRef": {"name": "cluster-ca", "kind": "ClusterIssuer"},
                "dnsNames": ["gpu-01.gpu.example.internal", "*.gpu.example.internal"],
                "ipAddresses": ["10.0.0.11", "10.0.0.12", "fd00::11"],
                "duration": "720h", "renewBefore": "240h"}


def test_chart_certificate_issues_the_mounted_secret_with_the_given_names(chart):
    values = {"peerTls": {"secretName": "ry-peer", "certManager": CERT_MANAGER}}
    objs = chart.render_objects(release="ry-prod", namespace="gpu-infra", values=values)
    cert = dm.only(objs, "Certificate")
    spec = check_certificate(cert, "chart")
    assert cert["metadata"]["name"] == "ry-prod-railyard-peer-tls"
    ds = dm.only(objs, "DaemonSet")
    assert cert["metadata"]["namespace"] == ds["metadata"]["namespace"] == "gpu-infra"
    assert spec["secretName"] == _peer_tls_volume(objs)["secret"]["secretName"] == "ry-peer"
    assert spec["dnsNames"] == CERT_MANAGER["dnsNames"]
    assert spec["ipAddresses"] == CERT_MANAGER["ipAddresses"]
    assert spec["issuerRef"] == {"name": "cluster-ca", "kind": "ClusterIssuer",
                                 "group": "cert-manager.io"}
    assert (spec["duration"], spec["renewBefore"]) == ("720h", "240h")
    # The Secret's keys are cert-manager's: the daemon reads them under those names.
    _, args, _ = _daemon(objs)
    assert [os.path.basename(args[f]) for f in TLS_FLAGS] == ["tls.crt", "tls.key", "ca.crt"]
    # Without IPs the field is left out rather than rendered empty.
    no_ips = dict(CERT_MANAGER, ipAddresses=[])
    spec = dm.only(chart.render_objects(values={"peerTls": {"certManager": no_ips}}),
                   "Certificate")["spec"]
    assert "ipAddresses" not in spec


def test_chart_host_path_gives_each_node_its_own_certificate(chart):
    objs = chart.render_objects(values={"peerTls": {"hostPath": "/etc/railyard/node-tls"}})
    c, args, _ = _daemon(objs)
    vol = _peer_tls_volume(objs)
    assert vol["hostPath"] == {"path": "/etc/railyard/node-tls", "type": "Directory"}
    assert dm.mount_covering(c, args["peer_tls_key"])["readOnly"] is True
    assert args["peer_tls_cert"] == f"{PEER_TLS_DIR}/tls.crt"
    assert "peer_insecure" not in args
    assert "from the directory /etc/railyard/node-tls" in chart.render(
        values={"peerTls": {"hostPath": "/etc/railyard/node-tls"}})["NOTES.txt"]


@pytest.mark.parametrize("values, message", [
    ({"daemon": {"extraArgs": ["--peer_insecure"]}}, "from peerTls"),
    ({"daemon": {"extraArgs": ["--peer_insecure=true"]}}, "from peerTls"),
    ({"daemon": {"extraArgs": ["--peer_tls_ca=/x"]}}, "from peerTls"),
    ({"peerTls": {"certManager": {"enabled": True}}}, "dnsNames: list every node"),
    ({"peerTls": {"certManager": dict(CERT_MANAGER, issuerRef={"name": ""})}}, "issuerRef.name"),
    ({"peerTls": {"insecure": True, "certManager": CERT_MANAGER}}, "would not use"),
    ({"peerTls": {"hostPath": "/etc/x", "certManager": CERT_MANAGER}}, "not the Secret"),
])
def test_chart_refuses_contradictory_peer_tls_values(chart, values, message):
    with pytest.raises(helm_template.ChartFailure, match=message):
        chart.render(values=values)


def test_notes_name_the_peer_tls_secret(chart):
    notes = chart.render(release="ry-prod", namespace="gpu-infra",
                         values=CUSTOM_VALUES)["NOTES.txt"]
    assert 'Secret gpu-infra/ry-peer-certs (keys "peer.pem", "peer-key.pem", ' \
        '"cluster-ca.pem")' in notes
    assert "read at start" in notes
    assert "WARNING" not in notes


# ---- the example Certificate ----------------------------------------------------------------

def _example():
    return dm.load_yaml_docs(EXAMPLE)


def test_example_certificate_issues_the_secret_the_daemonset_mounts():
    objects = _example()
    ds_objects = dm.kustomization_objects()
    ds = dm.only(ds_objects, "DaemonSet")
    mounted = _peer_tls_volume(ds_objects)["secret"]["secretName"]
    certs = [o for o in objects if o["kind"] == "Certificate"]
    leaf = [c for c in certs if c["spec"]["secretName"] == mounted]
    assert len(leaf) == 1, f"no Certificate of {EXAMPLE} writes Secret {mounted}"
    (leaf,) = leaf
    spec = check_certificate(leaf, "example")
    assert leaf["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert spec["ipAddresses"], "the daemons dial node IPs: the certificate needs IP addresses"
    # The chain: the leaf's Issuer is a CA issuer (which writes ca.crt into the Secret) whose
    # CA is a Certificate of this file, signed by a self-signed Issuer of this file.
    issuers = {(o["metadata"]["namespace"], o["metadata"]["name"]): o
               for o in objects if o["kind"] == "Issuer"}
    ns = leaf["metadata"]["namespace"]
    ca_issuer = issuers[(ns, spec["issuerRef"]["name"])]
    assert spec["issuerRef"].get("kind", "Issuer") == "Issuer"
    ca_cert = [c for c in certs if c["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]]
    assert len(ca_cert) == 1, "the CA issuer's Secret is issued by no Certificate of the file"
    ca_spec = check_certificate(ca_cert[0], "example CA")
    assert ca_spec["isCA"] is True and ca_cert[0]["metadata"]["namespace"] == ns
    # Renewing the CA must not change its key, or every daemon's ca.crt breaks at once.
    assert ca_spec["privateKey"]["rotationPolicy"] == "Never"
    assert dm.duration_seconds(ca_spec["duration"]) > dm.duration_seconds(spec["duration"])
    root = issuers[(ns, ca_spec["issuerRef"]["name"])]
    assert root["spec"] == {"selfSigned": {}}
    for o in objects:
        assert o["apiVersion"] == "cert-manager.io/v1", o["metadata"]["name"]
    # The chart's Certificate, rendered with the example's names, is the example's leaf.
    chart = helm_template.Chart(dm.CHART_DIR)
    cm = {"enabled": True, "dnsNames": spec["dnsNames"], "ipAddresses": spec["ipAddresses"],
          "issuerRef": spec["issuerRef"], "duration": spec["duration"],
          "renewBefore": spec["renewBefore"]}
    rendered = dm.only(chart.render_objects(values={"peerTls": {"certManager": cm}}),
                       "Certificate")
    assert rendered["metadata"]["name"] == leaf["metadata"]["name"]
    assert rendered["spec"] == spec, "the example and the chart issue different certificates"


def test_example_certificate_is_not_applied_with_the_daemonset():
    kust = dm.load_yaml_docs(os.path.join(dm.KUBE_DIR, "kustomization.yaml"))[0]
    assert not [r for r in kust["resources"] if "peer-tls" in r or r.startswith("examples/")]
    # But the DaemonSet's and the kustomization's comments point to it, by its path.
    for name in ("daemonset.yaml", "kustomization.yaml"):
        with open(os.path.join(dm.KUBE_DIR, name)) as f:
            assert "examples/peer-tls-certificate.yaml" in f.read(), name


# ---- systemd --------------------------------------------------------------------------------

def test_systemd_peer_settings_come_with_the_tls_files():
    from test_systemd import conf_vars, unit_sections

    examples = conf_vars(commented=True)
    assert "RAILYARD_PEER_LISTEN" in examples
    files = {f: examples.get(f"RAILYARD_{f.upper()}") for f in TLS_FLAGS}
    assert all(files.values()), f"commented peer TLS settings missing: {files}"
    config_dir = "/etc/" + unit_sections()["Service"]["ConfigurationDirectory"]
    for flag, path in files.items():
        # In the ConfigurationDirectory: readable under ProtectSystem=strict, owned by the unit.
        assert dm.path_within(path, config_dir) and path != config_dir, f"{flag}: {path}"
    assert [os.path.basename(files[f]) for f in TLS_FLAGS] == ["tls.crt", "tls.key", "ca.crt"]
    assert "RAILYARD_PEER_INSECURE" not in conf_vars() and "RAILYARD_PEER_INSECURE" not in examples
