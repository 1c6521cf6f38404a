// The closed forms against every worked example of PRIMER.md (within 1 %).
#include <cmath>
#include <map>
#include <string>

#include "daemon/scheduler/cost/closed_form.h"
#include "daemon/topology/units.h"
#include "gtest/gtest.h"

namespace railyard::scheduler::cost {
namespace {

using topology::FabricKind;
using topology::FabricSpec;

FabricSpec Flat(int n, double alpha, double beta) {
  FabricSpec f;
  f.kind = FabricKind::kFlat;
  f.nodes = n;
  f.ranks_per_node = 1;
  f.rails = 1;
  f.inter = {alpha, beta};
  return f;
}

std::map<std::string, Estimate> ByName(OpKind op, double m, const FabricSpec& f) {
  absl::StatusOr<std::vector<Estimate>> all = ClosedForms(op, m, f);
  EXPECT_TRUE(all.ok()) << all.status();
  std::map<std::string, Estimate> out;
  if (all.ok()) {
    for (const Estimate& e : *all) out[e.algorithm] = e;
  }
  return out;
}

// |got - want| <= 1 % of want.
void ExpectWithin1Pct(double got, double want) {
  EXPECT_NEAR(got, want, 0.01 * std::fabs(want)) << "got " << got << ", want " << want;
}

// One rank per node on R rails stripes over all of them: ring's bandwidth term is 1/R of one
// rail's, and with 2 ranks on 4 rails hier's inter phase has 2 rails per rank.
TEST(ClosedForm, FewerRanksThanRailsUseEveryRail) {
  const double m = 64e6;
  FabricSpec f = Flat(4, 50e-6, 125e6);
  f.kind = FabricKind::kRailOptimized;
  const double one = ByName(OpKind::kAllReduce, m, f)["ring"].bandwidth_s;
  ExpectWithin1Pct(one, 2.0 * 3 / 4 * m / 125e6);
  f.rails = 2;
  ExpectWithin1Pct(ByName(OpKind::kAllReduce, m, f)["ring"].bandwidth_s, one / 2);
  f.ranks_per_node = 2;
  f.intra = {2e-6, 4e9};
  const double hier2 = ByName(OpKind::kAllReduce, m, f)["hier"].bandwidth_s;
  f.rails = 4;
  const double hier4 = ByName(OpKind::kAllReduce, m, f)["hier"].bandwidth_s;
  const double intra = 2 * 0.5 * m / 4e9;
  ExpectWithin1Pct(hier4 - intra, (hier2 - intra) / 2);
}

TEST(ClosedForm, RingVsTreeAt64Ranks) {
  // N = 64, M = 1 MB, alpha = 10 us, beta = 10 GB/s.
  auto e = ByName(OpKind::kAllReduce, 1e6, Flat(64, 10e-6, 10e9));
  ExpectWithin1Pct(e["ring"].latency_s, 1260e-6);
  ExpectWithin1Pct(e["ring"].bandwidth_s, 196.9e-6);
  ExpectWithin1Pct(e["ring"].time_s(), 1456.9e-6);
  ExpectWithin1Pct(e["tree"].latency_s, 120e-6);
  ExpectWithin1Pct(e["tree"].bandwidth_s, 1200e-6);
  ExpectWithin1Pct(e["tree"].time_s(), 1320e-6);
  // "Tree wins by 9 %": (ring - tree) / ring.
  const double win = (e["ring"].time_s() - e["tree"].time_s()) / e["ring"].time_s();
  EXPECT_NEAR(win, 0.094, 0.005);
}

TEST(ClosedForm, RingVsTreeAt256RanksOneGigabyte) {
  auto e = ByName(OpKind::kAllReduce, 1e9, Flat(256, 5e-6, 50e9));
  ExpectWithin1Pct(e["ring"].time_s(), 42.4e-3);
  ExpectWithin1Pct(e["tree"].time_s(), 320.1e-3);
}

TEST(ClosedForm, SeventyBillionParameterRing) {
  // 70B parameters in BF16: M = 140 GB, N = 64, alpha = 1.5 us, beta = 50 GB/s.
  auto e = ByName(OpKind::kAllReduce, 140e9, Flat(64, 1.5e-6, 50e9));
  ExpectWithin1Pct(e["ring"].bandwidth_s, 5512.5e-3);
  ExpectWithin1Pct(e["ring"].latency_s, 0.189e-3);
}

TEST(ClosedForm, CriticalSizes) {
  ExpectWithin1Pct(CriticalSize({2e-6, 50e9}), 100e3);
  ExpectWithin1Pct(CriticalSize({5e-6, 50e9}), 250e3);
}

TEST(ClosedForm, Crossovers) {
  // N = 64, alpha = 10 us, beta = 10 GB/s: "log-aware crossover ~ 1.1 MB" (two significant
  // digits: N alpha beta / log2 N = 1.067 MB; the exact power-of-two formula gives 1.136 MB).
  absl::StatusOr<Crossover> c64 = RingTreeCrossover(64, {10e-6, 10e9});
  ASSERT_TRUE(c64.ok());
  ExpectWithin1Pct(c64->log_estimate_bytes, 64 * 1e5 / 6);
  EXPECT_NEAR(std::round(c64->log_estimate_bytes / 1e5) / 10, 1.1, 1e-9);
  ExpectWithin1Pct(c64->exact_bytes, 1e5 * (63 - 6) / (6 - 63.0 / 64));
  ExpectWithin1Pct(c64->rough_bytes, 6.4e6);
  // At the exact crossover ring and tree cost the same.
  auto at = ByName(OpKind::kAllReduce, c64->exact_bytes, Flat(64, 10e-6, 10e9));
  ExpectWithin1Pct(at["ring"].time_s(), at["tree"].time_s());
  // N = 100, alpha = 5 us, beta = 50 GB/s: log-aware crossover ~ 3.8 MB.
  absl::StatusOr<Crossover> c100 = RingTreeCrossover(100, {5e-6, 50e9});
  ASSERT_TRUE(c100.ok());
  ExpectWithin1Pct(c100->log_estimate_bytes, 3.8e6);
  EXPECT_FALSE(RingTreeCrossover(1, {5e-6, 50e9}).ok());
}

TEST(ClosedForm, HierarchicalEightByEight) {
  // K = 8, G = 8, M = 1 GB, intra 450 GB/s, inter 50 GB/s and 3 us, one NIC per GPU.
  FabricSpec f;
  f.kind = FabricKind::kRailOptimized;
  f.nodes = 8;
  f.ranks_per_node = 8;
  f.rails = 8;
  f.inter = {3e-6, 50e9};
  f.intra = {3e-6, 450e9};
  auto e = ByName(OpKind::kAllReduce, 1e9, f);
  ASSERT_TRUE(e.count("hier"));
  ExpectWithin1Pct(e["hier"].time_s(), 8.3e-3);
  // Flat ring bounded by the inter-node link: ~40 ms, 4.8x the hierarchical time.
  ExpectWithin1Pct(e["ring"].time_s(), 40e-3);
  ExpectWithin1Pct(e["ring"].time_s() / e["hier"].time_s(), 4.8);
  // The three phases: intra RS ~1.94 ms, inter AR of 125 MB ~4.42 ms (inter alone), intra AG.
  const double intra_phase = 7.0 / 8 * 1e9 / 450e9;
  ExpectWithin1Pct(intra_phase, 1.94e-3);
  const double inter_phase = 2 * 7 * 3e-6 + 2 * 7.0 / 8 * 125e6 / 50e9;
  ExpectWithin1Pct(inter_phase, 4.42e-3);
  // Two GPUs per NIC: the inter phase's bandwidth term doubles.
  f.rails = 4;
  auto shared = ByName(OpKind::kAllReduce, 1e9, f);
  ExpectWithin1Pct(shared["hier"].bandwidth_s - e["hier"].bandwidth_s, 2 * 7.0 / 8 * 125e6 / 50e9);
}

TEST(ClosedForm, MixtureOfExpertsAllToAll) {
  // 8 ranks, 512 tokens of 4096 B each: 262,144 B to each of 7 peers, 1.84 MB per rank.
  const double m = 512.0 * 4096;
  const FabricSpec f = Flat(8, 3e-6, 50e9);
  AllToAllBounds b = AllToAllLowerBounds(m, f);
  ExpectWithin1Pct(b.per_transfer_s, 8.24e-6);  // "one transfer ~ 8 us"
  ExpectWithin1Pct(b.injection_s, 39.7e-6);     // ingress lower bound
  ExpectWithin1Pct(b.lower_bound_s, 39.7e-6);
  auto e = ByName(OpKind::kAllToAll, m, f);
  ExpectWithin1Pct(e["direct"].time_s(), 7 * 3e-6 + 7.0 / 8 * m / 50e9);
  // 4:1 oversubscription makes the bisection the bound.
  FabricSpec over = f;
  over.oversubscription = 4;
  EXPECT_GT(AllToAllLowerBounds(m, over).lower_bound_s, b.lower_bound_s * 1.9);
}

TEST(ClosedForm, TorusAndInNetwork) {
  FabricSpec f;
  f.kind = FabricKind::kTorus;
  f.torus_dims = {8, 16};
  f.nodes = 128;
  f.inter = {1e-6, 100e9};
  f.in_network_reduction = true;
  auto e = ByName(OpKind::kAllReduce, 1e9, f);
  ExpectWithin1Pct(e["torus"].latency_s, 2 * (7 + 15) * 1e-6);
  ExpectWithin1Pct(e["torus"].bandwidth_s, 2 * 127.0 / 128 * 1e9 / 100e9);
  ExpectWithin1Pct(e["ring"].latency_s, 2 * 127 * 1e-6);
  ExpectWithin1Pct(e["innetwork"].time_s(), 2e-6 + 1e9 / 100e9);
}

TEST(ClosedForm, BadInput) {
  EXPECT_FALSE(ClosedForms(OpKind::kSend, 1e6, Flat(2, 1e-6, 1e9)).ok());
  EXPECT_FALSE(ClosedForms(OpKind::kAllReduce, -1, Flat(2, 1e-6, 1e9)).ok());
  EXPECT_FALSE(ClosedForms(OpKind::kAllReduce, 1e6, Flat(2, 1e-6, 0)).ok());
}

TEST(Units, ParsesWhatOperatorsType) {
  EXPECT_DOUBLE_EQ(*topology::ParseBytes("1MB"), 1e6);
  EXPECT_DOUBLE_EQ(*topology::ParseBytes("1 MiB"), 1048576);
  EXPECT_DOUBLE_EQ(*topology::ParseBytes("140GB"), 140e9);
  EXPECT_DOUBLE_EQ(*topology::ParseBytes("4096"), 4096);
  EXPECT_DOUBLE_EQ(*topology::ParseDuration("3us"), 3e-6);
  EXPECT_DOUBLE_EQ(*topology::ParseDuration("1.5 us"), 1.5e-6);
  EXPECT_DOUBLE_EQ(*topology::ParseDuration("2ms"), 2e-3);
  EXPECT_DOUBLE_EQ(*topology::ParseBandwidth("50GB/s"), 50e9);
  EXPECT_DOUBLE_EQ(*topology::ParseBandwidth("400Gbit/s"), 50e9);
  EXPECT_FALSE(topology::ParseBytes("1 parsec").ok());
  EXPECT_FALSE(topology::ParseBytes("-5MB").ok());
  EXPECT_FALSE(topology::ParseDuration("fast").ok());
  EXPECT_FALSE(topology::ParseBandwidth("0GB/s").ok());
  EXPECT_EQ(topology::FormatDuration(39.7e-6), "39.7 us");
}

// A finite number can overflow once scaled by its unit (caught by tests/fuzz/topology_file_fuzz's
// properties: "1e300 TB/s" was an infinite bandwidth).
TEST(Units, RefusesValuesThatOverflowInTheirUnit) {
  absl::StatusOr<double> bw = topology::ParseBandwidth("1e300 TB/s");
  EXPECT_EQ(bw.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bw.status().message(), "bad bandwidth '1e300 TB/s': too large (overflows a double)");
  EXPECT_FALSE(topology::ParseBytes("1e300 TiB").ok());
  EXPECT_FALSE(topology::ParseDuration("1e309").ok());  // strtod's HUGE_VAL
  EXPECT_DOUBLE_EQ(*topology::ParseBandwidth("1e290 TB/s"), 1e302);
}

}  // namespace
}  // namespace railyard::scheduler::cost
