"""The cost model against live daemons: railctl calibrate fits finite, positive link classes
whose predictions are within 25 % of what it measured, and stores them; a communicator created
afterwards tunes with that calibration, and the algorithm `railctl explain` names for an
operation is the one the daemons ran (read back from their /metrics).

Run by CTest (cost_model_test) with RAILYARDD, RAILCTL, RAILYARD_PERF and PYTHONPATH (the
build's python package) in the environment.
"""

import json
import math
import os
import re
import subprocess
import sys
import tempfile

import pytest

from virtual_nodes import http_get, start_daemon, stop, wait_for

RAILS = 2
RANKS_PER_NODE = 2
# The calibration's ranks inherit it: they submit over gRPC. Over the session rings (4 ranks on
# 2 daemons of 2 rails, 2 vCPUs) the 256 KiB point measures 0.6 or 1.0 ms from one sweep to the
# next, spinning or not (an open problem, in the fast path's issue), which no alpha-beta fit
# follows; over gRPC every sweep fits within 25 %. This test checks the fit and its storage.
os.environ["RAILYARD_FASTPATH"] = "0"
SMALL, LARGE = 2, 2 << 20  # float32 elements: 8 B and 8 MiB


def run_railctl(*args, timeout=300, env=None):
    return subprocess.run([os.environ["RAILCTL"], *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def railctl(*args, timeout=300):
    out = run_railctl(*args, timeout=timeout)
    assert out.returncode == 0, f"railctl {' '.join(args)}: {out.stderr}"
    return out.stdout


@pytest.fixture(scope="module")
def cluster():
    tmp = tempfile.mkdtemp(prefix="ry-cost-")
    procs, daemons = [], []
    try:
        for n in range(2):
            name = f"cnode{n}"
            state = os.path.join(tmp, f"{name}-state")
            proc, sock, addr = start_daemon(tmp, name, RAILS, [f"--state_dir={state}"])
            procs.append(proc)
            daemons.append({"name": name, "socket": sock, "state": state, "metrics": addr})
        yield {"tmp": tmp, "daemons": daemons}
    finally:
        for p in procs:
            stop(p)


def test_calibrate_fits_and_stores(cluster):
    sockets = ",".join(d["socket"] for d in cluster["daemons"])
    # Loopback on a shared 2-core VM is noisy (ctest runs another test beside this one): a sweep
    # disturbed by another process is measured again (the fit must hold on one of three sweeps of
    # 16 timed iterations per size).
    # A sweep that the fit cannot follow at all (time not growing with size: a stall at a small
    # size) fails with FAILED_PRECONDITION naming the fit; that too is measured again, and only
    # that failure: any other error fails the test at once.
    fit = None
    for attempt in range(3):
        out = run_railctl("calibrate", "--daemons", sockets, "--ranks-per-daemon",
                          str(RANKS_PER_NODE), "-b", "64K", "-e", "4M", "-f", "4", "-n", "16",
                          "-w", "2", "--sweeps", "3", "--json")
        if out.returncode != 0:
            assert "FAILED_PRECONDITION" in out.stderr and " fit " in out.stderr, out.stderr
            print(f"calibration attempt {attempt}: {out.stderr.strip()}, again")
            continue
        fit = json.loads(out.stdout)
        if fit["max_error"] <= 0.25:
            break
        print(f"calibration attempt {attempt}: worst error {fit['max_error']:.2f}, again")
    assert fit is not None, "every calibration sweep failed to fit"
    print(json.dumps(fit, indent=1))
    for cls in ("intra", "inter"):
        assert math.isfinite(fit[cls]["alpha_s"]) and fit[cls]["alpha_s"] >= 0
        assert math.isfinite(fit[cls]["beta_bytes_per_s"]) and fit[cls]["beta_bytes_per_s"] > 0
    # The fixed cost per operation: over gRPC Submit it fitted at 170-360 us; the session rings
    # leave so little that the fit may put all of it in the inter-node alpha (it did: 0 here).
    assert math.isfinite(fit["op_overhead_s"]) and fit["op_overhead_s"] >= 0
    assert fit["inter"]["alpha_s"] > 0
    assert len(fit["sizes"]) == 4  # 64K, 256K, 1M, 4M
    for s in fit["sizes"]:
        assert s["measured_s"] > 0 and s["predicted_s"] > 0
        assert abs(s["predicted_s"] - s["measured_s"]) <= 0.25 * s["measured_s"], s
    assert fit["algorithm"] == "ring" and fit["op"] == "allreduce"
    # Stored on both daemons, as the fit says.
    assert len(fit["stored"]) == 2
    for d in cluster["daemons"]:
        with open(os.path.join(d["state"], "calibration.json")) as f:
            stored = json.load(f)
        assert stored["source"] == "fit"
        assert stored["inter"]["beta_bytes_per_s"] == pytest.approx(
            fit["inter"]["beta_bytes_per_s"], rel=1e-9)
        assert stored["nranks"] == 4 and stored["nnodes"] == 2
    cluster["fit"] = fit


def test_calibrate_refuses_zero_sweeps(cluster):
    sockets = ",".join(d["socket"] for d in cluster["daemons"])
    out = run_railctl("calibrate", "--daemons", sockets, "--sweeps", "0", "--dry-run")
    assert out.returncode == 1
    assert "INVALID_ARGUMENT: --sweeps must be an integer >= 1 (got '0')" in out.stderr


def test_calibrate_one_rank_per_daemon_fits_the_overhead(cluster):
    # One rank per daemon: no intra-node sweep measures the per-operation overhead, so it is
    # fitted with the inter-node figures. Held at the built-in 300 us instead, it once left only
    # the 1 MiB and 4 MiB points to fit, and the "fit" predicted 300 us at every size (rms error
    # ~190 %), with a bandwidth of ~10^24 B/s, and was stored.
    sockets = ",".join(d["socket"] for d in cluster["daemons"])
    # Over the session rings, not the module's gRPC fallback: through gRPC a 64 KiB operation
    # here costs 530-910 us, mostly the fixed cost of Submit, so the measured 4 MiB / 64 KiB
    # ratio itself was 2.7-4.9 over 12 runs and the check below failed on true fits. Over the
    # rings (one rank per daemon, unlike the 4-rank sweeps the module comment is about) 64 KiB
    # measured 84-236 us, the ratio 6.6-21 and the fit's rms error 0.12-0.19 in 4 runs.
    rings = dict(os.environ, RAILYARD_FASTPATH="1")
    fit = None
    for attempt in range(3):
        out = run_railctl("calibrate", "--daemons", sockets, "--ranks-per-daemon", "1", "-b",
                          "64K", "-e", "4M", "-f", "4", "-n", "16", "-w", "2", "--sweeps", "3",
                          "--dry-run", "--json", env=rings)
        if out.returncode == 0:
            fit = json.loads(out.stdout)
            break
        assert "FAILED_PRECONDITION" in out.stderr and " fit " in out.stderr, out.stderr
        print(f"calibration attempt {attempt}: {out.stderr.strip()}, again")
    assert fit is not None, "every one-rank calibration sweep failed to fit"
    print(json.dumps(fit, indent=1))
    assert fit["rms_error"] <= 0.5  # --max-error's default; over it nothing is printed as OK
    assert math.isfinite(fit["op_overhead_s"]) and fit["op_overhead_s"] >= 0
    assert 0 <= fit["inter"]["alpha_s"] < 0.01
    # Between 100 MB/s and 1 TB/s: loopback TCP, not an artefact of a degenerate fit.
    assert 1e8 < fit["inter"]["beta_bytes_per_s"] < 1e12, fit["inter"]
    sizes = fit["sizes"]
    assert [s["bytes"] for s in sizes] == [65536, 262144, 1048576, 4194304]
    # The prediction follows the size (the degenerate fit predicted one time for every size):
    # it grows with every step, and 64x the bytes costs over 3x the time.
    predicted = [s["predicted_s"] for s in sizes]
    assert all(a < b for a, b in zip(predicted, predicted[1:])), sizes
    assert predicted[-1] > 3 * predicted[0], sizes
    assert fit["stored"] == []  # --dry-run


def test_calibrate_refuses_to_store_a_fit_over_max_error(cluster):
    sockets = ",".join(d["socket"] for d in cluster["daemons"])
    paths = [os.path.join(d["state"], "calibration.json") for d in cluster["daemons"]]
    before = [open(p).read() if os.path.exists(p) else None for p in paths]
    # No real sweep fits within 0 %: the fit is printed and refused. (A sweep so disturbed that
    # no fit exists fails earlier, as in the tests above, and is measured again.)
    for attempt in range(3):
        out = run_railctl("calibrate", "--daemons", sockets, "--ranks-per-daemon", "1", "-b",
                          "64K", "-e", "4M", "-f", "4", "-n", "8", "-w", "1", "--sweeps", "1",
                          "--max-error", "0")
        assert out.returncode == 1, out.stdout
        if "the fit misses" in out.stderr:
            break
        assert "FAILED_PRECONDITION" in out.stderr and " fit " in out.stderr, out.stderr
        print(f"calibration attempt {attempt}: {out.stderr.strip()}, again")
    assert "FAILED_PRECONDITION: the fit misses the measured times by" in out.stderr, out.stderr
    assert "over --max-error 0: not stored" in out.stderr, out.stderr
    assert "not stored (rms error over --max-error)" in out.stdout, out.stdout
    assert re.search(r"^1\.049 MB\s", out.stdout, re.M), out.stdout  # the table is printed
    # Neither daemon's calibration changed.
    assert [open(p).read() if os.path.exists(p) else None for p in paths] == before


def test_calibrate_refuses_one_daemon_with_one_rank(cluster):
    # Nothing to measure: it once "fitted" 0 sizes and stored the built-in defaults as a fit.
    d = cluster["daemons"][0]
    path = os.path.join(d["state"], "calibration.json")
    before = open(path).read() if os.path.exists(path) else None
    out = run_railctl("calibrate", "--daemons", d["socket"], "--ranks-per-daemon", "1")
    assert out.returncode == 1
    assert ("INVALID_ARGUMENT: one daemon with one rank has no link to measure" in out.stderr), \
        out.stderr
    assert (open(path).read() if os.path.exists(path) else None) == before


@pytest.mark.parametrize("names, message", [
    (",", "--daemons ',' names no daemon socket"),
    ("", "--daemons '' names no daemon socket"),
    ("{0},{0}", "--daemons names {0} twice: one socket per node"),
])
def test_calibrate_refuses_bad_daemon_lists(cluster, names, message):
    sock = cluster["daemons"][0]["socket"]
    out = run_railctl("calibrate", f"--daemons={names.format(sock)}", "--dry-run")
    assert out.returncode == 1, out.stdout
    assert f"INVALID_ARGUMENT: {message.format(sock)}" in out.stderr, out.stderr


@pytest.mark.parametrize("bad", ["-0.1", "x", "nan", "inf", "0.5x", ""])
def test_calibrate_refuses_bad_max_error(cluster, bad):
    sockets = ",".join(d["socket"] for d in cluster["daemons"])
    out = run_railctl("calibrate", "--daemons", sockets, f"--max-error={bad}", "--dry-run")
    assert out.returncode == 1
    assert (f"INVALID_ARGUMENT: --max-error must be a fraction >= 0, such as 0.5 for 50 % "
            f"(got '{bad}')") in out.stderr, out.stderr


def metric_algorithms(addr, op, size):
    """Algorithms of the collective series for `op` whose power-of-4 size bucket holds size."""
    text = http_get(f"http://{addr}/metrics")[1]
    found = {}
    for m in re.finditer(r'^railyard_collective_ops_total\{([^}]*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        bucket = int(labels["size_bucket"])
        if labels["op"] == op and bucket <= size < max(4 * bucket, 1):
            found[labels["algorithm"]] = float(m.group(2))
    return found


def test_explain_names_what_ran(cluster):
    daemons = cluster["daemons"]
    ready = tempfile.mkdtemp(dir=cluster["tmp"], prefix="ready-")
    go = os.path.join(ready, "go")
    env = dict(os.environ, SIZES=f"{SMALL},{LARGE}", READY_DIR=ready, GO=go)
    env.pop("RAILYARD_ALGO", None)
    launcher = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, railyard.launch; sys.exit(railyard.launch.launch("
         f"[sys.executable, {os.path.join(os.path.dirname(__file__), 'cost_model_ranks.py')!r}],"
         f" {2 * RANKS_PER_NODE}, nodes=2, daemons={[d['socket'] for d in daemons]!r},"
         " timeout=120))"], env=env)
    try:
        wait_for("the ranks to run their AllReduces",
                 lambda: len([f for f in os.listdir(ready) if f.startswith("ready.")]) == 4
                 or launcher.poll() is not None, 90)
        assert launcher.poll() is None, "the rank processes failed"
        for count in (SMALL, LARGE):
            size = count * 4
            answers = [json.loads(railctl("explain", "allreduce", str(size), "--socket",
                                          d["socket"], "--json")) for d in daemons]
            a = answers[0]
            # Both daemons of the comm would pick the same algorithm and chunk size.
            assert [x["chosen"] for x in answers] == [a["chosen"]] * 2, answers
            assert [x["chunk_bytes"] for x in answers] == [a["chunk_bytes"]] * 2
            assert a["nranks"] == 4 and a["nnodes"] == 2 and a["rails"] == RAILS
            # The choice is the cheapest executable candidate by its prediction.
            runnable = [c for c in a["candidates"] if c["generator"]]
            best = min(runnable, key=lambda c: c.get("ir_s", c.get("closed_form_s", 1e300)))
            assert best["generator"] == a["chosen"], a
            # It tunes with the calibration stored above.
            if "fit" in cluster:
                assert a["calibration"]["source"] == "fit"
                assert a["calibration"]["inter_beta_bytes_per_s"] == pytest.approx(
                    cluster["fit"]["inter"]["beta_bytes_per_s"], rel=1e-9)
            # ... and it is what the daemons ran.
            for d in daemons:
                ran = metric_algorithms(d["metrics"], "allreduce", size)
                assert a["chosen"] in ran, (size, a["chosen"], ran, a["reason"])
            print(f"allreduce {size} B: {a['chosen']} ({a['reason']})")
        # Latency-bound 8 B: a logarithmic-depth schedule; bandwidth-bound 8 MiB: not a tree.
        small = json.loads(railctl("explain", "allreduce", "8", "--socket", daemons[0]["socket"],
                                   "--json"))
        large = json.loads(railctl("explain", "allreduce", str(LARGE * 4), "--socket",
                                   daemons[0]["socket"], "--json"))
        assert small["chosen"] in ("tree", "rhd", "rd"), small["reason"]
        assert large["chosen"] in ("hier", "ring", "rhd"), large["reason"]
        # Bad input: a clear error, and the daemon keeps serving.
        bad = subprocess.run([os.environ["RAILCTL"], "explain", "allreduce", "8", "--comm",
                              "no-such-comm", "--socket", daemons[0]["socket"]],
                             capture_output=True, text=True, timeout=30)
        assert bad.returncode == 1 and "no communicator no-such-comm" in bad.stderr, bad.stderr
        bad = subprocess.run([os.environ["RAILCTL"], "explain", "sendrecv", "8", "--socket",
                              daemons[0]["socket"]], capture_output=True, text=True, timeout=30)
        assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr, bad.stderr
    finally:
        open(go, "w").close()
        try:
            assert launcher.wait(timeout=60) == 0
        finally:
            if launcher.poll() is None:
                stop(launcher)


def test_set_calibration_rejects_bad_figures(cluster):
    # Through the daemon's validation: a calibration file with a zero bandwidth is refused at
    # start (defaults used); SetCalibration is exercised by railctl calibrate above. Here: the
    # model CLI's own validation of what operators type.
    bad = subprocess.run([os.environ["RAILCTL"], "model", "allreduce", "--nranks", "4",
                          "--size", "1MB", "--alpha", "5us", "--beta", "0GB/s"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "bandwidth" in bad.stderr
