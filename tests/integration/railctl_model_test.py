"""`railctl model` and `railctl simulate` as operators run them: every worked example of
PRIMER.md through the binary's --json output (within 1 %), the simulator's JSON on the example
fabrics, and clear one-line errors for bad input.

Run by CTest (railctl_model_test) with RAILCTL and EXAMPLE_TOPOLOGIES in the environment.
"""

import json
import os
import subprocess

import pytest

TOPOLOGIES = os.environ.get("EXAMPLE_TOPOLOGIES", "")


def railctl(*args):
    out = subprocess.run([os.environ["RAILCTL"], *args], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, f"railctl {' '.join(args)}: {out.stderr}"
    return json.loads(out.stdout)


def fails(*args):
    out = subprocess.run([os.environ["RAILCTL"], *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and out.stdout == "", (args, out.stdout)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    return out.stderr


def algos(result):
    return {a["name"]: a for a in result["algorithms"]}


def within(got, want, rel=0.01):
    assert got == pytest.approx(want, rel=rel), (got, want)


def test_ring_vs_tree_64_ranks():
    r = railctl("model", "allreduce", "--nranks", "64", "--size", "1MB", "--alpha", "10us",
                "--beta", "10GB/s", "--json")
    assert r["op"] == "allreduce" and r["nranks"] == 64 and r["size_bytes"] == 1e6
    a = algos(r)
    within(a["ring"]["latency_s"], 1260e-6)
    within(a["ring"]["bandwidth_s"], 196.9e-6)
    within(a["ring"]["time_s"], 1456.9e-6)
    within(a["tree"]["time_s"], 1320e-6)
    assert a["tree"]["time_s"] < a["ring"]["time_s"]  # "tree wins by 9 %"
    assert r["chosen"] in a
    # The schedule IR of the ring is the closed form here (flat, N divides M).
    within(a["ring"]["ir_time_s"], a["ring"]["time_s"], rel=0.02)


def test_ring_vs_tree_256_ranks_one_gigabyte():
    a = algos(railctl("model", "allreduce", "--nranks", "256", "--size", "1GB", "--alpha", "5us",
                      "--beta", "50GB/s", "--json", "--ir-budget", "0"))
    within(a["ring"]["time_s"], 42.4e-3)
    within(a["tree"]["time_s"], 320.1e-3)


def test_seventy_billion_parameters():
    a = algos(railctl("model", "allreduce", "--nranks", "64", "--size", "140GB", "--alpha",
                      "1.5us", "--beta", "50GB/s", "--algo", "ring", "--json", "--ir-budget", "0"))
    assert list(a) == ["ring"]
    within(a["ring"]["bandwidth_s"], 5512.5e-3)
    within(a["ring"]["latency_s"], 0.189e-3)


def test_hierarchical_eight_by_eight():
    # A smaller IR budget than the default keeps this fast in the sanitizer build too.
    r = railctl("model", "allreduce", "--nranks", "64", "--ranks-per-node", "8", "--size", "1GB",
                "--alpha", "3us", "--beta", "50GB/s", "--beta-intra", "450GB/s", "--json",
                "--ir-budget", "100000")
    a = algos(r)
    assert r["rails"] == 8  # one NIC per local rank by default
    within(a["hier"]["time_s"], 8.3e-3)
    within(a["ring"]["time_s"], 40e-3)
    within(a["ring"]["time_s"] / a["hier"]["time_s"], 4.8)
    assert r["chosen"] in ("hier", "rhd")


def test_crossovers_and_critical_sizes():
    c = railctl("model", "crossover", "--nranks", "64", "--alpha", "10us", "--beta", "10GB/s",
                "--json")
    assert set(c) == {"exact_bytes", "log_estimate_bytes", "rough_bytes"}
    assert round(c["log_estimate_bytes"] / 1e5) / 10 == 1.1  # "~ 1.1 MB"
    within(c["exact_bytes"], 1e5 * 57 / (6 - 63 / 64))
    within(c["rough_bytes"], 6.4e6)
    c = railctl("model", "crossover", "--nranks", "100", "--alpha", "5us", "--beta", "50GB/s",
                "--json")
    within(c["log_estimate_bytes"], 3.8e6)
    within(railctl("model", "critical-size", "--alpha", "2us", "--beta", "50GB/s", "--json")
           ["bytes"], 100e3)
    within(railctl("model", "critical-size", "--alpha", "5us", "--beta", "400Gbit/s", "--json")
           ["bytes"], 250e3)


def test_moe_alltoall_ingress_bound():
    # 8 ranks, 512 tokens x 4096 B each: 2 MiB sent per rank in total (1/8 of it to itself).
    r = railctl("model", "alltoall", "--nranks", "8", "--size", str(512 * 4096), "--alpha", "3us",
                "--beta", "50GB/s", "--json")
    within(r["bounds"]["per_transfer_s"], 8.24e-6)  # "one transfer ~ 8 us"
    within(r["bounds"]["lower_bound_s"], 39.7e-6)


def test_torus_and_in_network():
    a = algos(railctl("model", "allreduce", "--torus", "8x16", "--size", "1GB", "--alpha", "1us",
                      "--beta", "100GB/s", "--in-network", "--json", "--ir-budget", "100000"))
    within(a["torus"]["latency_s"], 2 * (7 + 15) * 1e-6)
    within(a["torus"]["bandwidth_s"], 2 * 127 / 128 * 1e9 / 100e9)
    within(a["innetwork"]["time_s"], 2e-6 + 1e9 / 100e9)
    # Chunked, the dimensions' phases overlap: the best IR prediction beats the closed form.
    assert a["torus"]["ir_time_s"] <= a["torus"]["time_s"] * 1.02
    # Unchunked, the simulated dimension-ordered rings are the closed form (within 2 %).
    r = railctl("simulate", "--torus", "8x16", "--op", "allreduce", "--size", "1GB", "--alpha",
                "1us", "--beta", "100GB/s", "--algo", "torus", "--json")
    within(r["time_s"], r["closed_form_s"], rel=0.02)
    assert {t["tier"] for t in r["tiers"] if t["bytes"] > 0} == {"torus"}


@pytest.mark.skipif(not TOPOLOGIES, reason="EXAMPLE_TOPOLOGIES not set")
def test_simulate_json_on_example_fabrics():
    r = railctl("simulate", "--topology", os.path.join(TOPOLOGIES, "rail_optimized_16x8.json"),
                "--op", "allreduce", "--size", "1GB", "--algo", "hier", "--json")
    assert set(r) >= {"time_s", "algorithm", "tiers", "busiest_link", "jobs"}
    assert r["algorithm"] == "hier"
    tiers = {t["tier"]: t["bytes"] for t in r["tiers"]}
    # hier: every rank puts 2 (K-1)/K * M/G on its NIC: 128 x 2 x 15/16 x 125 MB.
    within(tiers["nic"], 128 * 2 * 15 / 16 * 125e6, rel=0.001)
    assert r["busiest_link"]["tier"] == "nic"
    within(r["time_s"], r["closed_form_s"], rel=0.02)
    # 2:1 oversubscribed spines slow an AllToAll that crosses racks.
    flat = railctl("simulate", "--topology",
                   os.path.join(TOPOLOGIES, "rail_optimized_16x8.json"), "--op", "alltoall",
                   "--size", "64MB", "--algo", "direct", "--json")
    over = railctl("simulate", "--topology", os.path.join(TOPOLOGIES, "three_tier_16x8.json"),
                   "--op", "alltoall", "--size", "64MB", "--algo", "direct", "--json")
    assert over["time_s"] > 1.3 * flat["time_s"], (over["time_s"], flat["time_s"])
    assert over["busiest_link"]["tier"] == "spine"


def test_bad_input_is_one_clear_line():
    assert "unknown unit 'parsec'" in fails("model", "allreduce", "--nranks", "8", "--size",
                                            "1parsec", "--alpha", "1us", "--beta", "1GB/s")
    assert "--beta" in fails("model", "allreduce", "--nranks", "8", "--size", "1MB", "--alpha",
                             "1us")
    assert "not a multiple" in fails("model", "allreduce", "--nranks", "10", "--ranks-per-node",
                                     "4", "--size", "1MB", "--alpha", "1us", "--beta", "1GB/s")
    assert "unknown op" in fails("model", "allsum", "--nranks", "8", "--size", "1MB", "--alpha",
                                 "1us", "--beta", "1GB/s")
    assert "--torus" in fails("model", "allreduce", "--torus", "4x", "--size", "1MB", "--alpha",
                              "1us", "--beta", "1GB/s")
    assert "budget" in fails("simulate", "--nranks", "8192", "--alpha", "1us", "--beta",
                             "1GB/s", "--op", "allreduce", "--size", "1GB", "--algo", "ring")


def test_cpu_terms_and_chunk_sizes():
    """--message-cpu and --reduce-bw price the busiest rank's CPU on top of the simulator (the
    daemons take them from their calibration); --chunks sets the sizes tried. Two nodes,
    512 KiB: each term moves the choice the way the daemon's measurements did
    (docs/data-plane.md, "Chunk size across daemons")."""
    base = ["model", "allreduce", "--nranks", "2", "--size", "512KiB", "--alpha", "10us",
            "--beta", "3GB/s", "--overhead", "5us", "--chunks", "64KiB,128KiB,256KiB", "--json"]

    def pick(*extra):
        r = railctl(*base, *extra)
        chosen = algos(r)[r["chosen"]]
        return r["chosen"], chosen["chunk_bytes"], chosen["cpu_s"], algos(r)

    # Unpriced: the tree pipelined in 128 KiB chunks, nothing added.
    name, chunk, cpu, _ = pick()
    assert (name, chunk, cpu) == ("dbtree", 128 << 10, 0), (name, chunk, cpu)
    # 5 us per message at each end: fewer, larger chunks, and recursive doubling (one step).
    name, chunk, cpu, a = pick("--message-cpu", "5us")
    assert (name, chunk) == ("rd", 256 << 10), (name, chunk)
    # dbtree's busiest rank on two nodes in 256 KiB chunks: 2 messages sent, 2 received.
    _, _, _, a = pick("--message-cpu", "5us", "--chunks", "256KiB")
    within(a["dbtree"]["cpu_s"], 4 * 5e-6)
    # Reductions priced: recursive doubling reduces all 512 KiB on each rank, the tree half.
    _, _, _, a = pick("--reduce-bw", "2GB/s")
    within(a["rd"]["cpu_s"], (512 << 10) / 2e9)
    within(a["dbtree"]["cpu_s"], (256 << 10) / 2e9)
    # Both (the daemons' defaults): the tree in 256 KiB chunks, what measured fastest.
    name, chunk, cpu, _ = pick("--message-cpu", "5us", "--reduce-bw", "8GB/s")
    assert (name, chunk) == ("dbtree", 256 << 10), (name, chunk)
    within(cpu, 4 * 5e-6 + (256 << 10) / 8e9)
    # The same terms in railctl simulate's choice: unpriced rd, priced the tree.
    sim = ["simulate", "--nranks", "2", "--alpha", "10us", "--beta", "3GB/s", "--overhead",
           "5us", "--op", "allreduce", "--size", "512KiB", "--json"]
    assert railctl(*sim)["algorithm"] == "rd"
    priced = railctl(*sim, "--message-cpu", "5us", "--reduce-bw", "8GB/s")
    assert priced["algorithm"] == "tree", priced["jobs"][0]["why"]
    # Bad values: one clear line each.
    assert "--message-cpu" in fails(*base[:-1], "--message-cpu", "fast")
    assert "--reduce-bw" in fails(*base[:-1], "--reduce-bw", "-1GB/s")
    assert "--chunks: bad size 'x'" in fails(*base[:-3], "--chunks", "64KiB,x")
    assert "--message-cpu" in fails("simulate", "--nranks", "2", "--alpha", "1us", "--beta",
                                    "1GB/s", "--op", "allreduce", "--size", "1MB",
                                    "--message-cpu", "1parsec")


@pytest.mark.skipif(not TOPOLOGIES, reason="EXAMPLE_TOPOLOGIES not set")
def test_jobs_sharing_a_fabric(tmp_path):
    fabric = os.path.join(TOPOLOGIES, "three_tier_16x8.json")
    jobs = os.path.join(TOPOLOGIES, os.pardir, "jobs", "shared_fabric_16x8.json")
    shared = {j["name"]: j for j in railctl("simulate", "--topology", fabric, "--jobs", jobs,
                                            "--json")["jobs"]}
    assert set(shared) == {"llm-a", "llm-b", "moe"}
    solo = tmp_path / "solo.json"
    solo.write_text(json.dumps({"jobs": [{"name": "llm-a", "op": "allreduce", "size": "1GB",
                                          "algo": "hier", "nodes": list(range(8))}]}))
    alone = railctl("simulate", "--topology", fabric, "--jobs", str(solo), "--json")["jobs"][0]
    # The MoE job's ranks share llm-a's NICs (rails 0 and 1): llm-a slows down; llm-b, on the
    # other 8 nodes, is slowed by the same MoE traffic there, symmetrically.
    assert shared["llm-a"]["time_s"] > 1.5 * alone["time_s"]
    within(shared["llm-a"]["time_s"], shared["llm-b"]["time_s"], rel=0.02)
