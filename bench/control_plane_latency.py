#!/usr/bin/python3
"""How long railyardd takes to answer Admin.Status while its data plane is saturated and the
node's cores are contended: a control-plane latency benchmark (issue 55: "the control plane
never waits on the data plane").

For each --data_plane_nice value (launches interleaved, --repeat times): --daemons fresh daemons
on loopback (peers of each other), --jobs railyard-perf jobs with one rank on each daemon doing
back-to-back AllReduces of --size, --hogs busy-looping processes (tenants' data loaders), and
Status polled every 50 ms for --seconds on each daemon in turn.
Prints the latency percentiles per value. Needs RAILYARDD, RAILYARD_PERF (built binaries) and the
built Python client on PYTHONPATH.

  bench/control_plane_latency.py --nice 0,5 --repeat 3
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import grpc

from railyard.v1 import admin_pb2, admin_pb2_grpc


def run_once(nice, args):
    tmp = tempfile.mkdtemp(prefix="ry-cplat-")
    socks = [os.path.join(tmp, f"n{n}.sock") for n in range(args.daemons)]
    daemons = [subprocess.Popen(
        [os.environ["RAILYARDD"], f"--socket={sock}", "--insecure_first_session_token",
         f"--node_name=cplat{n}", f"--data_plane_nice={nice}", "--peer_listen=127.0.0.1:0",
         "--peer_insecure"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n, sock in enumerate(socks)]
    procs = []
    try:
        for sock in socks:
            for _ in range(100):
                if os.path.exists(sock + ".admin"):
                    break
                time.sleep(0.05)
        for j in range(args.jobs):
            procs.append(subprocess.Popen(
                [os.environ["RAILYARD_PERF"], "--daemons", ",".join(socks),
                 "--ranks-per-daemon", "1",
                 "-b", args.size, "-e", args.size, "-n", "1000000", "-w", "0", "-c", "0",
                 "--job", f"load{j}", "--token", "t", "--deadline_s", str(int(args.seconds) + 30)],
                stdout=open(os.path.join(tmp, f"job{j}.log"), "w"), stderr=subprocess.STDOUT))
        for _ in range(args.hogs):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        time.sleep(2)  # the jobs are running
        latencies = []
        channels = [grpc.insecure_channel("unix:" + sock + ".admin") for sock in socks]
        stubs = [admin_pb2_grpc.AdminStub(ch) for ch in channels]
        end = time.monotonic() + args.seconds
        i = 0
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                stubs[i % len(stubs)].Status(admin_pb2.StatusRequest(), timeout=10)
                latencies.append(time.monotonic() - t0)
            except grpc.RpcError:
                latencies.append(float("inf"))
            i += 1
            time.sleep(0.05)
        for ch in channels:
            ch.close()
        alive = [p.poll() is None for p in procs[:args.jobs]]
        if not all(alive):
            print(f"  (nice {nice}: {alive.count(False)} of {args.jobs} jobs ended early)")
            with open(os.path.join(tmp, f"job{alive.index(False)}.log")) as f:
                print("  " + "  ".join(f.readlines()[-3:]))
        return latencies
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        for d in daemons:
            d.terminate()
        for d in daemons:
            d.wait(20)
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nice", default="0,5")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--daemons", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--size", default="1M")
    ap.add_argument("--seconds", type=float, default=8)
    args = ap.parse_args()
    values = [int(v) for v in args.nice.split(",")]
    results = {v: [] for v in values}
    for r in range(args.repeat):
        for v in values:
            lat = sorted(run_once(v, args))
            results[v].append(lat)
            pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3
            print(f"run {r} nice {v}: {len(lat)} calls, p50 {pct(0.5):.1f} ms, "
                  f"p99 {pct(0.99):.1f} ms, max {lat[-1] * 1e3:.1f} ms", flush=True)
    for v in values:
        maxes = sorted(l[-1] * 1e3 for l in results[v])
        p99s = sorted(l[min(len(l) - 1, int(0.99 * len(l)))] * 1e3 for l in results[v])
        print(f"nice {v}: median of {args.repeat} runs: p99 {p99s[len(p99s) // 2]:.1f} ms, "
              f"max {maxes[len(maxes) // 2]:.1f} ms")


if __name__ == "__main__":
    main()
