// The fabric simulator against the PRIMER closed forms (uncontended cases within 2%), the
// contention it must show (shared NICs, G > R, oversubscribed spines, concurrent jobs), the
// symbolic executor's byte counts, and its input errors.
#include <cmath>
#include <string>
#include <vector>

#include "daemon/scheduler/schedule.h"
#include "daemon/scheduler/sim/jobs_file.h"
#include "daemon/scheduler/sim/simulator.h"
#include "daemon/scheduler/symbolic_executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard::scheduler::sim {
namespace {

using ::testing::HasSubstr;
using topology::FabricKind;
using topology::FabricSpec;

constexpr double kIntraAlpha = 0.5e-6, kIntraBeta = 450e9;

FabricSpec Fabric(FabricKind kind, int k, int g, int r, double alpha, double beta) {
  FabricSpec f;
  f.kind = kind;
  f.nodes = k;
  f.ranks_per_node = g;
  f.rails = r;
  f.intra = {kIntraAlpha, kIntraBeta};
  f.inter = {alpha, beta};
  return f;
}

JobSpec Job(OpKind op, const std::string& algo, double bytes, int nranks) {
  JobSpec j;
  j.name = algo;
  j.algorithm = algo;
  j.shape.op = op;
  j.shape.dtype = kernels::DataType::kFloat32;
  j.shape.count = CountForBytes(op, bytes, nranks);
  return j;
}

double SimTime(const FabricSpec& f, const std::vector<JobSpec>& jobs, SimResult* out = nullptr) {
  absl::StatusOr<SimResult> r = Simulate(f, jobs);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return 0;
  if (out != nullptr) *out = *r;
  return r->time_s;
}

void ExpectNear2(double got, double want, const std::string& what) {
  EXPECT_NEAR(got, want, 0.02 * want)
      << what << ": got " << got * 1e3 << " ms, want " << want * 1e3 << " ms";
}

uint64_t TierBytes(const std::vector<TierStats>& tiers, const std::string& name) {
  for (const TierStats& t : tiers) {
    if (t.tier == name) return t.bytes;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Closed forms, uncontended

TEST(SimClosedForm, RingAllReduceFlat) {
  const double alpha = 5e-6, beta = 50e9, m = 64e6;
  for (int n : {8, 16, 64}) {
    const FabricSpec f = Fabric(FabricKind::kFlat, n, 1, 1, alpha, beta);
    const double t = SimTime(f, {Job(OpKind::kAllReduce, "ring", m, n)});
    ExpectNear2(t, 2 * (n - 1) * (alpha + m / (n * beta)), "ring N=" + std::to_string(n));
  }
}

TEST(SimClosedForm, RhdAllReducePowerOfTwo) {
  const double alpha = 5e-6, beta = 50e9, m = 64e6;
  for (int n : {8, 16, 32}) {
    const FabricSpec f = Fabric(FabricKind::kFlat, n, 1, 1, alpha, beta);
    const double t = SimTime(f, {Job(OpKind::kAllReduce, "rhd", m, n)});
    ExpectNear2(t, 2 * std::log2(n) * alpha + 2.0 * (n - 1) / n * m / beta,
                "rhd N=" + std::to_string(n));
  }
}

// PRIMER section 3: K = 8, G = 8, M = 1 GB, intra 450 GB/s, inter 50 GB/s 3 us, 8 rails.
// hier's intra ReduceScatter is a direct reduce chain into each shard owner (G-1 dependent steps
// of M/G on distinct ports: (G-1)(alpha_i + M/(G beta_i))); its AllGather copies from the owner
// to the G-1 others at once, sharing the owner's egress: alpha_i + (G-1)/G M/beta_i. The inter
// ring AllReduce of the M/G shard: 2(K-1)(alpha + M/(G K beta)). ~8.3 ms as PRIMER says.
TEST(SimClosedForm, HierPrimerEightByEight) {
  const int k = 8, g = 8;
  const double alpha = 3e-6, beta = 50e9, m = 1e9;
  const FabricSpec f = Fabric(FabricKind::kRailOptimized, k, g, 8, alpha, beta);
  SimResult r;
  const double t = SimTime(f, {Job(OpKind::kAllReduce, "hier", m, k * g)}, &r);
  const double rs = (g - 1) * (kIntraAlpha + m / g / kIntraBeta);
  const double ar = 2 * (k - 1) * (alpha + m / (g * k) / beta);
  const double ag = kIntraAlpha + (g - 1.0) / g * m / kIntraBeta;
  ExpectNear2(t, rs + ar + ag, "hier 8x8");
  EXPECT_NEAR(t, 8.3e-3, 0.05e-3);
  // PRIMER: only M/G * 2(K-1)/K per rank crosses the network.
  EXPECT_EQ(TierBytes(r.tiers, "nic"), static_cast<uint64_t>(k * g * 2.0 * (k - 1) / k * m / g));
  // Versus a flat ring bounded by the inter-node hop: ~40 ms, 4.8x.
  const double ring = SimTime(f, {Job(OpKind::kAllReduce, "ring", m, k * g)});
  EXPECT_NEAR(ring / t, 4.8, 0.15);
}

// PRIMER section 4: 8 ranks, 262,144 B to each of 7 peers, alpha 3 us, beta 50 GB/s; the
// ingress lower bound is alpha + 7 x 262,144 B / beta ~ 39.7 us. The direct schedule's pairwise
// exchange must be right in place, so for every pair i < j the block j -> i is written over the
// send bytes i -> j still reads: it waits for i -> j (a WAR dependency in the IR). The exchange
// therefore runs as two waves, each at the ingress bound: 2 (alpha + 7 x 262,144 B / beta).
TEST(SimClosedForm, DirectAllToAllIngressBound) {
  const int n = 8;
  const double alpha = 3e-6, beta = 50e9, block = 262144;
  const FabricSpec f = Fabric(FabricKind::kFlat, n, 1, 1, alpha, beta);
  const double t = SimTime(f, {Job(OpKind::kAllToAll, "direct", block * n, n)});
  ExpectNear2(t, 2 * (alpha + (n - 1) * block / beta), "alltoall");
  EXPECT_NEAR(t / 2, 39.7e-6, 0.2e-6);
}

TEST(SimClosedForm, TorusAllReduce) {
  const double alpha = 2e-6, beta = 50e9, m = 96e6;
  for (const std::vector<int>& dims : {std::vector<int>{4, 4}, std::vector<int>{3, 4, 2}}) {
    FabricSpec f = Fabric(FabricKind::kTorus, 0, 1, 1, alpha, beta);
    f.torus_dims = dims;
    int n = 1, steps = 0;
    for (int d : dims) {
      n *= d;
      steps += 2 * (d - 1);
    }
    f.nodes = n;
    SimResult r;
    const double t = SimTime(f, {Job(OpKind::kAllReduce, "torus", m, n)}, &r);
    ExpectNear2(t, steps * alpha + 2.0 * (n - 1) / n * m / beta, "torus");
    // Every transfer is one hop: torus bytes are what the ranks send.
    EXPECT_EQ(TierBytes(r.tiers, "torus"), static_cast<uint64_t>(2.0 * (n - 1) * m));
    EXPECT_EQ(r.busiest_link.tier, "torus");
    EXPECT_THAT(r.busiest_link.name, HasSubstr("torus ("));
  }
}

TEST(SimClosedForm, InNetworkReduction) {
  const int n = 16;
  const double alpha = 3e-6, beta = 50e9, m = 256e6;
  FabricSpec f = Fabric(FabricKind::kTwoTier, n, 1, 1, alpha, beta);
  f.in_network_reduction = true;
  SimResult r;
  const double t = SimTime(f, {Job(OpKind::kAllReduce, "innetwork", m, n)}, &r);
  ExpectNear2(t, 2 * alpha + m / beta, "innetwork");
  EXPECT_EQ(TierBytes(r.tiers, "nic"), static_cast<uint64_t>(2 * n * m));
  f.in_network_reduction = false;
  auto bad = Simulate(f, {Job(OpKind::kAllReduce, "innetwork", m, n)});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("in_network_reduction"));
}

// ---------------------------------------------------------------------------------------------
// Pipelining: the messages of one (sender, receiver) pair are delivered in posting order, and a
// queued message's alpha overlaps the bytes of the one before it.

// A pipelined chain (ring Broadcast: chunk c of hop p waits only for chunk c of hop p - 1) of C
// chunks over H hops: (H + C - 1) chunk/beta + H alpha, as NCCL-style pipelining achieves.
// (The equal-share model this replaces ran the root's C chunks, all ready at t = 0, side by side
// on its NIC: H M/beta, no pipelining at all.)
TEST(SimPipelining, ChainBroadcast) {
  struct Case {
    int n;
    double alpha, beta, m, chunk;
  };
  for (const Case& c : {Case{4, 0, 10e9, 4 << 20, 1 << 20}, Case{8, 5e-6, 25e9, 64 << 20, 4 << 20},
                        Case{16, 10e-6, 10e9, 16 << 20, 1 << 20}}) {
    const FabricSpec f = Fabric(FabricKind::kFlat, c.n, 1, 1, c.alpha, c.beta);
    JobSpec j = Job(OpKind::kBroadcast, "ring", c.m, c.n);
    const double hops = c.n - 1, chunks = c.m / c.chunk;
    const double unchunked = SimTime(f, {j});
    ExpectNear2(unchunked, hops * (c.alpha + c.m / c.beta), "unchunked chain");
    j.chunk_bytes = static_cast<size_t>(c.chunk);
    ExpectNear2(SimTime(f, {j}), (hops + chunks - 1) * c.chunk / c.beta + hops * c.alpha,
                "chain n=" + std::to_string(c.n));
  }
}

// Chunking a bandwidth-bound ring AllReduce costs at most the extra alphas, and never beats the
// bandwidth bound. Here it costs nothing: while alpha <= (C - 1) chunk/beta each chunk's alpha
// runs behind the previous chunk's bytes, so every link stays busy from the first alpha on:
// alpha + 2 (N-1)/N M/beta (unchunked: 2 (N-1) (alpha + M/(N beta))).
TEST(SimPipelining, ChunkedRingAllReduce) {
  const int n = 8;
  const double alpha = 5e-6, beta = 50e9, m = 64e6;
  const FabricSpec f = Fabric(FabricKind::kFlat, n, 1, 1, alpha, beta);
  JobSpec j = Job(OpKind::kAllReduce, "ring", m, n);
  const double unchunked = SimTime(f, {j});
  ExpectNear2(unchunked, 2 * (n - 1) * (alpha + m / (n * beta)), "unchunked");
  for (size_t chunk : {size_t{1} << 20, size_t{256} << 10}) {
    j.chunk_bytes = chunk;
    const double chunks = std::ceil(m / n / static_cast<double>(chunk));
    const double t = SimTime(f, {j});
    EXPECT_LE(t, unchunked + 2 * (n - 1) * (chunks - 1) * alpha) << chunk;
    EXPECT_GE(t, 2.0 * (n - 1) / n * m / beta) << chunk;
    ExpectNear2(t, alpha + 2.0 * (n - 1) / n * m / beta, "chunk " + std::to_string(chunk));
  }
}

// Messages to different receivers share the sender's link equally; messages to the same receiver
// queue: the first is delivered after n/beta, not after 2n/beta.
TEST(SimPipelining, SamePairQueuesOtherPairsShare) {
  const double alpha = 4e-6, beta = 10e9, n = 1e6;
  const CommLayout l = CommLayout::Uniform(3, 1, 1);
  const FabricSpec f = Fabric(FabricKind::kFlat, 3, 1, 1, alpha, beta);
  const auto transfer = [&](int src, int dst, std::vector<uint32_t> deps) {
    Transfer t;
    t.src.rank = src;
    t.dst.rank = dst;
    t.dst.space = RankRef::Space::kRecv;
    t.bytes = static_cast<uint64_t>(n);
    t.deps.assign(deps.begin(), deps.end());
    return t;
  };
  RankSchedule same;
  same.algorithm = "same pair";
  // 0 -> 1 twice, then 1 forwards the first: it can start as soon as the first arrived.
  same.transfers = {transfer(0, 1, {}), transfer(0, 1, {}), transfer(1, 2, {0})};
  auto r = SimulateSchedule(same, l, f);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectNear2(r->time_s, 2 * alpha + 2 * n / beta, "forward behind a queued message");
  same.transfers[2].deps = {1};
  r = SimulateSchedule(same, l, f);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectNear2(r->time_s, 2 * alpha + 3 * n / beta, "forward the second");
  // 0 -> 1 and 0 -> 2 share 0's NIC: both done at alpha + 2n/beta.
  RankSchedule fan;
  fan.algorithm = "fan out";
  fan.transfers = {transfer(0, 1, {}), transfer(0, 2, {}), transfer(1, 2, {0})};
  r = SimulateSchedule(fan, l, f);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectNear2(r->time_s, 2 * alpha + 3 * n / beta, "fan out");
}

// A chunked direct Broadcast puts thousands of chunks on the root's NIC at t = 0: the root's
// egress bound alpha + (N - 1) M/beta, computed with one flow per receiver on the link (it was
// quadratic in the chunks: a 256 MB one in 64 KiB chunks took minutes).
TEST(SimPipelining, ChunkedDirectBroadcastIsTheRootsEgress) {
  const int n = 16;
  const double alpha = 10e-6, beta = 10e9, m = 64 << 20;
  const FabricSpec f = Fabric(FabricKind::kFlat, n, 1, 1, alpha, beta);
  JobSpec j = Job(OpKind::kBroadcast, "direct", m, n);
  j.chunk_bytes = 64 << 10;
  SimResult r;
  ExpectNear2(SimTime(f, {j}, &r), alpha + (n - 1) * m / beta, "direct broadcast");
  EXPECT_EQ(r.busiest_link.name, "node0/rail0 tx");
  EXPECT_GE(r.transfers, static_cast<uint64_t>((n - 1) * (m / (64 << 10))));
}

// ---------------------------------------------------------------------------------------------
// Contention

// G = 8 ranks per node on R rails: G/R ranks share each NIC, so hier's inter phase is G/R slower.
TEST(SimContention, RanksSharingANicSlowTheInterPhase) {
  const int k = 4, g = 8;
  const double alpha = 3e-6, beta = 50e9, m = 512e6;
  const double rs = (g - 1) * (kIntraAlpha + m / g / kIntraBeta);
  const double ag = kIntraAlpha + (g - 1.0) / g * m / kIntraBeta;
  for (int rails : {8, 2, 1}) {
    const FabricSpec f = Fabric(FabricKind::kRailOptimized, k, g, rails, alpha, beta);
    SimResult r;
    const double t = SimTime(f, {Job(OpKind::kAllReduce, "hier", m, k * g)}, &r);
    const double slow = static_cast<double>(g) / rails;
    ExpectNear2(t, rs + 2 * (k - 1) * (alpha + slow * m / (g * k) / beta) + ag,
                "rails " + std::to_string(rails));
    // With a NIC per rank the intra phases keep the NVLink ports busiest; shared NICs win.
    if (rails < g) {
      EXPECT_EQ(r.busiest_link.tier, "nic");
      EXPECT_THAT(r.busiest_link.name, ::testing::MatchesRegex("node[0-9]+/rail[0-9]+ (tx|rx)"));
    } else {
      EXPECT_EQ(r.busiest_link.name, "node0/local0 tx");
    }
  }
}

// One rank per node on R rails: the daemon stripes a rank's chunks over every rail
// (CommLayout::rail_for), so a ring AllReduce's bandwidth term is R times one rail's. The
// simulator routes each flow as the daemon does and the closed form agrees.
TEST(SimContention, OneRankPerNodeStripesOverEveryRail) {
  const int k = 4;
  const double alpha = 50e-6, beta = 125e6, m = 64e6;
  double one = 0;
  for (int rails : {1, 2, 4}) {
    const FabricSpec f = Fabric(FabricKind::kRailOptimized, k, 1, rails, alpha, beta);
    JobSpec j = Job(OpKind::kAllReduce, "ring", m, k);
    j.chunk_bytes = 256 << 10;
    SimResult r;
    const double t = SimTime(f, {j}, &r);
    if (rails == 1) one = t;
    const double bw = 2.0 * (k - 1) / k * m / (beta * rails);
    EXPECT_GT(t, bw) << rails;
    EXPECT_LT(t, 1.1 * bw + 2 * (k - 1) * alpha) << rails;
    if (rails > 1) {
      EXPECT_NEAR(one / t, rails, 0.1 * rails) << rails;
    }
  }
}

// PRIMER section 4: AllToAll across an R:1 oversubscribed spine is bounded by the bisection,
// BW_bisect = N BW_inject / (2R); inside one rack nothing changes. (Each of the direct
// exchange's two waves, see above, meets the larger of the injection and bisection bounds.)
TEST(SimContention, OversubscribedSpine) {
  const int n = 8, per_rack = 4;
  const double alpha = 3e-6, beta = 50e9, m = 64e6;
  const auto fabric = [&](double ov) {
    FabricSpec f = Fabric(FabricKind::kThreeTier, n, 1, 1, alpha, beta);
    f.nodes_per_rack = per_rack;
    f.oversubscription = ov;
    return f;
  };
  for (double ov : {1.0, 2.0, 4.0}) {
    SimResult r;
    const double t = SimTime(fabric(ov), {Job(OpKind::kAllToAll, "direct", m, n)}, &r);
    const double inject = (n - 1.0) / n * m / beta;
    const double bisect_bytes = (n / 2.0) * (m / 2);  // half the nodes send half their data across
    const double bisect = bisect_bytes / (n * beta / (2 * ov));
    ExpectNear2(t, 2 * (alpha + std::max(inject, bisect)), "alltoall ov " + std::to_string(ov));
    if (ov == 4) {
      EXPECT_EQ(r.busiest_link.tier, "spine");
      EXPECT_THAT(r.busiest_link.name, ::testing::MatchesRegex("rack[01] (up|down)"));
    }
    // In one rack the spine is never touched.
    JobSpec in_rack = Job(OpKind::kAllToAll, "direct", m, per_rack);
    in_rack.nodes = {0, 1, 2, 3};
    const double t_rack = SimTime(fabric(ov), {in_rack}, &r);
    ExpectNear2(t_rack, 2 * (alpha + (per_rack - 1.0) / per_rack * m / beta), "in rack");
    EXPECT_EQ(TierBytes(r.tiers, "spine"), 0u);
  }
  // A ring crosses the spine with one flow per rack: slowed only once the uplink (P beta / R)
  // drops below one NIC, here R = 8 -> half a NIC -> every step takes twice as long.
  const double ring = 2 * (n - 1) * (alpha + m / (n * beta));
  ExpectNear2(SimTime(fabric(4), {Job(OpKind::kAllReduce, "ring", m, n)}), ring, "ring ov 4");
  ExpectNear2(SimTime(fabric(8), {Job(OpKind::kAllReduce, "ring", m, n)}),
              2 * (n - 1) * (alpha + 2 * m / (n * beta)), "ring ov 8");
}

TEST(SimContention, ConcurrentJobs) {
  const int k = 8;
  const double alpha = 2e-6, beta = 25e9, m = 256e6;
  const FabricSpec f = Fabric(FabricKind::kTwoTier, k, 1, 1, alpha, beta);
  JobSpec a = Job(OpKind::kAllReduce, "ring", m, k), b = a;
  a.name = "a";
  b.name = "b";
  const double solo = SimTime(f, {a});
  SimResult r;
  const double both = SimTime(f, {a, b}, &r);
  ASSERT_EQ(r.jobs.size(), 2u);
  for (const JobResult& j : r.jobs) EXPECT_NEAR(j.time_s / solo, 2.0, 0.04) << j.name;
  EXPECT_NEAR(both / solo, 2.0, 0.04);
  // Disjoint halves of the fabric do not slow each other.
  JobSpec c = Job(OpKind::kAllReduce, "ring", m, k / 2), d = c;
  c.nodes = {0, 1, 2, 3};
  d.nodes = {4, 5, 6, 7};
  const double half = SimTime(f, {c});
  SimTime(f, {c, d}, &r);
  for (const JobResult& j : r.jobs) EXPECT_NEAR(j.time_s, half, 1e-3 * half);
}

// ---------------------------------------------------------------------------------------------
// Bytes agree with the symbolic executor; SimulateSchedule

TEST(SimBytes, TiersMatchTheSymbolicExecutor) {
  const CommLayout l = CommLayout::Uniform(3, 4, 2);
  FabricSpec f = Fabric(FabricKind::kTwoTier, 3, 4, 2, 3e-6, 50e9);
  OpShape s;
  s.op = OpKind::kAllReduce;
  s.dtype = kernels::DataType::kFloat32;
  s.count = 1001;
  for (const char* algo : {kAlgoRing, kAlgoTree, kAlgoRhd, kAlgoHier, kAlgoDirect}) {
    auto schedule = Generate(algo, s, l, 512);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    SimMemory mem = SimMemory::ForOp(s, l.nranks, false, std::byte{0});
    auto stats = RunSymbolic(*schedule, l, s, &mem);
    ASSERT_TRUE(stats.ok()) << stats.status();
    uint64_t net = 0, intra = 0;
    for (const auto& [key, link] : stats->links) net += link.bytes;
    for (int r = 0; r < l.nranks; ++r) {
      intra += stats->rank_bytes_sent[r] - stats->rank_net_bytes_sent[r];
    }
    auto sim = SimulateSchedule(*schedule, l, f);
    ASSERT_TRUE(sim.ok()) << sim.status();
    EXPECT_EQ(TierBytes(sim->tiers, "nic"), net) << algo;
    EXPECT_EQ(TierBytes(sim->tiers, "intra"), intra) << algo;
    EXPECT_GT(sim->time_s, 0) << algo;
    EXPECT_EQ(sim->transfers, schedule->transfers.size());
  }
  // A layout larger than the fabric is refused.
  f.ranks_per_node = 2;
  auto schedule = Generate(kAlgoRing, s, l, 0);
  ASSERT_TRUE(schedule.ok());
  EXPECT_EQ(SimulateSchedule(*schedule, l, f).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(SimErrors, BadJobsAreInvalidArgument) {
  const FabricSpec f = Fabric(FabricKind::kTwoTier, 4, 2, 1, 3e-6, 50e9);
  const auto err = [&](const JobSpec& j) { return Simulate(f, {j}).status(); };
  JobSpec j = Job(OpKind::kAllReduce, "ring", 1e6, 8);
  j.nodes = {0, 4};
  EXPECT_THAT(err(j).message(), HasSubstr("node 4 not in the fabric's [0, 4)"));
  j.nodes = {1, 1};
  EXPECT_THAT(err(j).message(), HasSubstr("node 1 listed twice"));
  j.nodes = {};
  j.ranks_per_node = 3;
  EXPECT_THAT(err(j).message(), HasSubstr("ranks_per_node 3 not in [1, 2]"));
  j.ranks_per_node = 0;
  j.shape.op = OpKind::kAllToAll;
  j.algorithm = "rhd";
  EXPECT_THAT(err(j).message(), HasSubstr("does not implement op alltoall"));
  j.algorithm = "torus";
  j.shape.op = OpKind::kAllReduce;
  EXPECT_THAT(err(j).message(), HasSubstr("torus needs a torus layout"));
  EXPECT_EQ(Simulate(f, {}).status().code(), absl::StatusCode::kInvalidArgument);
  // 8192 ranks flat ring: ~200M transfers, refused before generating anything.
  const FabricSpec big = Fabric(FabricKind::kTwoTier, 1024, 8, 8, 3e-6, 50e9);
  const absl::Status s = Simulate(big, {Job(OpKind::kAllReduce, "ring", 256e6, 8192)}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("above the simulator's budget"));
  EXPECT_THAT(s.message(), HasSubstr("hier"));
  FabricSpec torus = Fabric(FabricKind::kTorus, 6, 1, 1, 1e-6, 1e9);
  torus.torus_dims = {2, 2};
  EXPECT_THAT(Simulate(torus, {j}).status().message(), HasSubstr("does not have 6 nodes"));
}

// ---------------------------------------------------------------------------------------------
// Jobs file

TEST(SimJobsFile, ParsesAndRejects) {
  const FabricSpec f = Fabric(FabricKind::kTwoTier, 8, 4, 4, 3e-6, 50e9);
  auto jobs = ParseJobsJson(R"({"jobs":[
      {"name":"a","op":"allreduce","size":"256MB","algo":"hier","nodes":[0,1,2,3]},
      {"op":"allgather","size":"64MiB","first_node":4,"num_nodes":4,"ranks_per_node":2,
       "chunk":"1MiB"},
      {"op":"alltoall","size":1600}]})",
                            f);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 3u);
  EXPECT_EQ((*jobs)[0].name, "a");
  EXPECT_EQ((*jobs)[0].shape.count, 64'000'000u);  // 256 MB of float32
  EXPECT_EQ((*jobs)[0].nodes, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ((*jobs)[1].name, "job1");
  EXPECT_EQ((*jobs)[1].shape.op, OpKind::kAllGather);
  EXPECT_EQ((*jobs)[1].shape.count, (64u << 20) / 4 / 8);  // full buffer over 4 x 2 ranks
  EXPECT_EQ((*jobs)[1].nodes, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ((*jobs)[1].chunk_bytes, 1u << 20);
  EXPECT_EQ((*jobs)[2].shape.count, 1600u / 4 / 32);
  EXPECT_TRUE((*jobs)[2].nodes.empty());
  // A job without "algo" is the tuner's to fill in (railctl simulate); Simulate wants one.
  EXPECT_THAT(std::string(Simulate(f, *jobs).status().message()), HasSubstr("names no algorithm"));
  (*jobs)[1].algorithm = "ring";
  (*jobs)[2].algorithm = "direct";
  auto sim = Simulate(f, *jobs);
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_EQ(sim->jobs.size(), 3u);

  const auto msg = [&](const std::string& text) {
    return std::string(ParseJobsJson(text, f).status().message());
  };
  EXPECT_THAT(msg("{"), HasSubstr("not valid JSON"));
  EXPECT_THAT(msg(R"({"jobs":[]})"), HasSubstr("at least one job"));
  EXPECT_THAT(msg(R"({"jobs":[{"op":"allreduce"}]})"), HasSubstr("job 0: needs \"size\""));
  EXPECT_THAT(msg(R"({"jobs":[{"op":"send","size":"1MB"}]})"), HasSubstr("op 'send'"));
  EXPECT_THAT(msg(R"({"jobs":[{"op":"allreduce","size":"1XB"}]})"), HasSubstr("size"));
  EXPECT_THAT(msg(R"({"jobs":[{"op":"allreduce","size":"1MB","nodez":[0]}]})"),
              HasSubstr("unknown key 'nodez'"));
  EXPECT_THAT(msg(R"({"jobs":[{"op":"allreduce","size":"1MB","first_node":6,"num_nodes":4}]})"),
              HasSubstr("not within the fabric's 8 nodes"));
  EXPECT_THAT(msg(R"({"jobs":[{"op":"allreduce","size":"1MB","nodes":[9]}]})"),
              HasSubstr("node 9 not in"));
  EXPECT_THAT(msg(R"({"jobs":[{"op":"allreduce","size":"1MB","ranks_per_node":5}]})"),
              HasSubstr("ranks_per_node 5"));
}

}  // namespace
}  // namespace railyard::scheduler::sim
