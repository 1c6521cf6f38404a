"""Metrics against the real tools: two virtual-node railyardd (2 rails on lo each) run
railyard-perf AllReduce (ring, then hierarchical rail-aligned); a real Prometheus scrapes them.
Asserts, through Prometheus' HTTP query API, that every link's byte counters equal what the
schedules must move (the symbolic executor's per-link counts of the same Generate()d schedules,
times the collectives the daemons counted), that the hierarchical run is rail-aligned, that
`promtool check metrics` accepts /metrics, and that every PromQL target of
deploy/grafana/railyard.json returns data.

Run by CTest (metrics_prometheus_test) with the binaries in the environment:
RAILYARDD, RAILYARD_PERF, METRICS_LINK_ORACLE. Every wait is bounded; every process started here
is stopped by its PID.
"""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import urllib.parse

import pytest

from virtual_nodes import http_get, start_daemon, stop, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "railyard.json")
MSG_BYTES = 1 << 20  # the AllReduce size of the perf runs (float32)
RANKS_PER_NODE = 2
RAILS = 2
WARMUP, ITERS, CHECK = 2, 4, 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """Two daemons, one Prometheus, and what the perf runs did."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []
        self.daemons = []  # (node name, socket, metrics address)
        self.prom_url = None

    def start_daemons(self):
        for n in range(2):
            name = f"mnode{n}"
            # Paced far above what loopback carries: the rails' fair queues (and their per-job
            # series) are in the path without holding anything back.
            proc, sock, addr = start_daemon(self.tmp, name, RAILS, pace="100GB/s")
            self.procs.append(proc)
            self.daemons.append((name, sock, addr))
        for _, _, addr in self.daemons:
            assert http_get(f"http://{addr}/healthz")[0] == 200
            assert http_get(f"http://{addr}/readyz")[0] == 200

    def start_prometheus(self):
        port = free_port()
        cfg = os.path.join(self.tmp, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "scrape_configs:\n  - job_name: railyard\n    honor_labels: true\n"
                    "    static_configs:\n      - targets: [%s]\n"
                    % ", ".join(f'"{a}"' for _, _, a in self.daemons))
        log = open(os.path.join(self.tmp, "prometheus.log"), "w")
        self.procs.append(subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={self.tmp}/tsdb",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT))
        self.prom_url = f"http://127.0.0.1:{port}"

        def ready():
            try:
                return http_get(self.prom_url + "/-/ready")[0] == 200
            except OSError:
                return False
        wait_for("prometheus to be ready", ready, 30)

    def perf(self, algo):
        env = dict(os.environ, RAILYARD_ALGO=algo)
        out = subprocess.run(
            [os.environ["RAILYARD_PERF"], "--op", "allreduce", "-b", str(MSG_BYTES), "-e",
             str(MSG_BYTES), "-n", str(ITERS), "-w", str(WARMUP), "-c", str(CHECK), "--daemons",
             ",".join(s for _, s, _ in self.daemons), "--ranks-per-daemon", str(RANKS_PER_NODE),
             "--deadline_s", "60"],
            env=env, capture_output=True, text=True, timeout=90)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def query(self, promql):
        url = self.prom_url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        status, body = http_get(url)
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", (promql, body)
        return data["data"]["result"]

    def direct_metrics(self, addr):
        return http_get(f"http://{addr}/metrics")[1]

    def wait_scraped(self):
        """Until Prometheus holds the daemons' current counters (no collective is running)."""
        def direct_total():
            total = 0
            for _, _, addr in self.daemons:
                for line in self.direct_metrics(addr).splitlines():
                    if line.startswith("railyard_link_bytes_total{"):
                        total += float(line.rsplit(" ", 1)[1])
            return total
        want = direct_total()

        def caught_up():
            r = self.query("sum(railyard_link_bytes_total)")
            return r and float(r[0]["value"][1]) == want
        wait_for(f"prometheus to scrape link bytes = {want}", caught_up, 20)

    def stop_all(self):
        for p in reversed(self.procs):
            stop(p)


@pytest.fixture(scope="module")
def cluster():
    for tool in ("RAILYARDD", "RAILYARD_PERF", "METRICS_LINK_ORACLE"):
        assert tool in os.environ, f"{tool} not set (run through ctest)"
    if not os.path.exists(PROMETHEUS):
        pytest.skip("prometheus is not installed (Debian package prometheus)")
    tmp = tempfile.mkdtemp(prefix="railyard-metrics-")
    c = Cluster(tmp)
    try:
        c.start_daemons()
        c.start_prometheus()
        c.perf("ring")
        c.wait_scraped()
        c.ring_links = {k: v for k, v in link_bytes(c).items()}
        c.ring_ops = collective_ops(c)
        c.perf("hier")
        c.wait_scraped()
        yield c
    finally:
        c.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


def link_bytes(c):
    """(node, peer, rail, direction) -> bytes, from Prometheus."""
    out = {}
    for s in c.query("railyard_link_bytes_total"):
        m = s["metric"]
        out[(m["node"], m["peer"], m["rail"], m["direction"])] = int(float(s["value"][1]))
    return out


def collective_ops(c):
    """(node, op, algorithm, size_bucket) -> collectives completed, from Prometheus."""
    out = {}
    for s in c.query("railyard_collective_ops_total"):
        m = s["metric"]
        node = c.query('railyard_build_info{instance="%s"}' % s["metric"]["instance"])[0]
        out[(node["metric"]["node"], m["op"], m["algorithm"], m["size_bucket"])] = \
            int(float(s["value"][1]))
    return out


def oracle(op, algo, count, dtype):
    out = subprocess.run(
        [os.environ["METRICS_LINK_ORACLE"], op, algo, "2", str(RANKS_PER_NODE), str(RAILS),
         str(count), dtype], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# What railyard-perf issues per size: warm-up, then per mode (out of place, in place) a barrier,
# the timed and the checked AllReduces, and two 16-byte AllReduces gathering the results.
SHAPES = {("allreduce", "1048576"): (MSG_BYTES // 4, "float32"),
          ("allreduce", "16"): (2, "float64"),
          ("barrier", "0"): (0, "float32")}


DIGEST_BYTES = 80  # an agreeing digest summary (daemon/comm/digest_summary.h)


def expected_links(ops, names):
    """Per-link bytes the counted collectives must have moved, and each algorithm's oracle."""
    want = {}
    oracles = {}
    node0 = {k: v for k, v in ops.items() if k[0] == names[0]}
    for (_, op, algo, bucket), n in node0.items():
        assert (op, bucket) in SHAPES, f"unexpected collective {op} size bucket {bucket}"
        count, dtype = SHAPES[(op, bucket)]
        o = oracle(op, algo, count, dtype)
        oracles[(op, algo, bucket)] = o
        for link in o["links"]:
            src, dst, rail = names[link["src"]], names[link["dst"]], f"rail{link['rail']}"
            for key in ((src, dst, rail, "tx"), (dst, src, rail, "rx")):
                want[key] = want.get(key, 0) + n * link["bytes"]
        # Beside its schedule, each daemon sends the other its operation digest on rail0
        # (daemon/comm/digest_exchange.h: with two nodes, one message each way).
        for src, dst in ((names[0], names[1]), (names[1], names[0])):
            for key in ((src, dst, "rail0", "tx"), (dst, src, "rail0", "rx")):
                want[key] = want.get(key, 0) + n * DIGEST_BYTES
    return want, oracles


def test_per_link_bytes_equal_what_the_schedules_move(cluster):
    names = [n for n, _, _ in cluster.daemons]
    ops = collective_ops(cluster)
    # Both daemons saw every collective; perf issued exactly this many 1 MiB AllReduces per run.
    for algo in ("ring", "hier"):
        for node in names:
            assert ops[(node, "allreduce", algo, "1048576")] == WARMUP + 2 * (ITERS + CHECK), ops
    assert {k[1:]: v for k, v in ops.items() if k[0] == names[0]} == \
        {k[1:]: v for k, v in ops.items() if k[0] == names[1]}
    want, oracles = expected_links(ops, names)
    got = link_bytes(cluster)
    print("per-link bytes (node, peer, rail, direction): expected / observed")
    for key in sorted(set(want) | set(got)):
        print(f"  {key}: {want.get(key, 0)} / {got.get(key, 0)}")
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in want.items() if v}
    # Ring AllReduce: each rank sends 2(N-1)/N * M per operation; with 2 nodes x 2 ranks the
    # ring crosses between the nodes twice (once each way), each carrying 2(N-1)/N * M.
    ring = oracles[("allreduce", "ring", "1048576")]
    nranks = 2 * RANKS_PER_NODE
    assert sum(l["bytes"] for l in ring["links"]) == 2 * 2 * (nranks - 1) * MSG_BYTES // nranks


def test_hier_run_is_rail_aligned(cluster):
    names = [n for n, _, _ in cluster.daemons]
    ops = collective_ops(cluster)
    hier_ops = {k: v - cluster.ring_ops.get(k, 0) for k, v in ops.items()}
    hier_ops = {k: v for k, v in hier_ops.items() if v}
    want, oracles = expected_links(hier_ops, names)
    got = {k: v - cluster.ring_links.get(k, 0) for k, v in link_bytes(cluster).items()}
    print("hier run per-link bytes: expected / observed")
    for key in sorted(set(want) | set(got)):
        print(f"  {key}: {want.get(key, 0)} / {got.get(key, 0)}")
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in want.items() if v}
    hier = oracles[("allreduce", "hier", "1048576")]
    ring = oracles[("allreduce", "ring", "1048576")] if ("allreduce", "ring", "1048576") in \
        oracles else oracle("allreduce", "ring", MSG_BYTES // 4, "float32")
    # Every byte of the hierarchical run arrives at a rank on the rail it travelled on (the ring
    # is the counter-example), and both rails carry shard traffic in equal measure.
    assert hier["cross_rail_bytes"] == 0
    assert ring["cross_rail_bytes"] > 0
    per_rail = {}
    for (node, peer, rail, d), v in got.items():
        if d == "tx":
            per_rail[rail] = per_rail.get(rail, 0) + v
    # Less the operation digests, which travel on rail0 (one each way per collective).
    digests = 2 * DIGEST_BYTES * sum(v for k, v in hier_ops.items() if k[0] == names[0])
    assert per_rail["rail0"] - digests == per_rail["rail1"] > 0, (per_rail, digests)


def test_promtool_accepts_metrics(cluster):
    if not os.path.exists(PROMTOOL):
        pytest.skip("promtool is not installed (Debian package prometheus)")
    for name, _, addr in cluster.daemons:
        text = cluster.direct_metrics(addr)
        out = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, f"{name}: {out.stdout}{out.stderr}"
        assert 'railyard_build_info{node="%s"' % name in text


def dashboard_targets():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    panels = []
    for p in dash["panels"]:
        panels.append(p)
        panels.extend(p.get("panels", []))
    for p in panels:
        for t in p.get("targets", []):
            yield p["title"], t["refId"], t["expr"]


def concrete(expr):
    for var, value in (("$__rate_interval", "1m"), ("$__interval", "15s"), ("$__range", "5m"),
                       ("${node}", ".*"), ("$node", ".*"), ("${job}", ".*"), ("$job", ".*")):
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def test_every_dashboard_query_returns_data(cluster):
    targets = list(dashboard_targets())
    assert len(targets) >= 15
    empty = []
    for title, ref, expr in targets:
        if not cluster.query(concrete(expr)):
            empty.append(f"{title} / {ref}: {expr}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
    # The busbw-vs-model panel's prediction comes from the tuner of every multi-node comm.
    assert any("railyard_collective_model_seconds" in e for _, _, e in targets)
