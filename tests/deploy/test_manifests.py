"""Schema-level checks of the Kubernetes objects that deploy the daemon: deploy/kubernetes and
the Helm chart rendered with default and non-default values. Each test names the field it
guards; together they cover what breaks a deployment silently (probes on the wrong port, a
socket path the pods do not mount, a flag the daemon rejects, selectors that select nothing) and
what would break tenant isolation (a token key readable by others, the Admin socket within a
training pod's reach, a host /dev/shm shared between pods, the demo-only token mode)."""

from __future__ import annotations

import json
import os
import re

import pytest

import deploy_model as dm

NAMESPACED = {"DaemonSet", "ConfigMap", "Service", "ServiceMonitor", "Secret"}


def test_every_yaml_file_parses():
    paths = []
    for top in (dm.KUBE_DIR, dm.CHART_DIR):
        for root, _, files in os.walk(top):
            paths += [os.path.join(root, f) for f in files if f.endswith((".yaml", ".yml"))]
    templates = os.path.join(dm.CHART_DIR, "templates")
    checked = 0
    for p in sorted(paths):
        if p.startswith(templates):
            continue  # Go templates, not YAML: rendered and parsed by the deployment fixture
        dm.load_yaml_docs(p)
        checked += 1
    assert checked >= 9, f"only {checked} YAML files under deploy/"


def test_kustomization_lists_every_manifest():
    kust = dm.load_yaml_docs(os.path.join(dm.KUBE_DIR, "kustomization.yaml"))[0]
    listed = set(kust["resources"])
    present = {f for f in os.listdir(dm.KUBE_DIR)
               if f.endswith(".yaml") and f != "kustomization.yaml"}
    assert listed == present, f"listed {sorted(listed)} but the folder has {sorted(present)}"


def test_objects_are_well_formed(deployment):
    name, objects = deployment
    assert {o["kind"] for o in objects} >= {"DaemonSet", "ConfigMap", "Service", "ServiceMonitor"}
    seen = set()
    namespaces = set()
    for o in objects:
        assert o.get("apiVersion") and o.get("kind"), f"{name}: object without apiVersion/kind"
        key = (o["kind"], o["metadata"]["name"])
        assert key not in seen, f"{name}: {key} defined twice"
        seen.add(key)
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", o["metadata"]["name"]), key
        if o["kind"] in NAMESPACED:
            namespaces.add(o["metadata"].get("namespace"))
    assert len(namespaces) == 1 and None not in namespaces, f"{name}: namespaces {namespaces}"


def test_daemonset_pod_placement_and_host_namespaces(deployment):
    name, objects = deployment
    ds = dm.only(objects, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True, "the fabric needs hostNetwork"
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec.get("hostIPC", False) is False, "buffers are memfds passed over the socket"
    assert spec.get("hostPID", False) is False, "hostPID is only for CUDA IPC (not supported yet)"
    assert spec["nodeSelector"], "the daemon belongs on GPU nodes only"
    assert any(t.get("key") == "nvidia.com/gpu" for t in spec["tolerations"])
    assert spec.get("automountServiceAccountToken") is False, "the daemon never calls the API"
    assert not [o for o in objects if o["kind"] in ("Role", "ClusterRole", "RoleBinding",
                                                       "ClusterRoleBinding", "ServiceAccount")]
    assert ds["spec"]["updateStrategy"]["type"] in ("OnDelete", "RollingUpdate")


def test_rolling_updates_hand_each_node_over(deployment):
    # The new pod starts beside the old one and takes the node over (docs/restarts.md): a
    # surge of one and no unavailable node; the pods take over when a daemon serves, and the one
    # handed over idles (a container that exited would be restarted and take the node back).
    name, objects = deployment
    ds = dm.only(objects, "DaemonSet")
    strategy = ds["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate", name
    assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}, name
    args = dm.parse_args(dm.daemon_container(objects)["args"])
    assert args.get("takeover_if_serving") == "true", name
    assert args.get("after_handover") == "wait", name
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert "hostPath" in volumes["socket-dir"], "the handover socket lives beside the client socket"


def test_daemonset_selector_selects_its_pods(deployment):
    _, objects = deployment
    ds = dm.only(objects, "DaemonSet")
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector, "empty selector"
    assert dm.labels_match(selector, ds["spec"]["template"]["metadata"]["labels"])


def test_container_args_are_flags_railyardd_accepts(deployment, flags):
    name, objects = deployment
    accepted, source = flags
    c = dm.daemon_container(objects)
    args = dm.parse_args(c["args"])
    unknown = sorted(set(args) - accepted)
    assert not unknown, f"{name}: railyardd ({source}) does not accept --{', --'.join(unknown)}"
    # Kubernetes leaves $(VAR) unexpanded when VAR is not in the container's env: a daemon would
    # then try to listen on "$(NODE_IP):7470".
    declared = {e["name"] for e in c.get("env", [])}
    for value in args.values():
        for var in re.findall(r"\$\((\w+)\)", value):
            assert var in declared, f"{name}: $({var}) in the args but not in env"
    for e in c.get("env", []):
        if e["name"].startswith("RAILYARD_"):
            flag = e["name"][len("RAILYARD_"):].lower()
            assert flag in dm.env_settable_flags(), f"{name}: {e['name']} sets no flag"
    for key in ("shutdown_grace", "op_timeout", "init_timeout", "peer_timeout"):
        if key in args:
            dm.duration_seconds(args[key])
    assert int(args.get("worker_threads", "0")) >= 0


def test_probes_hit_healthz_and_readyz_on_the_metrics_listen_port(deployment):
    name, objects = deployment
    c = dm.daemon_container(objects)
    args = dm.parse_args(c["args"])
    assert "metrics_listen" in args, f"{name}: the daemon must serve /healthz and /readyz"
    host, port = dm.host_port(args["metrics_listen"])
    assert host == "$(NODE_IP)", f"{name}: metrics on {host}: the probes reach the node address"
    assert dm.named_port(c, "metrics") == port
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = c[probe]["httpGet"]
        assert get["path"] == path, f"{name}: {probe} on {get['path']}"
        assert dm.named_port(c, get["port"]) == port, f"{name}: {probe} port != metrics port"
        assert get.get("scheme", "HTTP") == "HTTP"
        assert c[probe]["timeoutSeconds"] <= c[probe]["periodSeconds"]


def test_peer_listen_is_reachable_by_other_nodes(deployment):
    name, objects = deployment
    c = dm.daemon_container(objects)
    host, port = dm.host_port(dm.parse_args(c["args"])["peer_listen"])
    # The host part becomes the coordinator address in comm ids other nodes dial.
    assert host == "$(NODE_IP)", f"{name}: --peer_listen host {host}"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert dm.named_port(c, "peer") == port


def test_graceful_termination_outlasts_shutdown_grace(deployment):
    name, objects = deployment
    ds = dm.only(objects, "DaemonSet")
    grace = dm.duration_seconds(dm.parse_args(dm.daemon_container(objects)["args"])
                                .get("shutdown_grace", "2s"))
    period = ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert period >= grace + 5, \
        f"{name}: SIGKILL after {period}s, shutdown takes {grace}s + teardown"


def test_every_mount_has_its_volume_and_every_volume_is_used(deployment):
    name, objects = deployment
    for obj in objects:
        spec = dm.pod_spec(obj)
        if spec is None:
            continue
        volumes = [v["name"] for v in spec.get("volumes", [])]
        assert len(volumes) == len(set(volumes)), f"{name}: duplicate volume names {volumes}"
        used = set()
        for c in dm.containers(obj):
            paths = [m["mountPath"] for m in c.get("volumeMounts", [])]
            assert len(paths) == len(set(paths)), f"{name}: {c['name']} mounts a path twice"
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, f"{name}: mount {m['mountPath']} -> no volume"
                used.add(m["name"])
        assert used == set(volumes), f"{name}: unused volumes {set(volumes) - used}"


def test_socket_directory_comes_from_the_host(deployment):
    name, objects = deployment
    ds = dm.only(objects, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    c = dm.daemon_container(objects)
    socket = dm.parse_args(c["args"])["socket"]
    mount = dm.mount_covering(c, socket)
    vol = dm.volume_by_mount(spec, c, mount["mountPath"])
    assert "hostPath" in vol, f"{name}: socket directory is not a hostPath"
    # The directory (not the socket file) is shared, at the same path on the host.
    assert vol["hostPath"]["path"] == mount["mountPath"] == os.path.dirname(socket)
    assert vol["hostPath"].get("type") == "DirectoryOrCreate"
    # The buffer side channel, <socket>.fd, is in the same shared directory.
    assert dm.mount_covering(c, socket + ".fd") == mount
    assert mount.get("readOnly", False) is False, f"{name}: the daemon creates its sockets there"


def _pods(objects):
    return [o for o in objects if dm.pod_spec(o) is not None]


@pytest.mark.parametrize("which", ["deployment", "example job"])
def test_no_railyard_pod_shares_dev_shm(which, deployment):
    """Buffers are memfds passed over the socket: no pod gets the host's /dev/shm (or a part of
    it), and none mounts a host directory at /dev/shm, through which tenants would see each
    other's segments."""
    name, objects = deployment
    pods = _pods(objects) if which == "deployment" else [dm.example_job()]
    assert pods
    for obj in pods:
        spec = dm.pod_spec(obj)
        assert spec.get("hostIPC", False) is False, f"{name}: {obj['metadata']['name']} hostIPC"
        for v in spec.get("volumes", []):
            if "hostPath" in v:
                host = v["hostPath"]["path"]
                assert not dm.path_within(host, "/dev/shm") and \
                    not dm.path_within("/dev/shm", host), \
                    f"{name}: {obj['metadata']['name']} volume {v['name']} is host {host}"
        for c in dm.containers(obj):
            for m in c.get("volumeMounts", []):
                if dm.path_within(m["mountPath"], "/dev/shm"):
                    vol = dm.volume_by_mount(spec, c, m["mountPath"])
                    assert "hostPath" not in vol, f"{name}: {c['name']} /dev/shm from the host"


def test_token_key_secret_is_mounted_read_only_for_the_daemon_alone(deployment):
    name, objects = deployment
    spec = dm.only(objects, "DaemonSet")["spec"]["template"]["spec"]
    c = dm.daemon_container(objects)
    args = dm.parse_args(c["args"])
    key_file = args["token_key_file"]
    mount = dm.mount_covering(c, key_file)
    assert mount["readOnly"] is True, f"{name}: token key mount {mount['mountPath']} writable"
    assert mount["mountPath"] == "/etc/railyard/token-key", f"{name}: {mount['mountPath']}"
    vol = dm.volume_by_mount(spec, c, mount["mountPath"])
    secret = vol["secret"]
    expected = {"kubernetes": ("railyard-token-key", "key"),
                "helm-defaults": ("railyard-token-key", "key"),
                "helm-custom": ("ry-hmac-keys", "hmac.hex")}[name]
    assert (secret["secretName"], os.path.relpath(key_file, mount["mountPath"])) == expected
    assert secret["defaultMode"] == 0o400, f"{name}: mode {oct(secret['defaultMode'])}"
    # Only the key the flag names is projected, at the file name the flag names.
    assert secret["items"] == [{"key": expected[1], "path": expected[1]}], secret["items"]
    assert "optional" not in secret or secret["optional"] is False, \
        "without the Secret the pod must not start (the daemon would refuse every Connect)"
    # No other container of the pod sees the key.
    for other in dm.containers(dm.only(objects, "DaemonSet")):
        if other is not c:
            assert vol["name"] not in {m["name"] for m in other.get("volumeMounts", [])}, \
                f"{name}: {other['name']} mounts the token key"
    # Files of mode 0400 are root's: a daemon of another UID reads them by fsGroup (0440 then).
    uid = c["securityContext"]["runAsUser"]
    if uid != 0:
        assert spec["securityContext"]["fsGroup"] == c["securityContext"]["runAsGroup"], \
            f"{name}: UID {uid} cannot read the token key"
    else:
        assert "fsGroup" not in spec.get("securityContext", {}), f"{name}: fsGroup for UID 0"


def test_job_token_file_alternative(deployment):
    name, objects = deployment
    c = dm.daemon_container(objects)
    args = dm.parse_args(c["args"])
    if name != "helm-custom":
        assert "job_tokens" not in args, f"{name}: static tokens are off by default"
        return
    spec = dm.only(objects, "DaemonSet")["spec"]["template"]["spec"]
    tokens = args["job_tokens"]
    mount = dm.mount_covering(c, tokens)
    vol = dm.volume_by_mount(spec, c, mount["mountPath"])
    assert vol["secret"]["secretName"] == "railyard-job-tokens"
    assert os.path.relpath(tokens, mount["mountPath"]) == "tokens.txt"
    assert vol["secret"]["items"] == [{"key": "tokens.txt", "path": "tokens.txt"}]
    assert vol["secret"]["defaultMode"] == 0o400 and mount["readOnly"] is True


def test_admin_socket_is_in_an_emptydir_of_the_daemon_pod_only(deployment):
    name, objects = deployment
    ds = dm.only(objects, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    c = dm.daemon_container(objects)
    args = dm.parse_args(c["args"])
    admin, socket = args["admin_socket"], args["socket"]
    expected = "/var/run/ry-admin/ctl.sock" if name == "helm-custom" \
        else "/run/railyard-admin/admin.sock"
    assert admin == expected, f"{name}: --admin_socket={admin}"
    admin_dir, socket_dir = os.path.dirname(admin), os.path.dirname(socket)
    assert not dm.path_within(admin_dir, socket_dir) and \
        not dm.path_within(socket_dir, admin_dir), \
        f"{name}: the Admin directory {admin_dir} and the client one {socket_dir} overlap"
    mount = dm.mount_covering(c, admin)
    assert mount["mountPath"] == admin_dir
    vol = dm.volume_by_mount(spec, c, admin_dir)
    # Per pod: no other pod (a training pod included) can mount an emptyDir of this one.
    assert set(vol) == {"name", "emptyDir"}, f"{name}: Admin directory volume {vol}"
    # Of the pod's containers only the daemon and the init container that gives it the
    # directory (and exits before the daemon starts) mount it.
    users = sorted(x["name"] for x in dm.containers(ds)
                   if vol["name"] in {m["name"] for m in x.get("volumeMounts", [])})
    assert users == ["host-dirs", "railyardd"], f"{name}: {users}"
    # No volume of the pod takes the Admin directory from the host, where pods could share it.
    for v in spec["volumes"]:
        if "hostPath" in v:
            assert not dm.path_within(admin_dir, v["hostPath"]["path"]), f"{name}: {v}"


@pytest.mark.parametrize("which", ["kubernetes", "helm-defaults"])
def test_training_pod_never_mounts_the_admin_directory(which, chart):
    objects = dm.kustomization_objects() if which == "kubernetes" else chart.render_objects()
    admin_dir = os.path.dirname(dm.parse_args(dm.daemon_container(objects)["args"])["admin_socket"])
    job = dm.example_job()
    spec = dm.pod_spec(job)
    for c in dm.containers(job):
        for m in c.get("volumeMounts", []):
            assert not dm.path_within(m["mountPath"], admin_dir) and \
                not dm.path_within(admin_dir, m["mountPath"]), f"{c['name']} mounts {m}"
    for v in spec["volumes"]:
        if "hostPath" in v:
            host = v["hostPath"]["path"]
            assert not dm.path_within(host, admin_dir) and not dm.path_within(admin_dir, host)


def test_no_demo_token_mode(deployment):
    """The first-session-sets-the-token mode lets whoever connects first own a job: never in a
    deployment, neither as an argument nor through the environment."""
    name, objects = deployment
    for obj in _pods(objects):
        for c in dm.containers(obj):
            words = list(c.get("command", [])) + list(c.get("args", []))
            assert not [w for w in words if "insecure" in w], f"{name}: {c['name']}: {words}"
            assert not [e for e in c.get("env", []) if "INSECURE" in e["name"].upper()]
    args = dm.parse_args(dm.daemon_container(objects)["args"])
    # And a token source is configured: without one the daemon refuses every Connect.
    assert "token_key_file" in args, f"{name}: no --token_key_file"


def test_no_deployment_file_names_the_demo_token_mode():
    """Plain text of the manifests, the systemd files, the Dockerfile and the chart's values and
    notes (the chart's templates are checked rendered, above, and refuse the flag in extraArgs)."""
    roots = [dm.KUBE_DIR, os.path.join(dm.REPO, "deploy", "systemd"),
             os.path.join(dm.REPO, "deploy", "docker")]
    files = [os.path.join(r, f) for top in roots for r, _, fs in os.walk(top) for f in fs]
    files += [os.path.join(dm.CHART_DIR, f) for f in ("values.yaml", "Chart.yaml")]
    files.append(os.path.join(dm.CHART_DIR, "templates", "NOTES.txt"))
    assert len(files) >= 10
    for path in files:
        with open(path) as f:
            text = f.read().lower()
        assert "insecure_first_session_token" not in text, path
        assert "insecure-first-session-token" not in text, path


def test_topology_configmap_is_a_valid_node_topology(deployment):
    name, objects = deployment
    from google.protobuf import json_format

    c = dm.daemon_container(objects)
    spec = dm.only(objects, "DaemonSet")["spec"]["template"]["spec"]
    path = dm.parse_args(c["args"])["topology"]
    mount = dm.mount_covering(c, path)
    vol = dm.volume_by_mount(spec, c, mount["mountPath"])
    cm = dm.find(objects, "ConfigMap", vol["configMap"]["name"])
    key = os.path.relpath(path, mount["mountPath"])
    assert key in cm["data"], f"{name}: ConfigMap {cm['metadata']['name']} has no key {key}"
    doc = json.loads(cm["data"][key])
    message = json_format.ParseDict(doc, dm.topology_message_class()())  # unknown fields: error
    assert message.node == "", f"{name}: a shared topology must not set 'node'"
    assert len(message.rails) >= 1 and all(r.device for r in message.rails)


def test_least_privilege_security_context(deployment):
    name, objects = deployment
    c = dm.daemon_container(objects)
    sc = c["securityContext"]
    assert sc.get("privileged", False) is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"].get("add", [])) <= {"IPC_LOCK"}, f"{name}: extra capabilities"
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    # Read-only root: anything the daemon or UCX writes must have a volume.
    assert dm.mount_covering(c, "/tmp/x")["mountPath"] == "/tmp"


def test_init_container_prepares_the_host_directories_for_the_daemon_uid(deployment):
    name, objects = deployment
    spec = dm.only(objects, "DaemonSet")["spec"]["template"]["spec"]
    daemon = dm.daemon_container(objects)
    (init,) = spec["initContainers"]
    assert init["image"] == daemon["image"], "one image to pull"
    uid = daemon["securityContext"]["runAsUser"]
    socket_dir = os.path.dirname(dm.parse_args(daemon["args"])["socket"])
    admin_dir = os.path.dirname(dm.parse_args(daemon["args"])["admin_socket"])
    state_dir = dm.parse_args(daemon["args"])["state_dir"]
    script = init["command"] + init["args"]
    assert script[:2] == ["/bin/sh", "-c"] and len(script) == 3
    steps = [s.strip() for s in script[2].split("&&")]
    # The Admin directory: the daemon's alone (an emptyDir starts as root's, mode 0777).
    assert steps == [f"chown {uid}:{uid} {socket_dir} {state_dir} {admin_dir}",
                     f"chmod 0755 {socket_dir}", f"chmod 0700 {admin_dir}"], f"{name}: {steps}"
    # It works on the very volumes the daemon mounts there.
    for path in (socket_dir, admin_dir, state_dir):
        assert (dm.volume_by_mount(spec, init, path) == dm.volume_by_mount(spec, daemon, path))
    # And on nothing else: it never sees the token key.
    assert {m["mountPath"] for m in init["volumeMounts"]} == {socket_dir, admin_dir, state_dir}
    sc = init["securityContext"]
    assert sc["runAsUser"] == 0 and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"]["add"]) <= {"CHOWN", "FOWNER"}
    assert init["resources"]["limits"]["memory"]


def test_resources_match_worker_threads(deployment):
    name, objects = deployment
    c = dm.daemon_container(objects)
    res = c["resources"]
    assert res["requests"]["memory"] and res["limits"]["memory"]
    cpu = res["requests"]["cpu"]
    cpus = float(cpu[:-1]) / 1000 if str(cpu).endswith("m") else float(cpu)
    threads = int(dm.parse_args(c["args"])["worker_threads"])
    # 0 means one thread per *host* CPU, which would oversubscribe the training processes.
    assert 0 < threads <= max(1, round(cpus)), f"{name}: {threads} threads on {cpu} CPUs"


def test_service_selects_the_daemon_pods_on_the_metrics_port(deployment):
    name, objects = deployment
    ds = dm.only(objects, "DaemonSet")
    svc = dm.only(objects, "Service")
    c = dm.daemon_container(objects)
    port = dm.host_port(dm.parse_args(c["args"])["metrics_listen"])[1]
    assert svc["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert svc["spec"]["clusterIP"] == "None", "headless: one endpoint per daemon"
    assert svc["spec"]["publishNotReadyAddresses"] is True, "scrape daemons that are not ready"
    assert svc["spec"]["selector"]
    assert dm.labels_match(svc["spec"]["selector"], ds["spec"]["template"]["metadata"]["labels"])
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["metrics"]["port"] == port
    assert dm.named_port(c, ports["metrics"]["targetPort"]) == port
    for annotated in (svc["metadata"], ds["spec"]["template"]["metadata"]):
        ann = annotated.get("annotations", {})
        assert ann.get("prometheus.io/scrape") == "true", f"{name}: scrape annotation"
        assert ann.get("prometheus.io/port") == str(port)
        assert ann.get("prometheus.io/path") == "/metrics"


def test_servicemonitor_selects_the_service(deployment):
    name, objects = deployment
    svc = dm.only(objects, "Service")
    sm = dm.only(objects, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert dm.labels_match(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
    assert svc["metadata"]["namespace"] in sm["spec"]["namespaceSelector"]["matchNames"]
    service_ports = {p["name"] for p in svc["spec"]["ports"]}
    for ep in sm["spec"]["endpoints"]:
        assert ep["port"] in service_ports, f"{name}: endpoint port {ep['port']}"
        assert ep["path"] == "/metrics"
        assert ep["honorLabels"] is True, "the daemon's own job label must survive the scrape"
        assert dm.duration_seconds(ep["scrapeTimeout"]) <= dm.duration_seconds(ep["interval"])


@pytest.mark.parametrize("which", ["kubernetes", "helm-defaults"])
def test_example_job_connects_to_the_daemon(which, chart):
    objects = dm.kustomization_objects() if which == "kubernetes" else chart.render_objects()
    ds = dm.only(objects, "DaemonSet")
    ds_spec = ds["spec"]["template"]["spec"]
    daemon = dm.daemon_container(objects)
    job = dm.example_job()
    job_spec = job["spec"]["template"]["spec"]
    trainer = job_spec["containers"][0]

    socket = dm.parse_args(daemon["args"])["socket"]
    assert dm.env_value(trainer, "RAILYARD_SOCKET") == socket
    # The pod's socket directory comes from the host directory the daemon's socket lives in.
    pod_mount = dm.mount_covering(trainer, socket)
    pod_vol = dm.volume_by_mount(job_spec, trainer, pod_mount["mountPath"])
    ds_vol = dm.volume_by_mount(ds_spec, daemon, dm.mount_covering(daemon, socket)["mountPath"])
    assert pod_vol["hostPath"]["path"] == ds_vol["hostPath"]["path"]
    assert pod_mount["mountPath"] == os.path.dirname(socket)
    assert pod_mount.get("readOnly") is True, "pods only connect; they need no write access"
    # The buffer side channel beside the socket comes with the same mount.
    assert dm.mount_covering(trainer, socket + ".fd") == pod_mount
    # And that is all the pod takes from the host.
    host_paths = [v["hostPath"]["path"] for v in job_spec["volumes"] if "hostPath" in v]
    assert host_paths == [ds_vol["hostPath"]["path"]], host_paths
    # The pod lands only where a daemon runs.
    assert dm.labels_match(ds_spec["nodeSelector"], job_spec["nodeSelector"])
    for t in job_spec.get("tolerations", []):
        assert t in ds_spec["tolerations"], f"the job tolerates {t} where no daemon runs"
    assert any(e["name"] == "RAILYARD_JOB" for e in trainer["env"])
    # The same UID as the daemon (the sockets are 0660), set explicitly: the images' own USER
    # differs (deploy/docker/Dockerfile).
    uid = daemon["securityContext"]["runAsUser"]
    assert trainer["securityContext"]["runAsUser"] == uid


def test_example_job_reads_its_token_from_its_secret():
    objects = dm.example_objects()
    job = dm.example_job()
    trainer = dm.pod_spec(job)["containers"][0]
    ref = dm.env_entry(trainer, "RAILYARD_TOKEN")["valueFrom"]["secretKeyRef"]
    assert ref.get("optional", False) is False, "no token: the pod must not start"
    secret = dm.find(objects, "Secret", ref["name"])
    assert ref["name"] == "railyard-allreduce-example-token"
    assert ref["key"] == "token" and set(secret["stringData"]) == {"token"}
    assert "data" not in secret
    # Applied unchanged, the placeholder must not pass for a token (none lives in the repository).
    placeholder = secret["stringData"]["token"]
    assert not re.match(r"ryt1\.", placeholder), placeholder
    # The job id the pods present is the Job's name; the documented mint command issues the token
    # for exactly that id, and the documented substitution replaces exactly the placeholder.
    job_id = dm.env_entry(trainer, "RAILYARD_JOB")["valueFrom"]["fieldRef"]["fieldPath"]
    assert job_id == "metadata.labels['job-name']"
    with open(dm.EXAMPLE_JOB) as f:
        text = f.read()
    name = job["metadata"]["name"]
    issue = re.findall(r"railctl token issue --job (\S+) --ttl (\S+) --key (\S+)", text)
    assert issue and all(j == name for j, _, _ in issue), (issue, name)
    for _, ttl, _ in issue:
        dm.duration_seconds(ttl)
    assert f's|{placeholder}|$TOKEN|' in text
    # The token reaches the daemon with the socket and the job id, and no other secret does.
    env_names = [e["name"] for e in trainer["env"]]
    assert {"RAILYARD_SOCKET", "RAILYARD_JOB", "RAILYARD_TOKEN"} <= set(env_names)
    assert [e["name"] for e in trainer["env"] if "secretKeyRef" in e.get("valueFrom", {})] == \
        ["RAILYARD_TOKEN"]
    assert secret["metadata"].get("namespace") == job["metadata"].get("namespace")


def test_example_job_runs_the_repository_example():
    job = dm.example_job()
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    script = trainer["command"][-1]
    prefix = "/opt/railyard/"
    assert script.startswith(prefix)
    assert os.path.isfile(os.path.join(dm.REPO, script[len(prefix):])), script
    assert dm.env_value(trainer, "PYTHONPATH") == "/opt/railyard/python"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] > 0
