// Topology files: the daemon's node part (rails as before, plus GPUs, NUMA, NICs, intra links)
// and the fabric section: every kind, the defaults taken from the node part, every bad input with
// the field it names, and every file in examples/topologies.
#include "daemon/topology/topology_file.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard::topology {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A file with the given fabric section and node part (JSON members, without braces).
std::string File(const std::string& fabric, const std::string& node = "") {
  return "{" + node + (node.empty() ? "" : ", ") + "\"fabric\": {" + fabric + "}}";
}

constexpr char kIntra[] = R"("intra": {"alpha": "0.5us", "bandwidth": "450GB/s"})";

TEST(NodeTopologyFile, RailsOnlyFilesKeepWorking) {
  absl::StatusOr<v1::NodeTopology> topo = ParseNodeTopology(
      R"({"node": "vnode0", "rails": [{"name": "rail0", "device": "lo"}, {"device": "lo"}]})");
  ASSERT_TRUE(topo.ok()) << topo.status();
  EXPECT_EQ(topo->node(), "vnode0");
  ASSERT_EQ(topo->rails_size(), 2);
  EXPECT_EQ(topo->rails(1).name(), "rail1");
  EXPECT_EQ(topo->rails(1).device(), "lo");
  EXPECT_FALSE(topo->rails(0).has_numa_node());
  EXPECT_FALSE(topo->has_fabric());
}

TEST(NodeTopologyFile, NumaNodeZeroIsKnown) {
  absl::StatusOr<v1::NodeTopology> topo =
      ParseNodeTopology(R"({"rails": [{"device": "eth0", "numa_node": 0, "speed_gbps": 100}]})");
  ASSERT_TRUE(topo.ok()) << topo.status();
  EXPECT_TRUE(topo->rails(0).has_numa_node());
  EXPECT_EQ(topo->rails(0).numa_node(), 0);
  EXPECT_EQ(topo->rails(0).speed_gbps(), 100);
}

TEST(NodeTopologyFile, DaemonFilesNeedRails) {
  absl::StatusOr<v1::NodeTopology> topo = ParseNodeTopology(R"({"node": "a"})");
  EXPECT_EQ(topo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(topo.status().message(), HasSubstr("no rails"));
  // A model-only file needs none.
  EXPECT_TRUE(ParseTopology(R"({"node": "a"})").ok());
}

TEST(NodeTopologyFile, BadNodePartsNameTheField) {
  struct Case {
    const char* json;
    const char* field;
  };
  for (const Case& c : {
           Case{R"({"intra": {"alpha": "3 parsecs"}})", "intra.alpha"},
           Case{R"({"intra": {"bandwidth": "0GB/s"}})", "intra.bandwidth"},
           Case{R"({"gpus": [{"index": 0}, {"index": 0}]})", "gpus[1]"},
           Case{R"({"gpus": [{"index": -1}]})", "gpus[0]"},
           Case{R"({"numa_nodes": [{"id": 0, "cpus": "0-3,x"}]})", "numa_nodes[0].cpus"},
           Case{R"({"numa_nodes": [{"id": 0, "cpus": "3-1"}]})", "numa_nodes[0].cpus"},
           Case{R"({"nics": [{"speed_gbps": 100}]})", "nics[0].name"},
           Case{R"({"rails": [{"speed_gbps": -1}]})", "rails[0].speed_gbps"},
           // NaN and Infinity are valid proto3 JSON doubles, not speeds.
           Case{R"({"rails": [{"speed_gbps": "Infinity"}]})", "rails[0].speed_gbps: inf is not"},
           Case{R"({"rails": [{"speed_gbps": "NaN"}]})", "rails[0].speed_gbps: nan is not"},
           Case{R"({"nics": [{"name": "e", "speed_gbps": "Infinity"}]})", "nics[0].speed_gbps"},
           Case{R"({"gpu": []})", "gpu"},  // unknown field: the JSON parser names it
       }) {
    absl::StatusOr<v1::NodeTopology> topo = ParseTopology(c.json);
    EXPECT_EQ(topo.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(topo.status().message(), HasSubstr(c.field)) << c.json;
  }
}

TEST(NodeTopologyFile, MissingFileIsNotFound) {
  EXPECT_EQ(LoadTopology("/nonexistent/topo.json").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadFabricFile("/nonexistent/topo.json").status().code(), absl::StatusCode::kNotFound);
}

TEST(FabricFile, TwoTierWithEveryField) {
  absl::StatusOr<FabricSpec> f = ParseFabric(File(
      R"("kind": "two-tier", "nodes": 16, "ranks_per_node": 8, "rails": 4,
         "inter": {"alpha": "5us", "bandwidth": "400Gbit/s"}, "cpu_overhead": "1.5us",
         "in_network_reduction": true)",
      kIntra));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kind, FabricKind::kTwoTier);
  EXPECT_EQ(f->nodes, 16);
  EXPECT_EQ(f->ranks_per_node, 8);
  EXPECT_EQ(f->nranks(), 128);
  EXPECT_EQ(f->rails, 4);
  EXPECT_DOUBLE_EQ(f->intra.alpha_s, 0.5e-6);
  EXPECT_DOUBLE_EQ(f->intra.beta_bytes_per_s, 450e9);
  EXPECT_DOUBLE_EQ(f->inter.alpha_s, 5e-6);
  EXPECT_DOUBLE_EQ(f->inter.beta_bytes_per_s, 50e9);
  EXPECT_DOUBLE_EQ(f->overhead_s, 1.5e-6);
  EXPECT_TRUE(f->in_network_reduction);
  EXPECT_DOUBLE_EQ(f->oversubscription, 1);
}

TEST(FabricFile, DefaultsComeFromTheNodePart) {
  // Rails give R and (the slowest of them) the inter bandwidth; GPUs give G.
  absl::StatusOr<FabricSpec> f = ParseFabric(
      File(R"("kind": "rail_optimized", "nodes": 4, "inter": {"alpha": "3us"})",
           std::string(kIntra) +
               R"(, "rails": [{"speed_gbps": 400}, {"speed_gbps": 200}, {"speed_gbps": 0}],
             "gpus": [{"index": 0}, {"index": 1}, {"index": 2}, {"index": 3}])"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kind, FabricKind::kRailOptimized);
  EXPECT_EQ(f->ranks_per_node, 4);
  EXPECT_EQ(f->rails, 3);
  EXPECT_DOUBLE_EQ(f->inter.beta_bytes_per_s, 200e9 / 8);
  EXPECT_DOUBLE_EQ(f->inter.alpha_s, 3e-6);
  EXPECT_FALSE(f->in_network_reduction);
  // Without GPUs or rails: one of each.
  f = ParseFabric(File(R"("kind": "flat", "nodes": 64, "inter": {"bandwidth": "25GB/s"})"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->ranks_per_node, 1);
  EXPECT_EQ(f->rails, 1);
  EXPECT_EQ(f->nranks(), 64);
  EXPECT_DOUBLE_EQ(f->inter.alpha_s, 0);
}

TEST(FabricFile, ThreeTier) {
  absl::StatusOr<FabricSpec> f = ParseFabric(
      File(R"("kind": "three_tier", "nodes": 16, "ranks_per_node": 8, "nodes_per_rack": 4,
              "oversubscription": 2, "inter": {"alpha": "5us", "bandwidth": "50GB/s"})",
           kIntra));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kind, FabricKind::kThreeTier);
  EXPECT_EQ(f->nodes_per_rack, 4);
  EXPECT_DOUBLE_EQ(f->oversubscription, 2);
}

TEST(FabricFile, TorusNodesComeFromItsDims) {
  absl::StatusOr<FabricSpec> f = ParseFabric(
      File(R"("kind": "torus", "torus_dims": [4, 4, 2], "inter": {"bandwidth": "50GB/s"})"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kind, FabricKind::kTorus);
  EXPECT_EQ(f->nodes, 32);
  EXPECT_EQ(f->torus_dims, (std::vector<int>{4, 4, 2}));
  f = ParseFabric(File(
      R"("kind": "torus", "nodes": 128, "torus_dims": [8, 16], "inter": {"bandwidth": "50GB/s"})"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->nodes, 128);
}

TEST(FabricFile, BadInputsNameTheField) {
  constexpr char kInter[] = R"("inter": {"alpha": "5us", "bandwidth": "50GB/s"})";
  struct Case {
    std::string json;
    std::string field;
    std::string why;
  };
  const std::string i = kInter;
  const std::vector<Case> cases = {
      {File(R"("kind": "fat_tree", "nodes": 4, )" + i), "fabric.kind", "unknown kind 'fat_tree'"},
      {File(R"("nodes": 4, )" + i), "fabric.kind", "missing"},
      {File(R"("kind": "torus", "nodes": 64, "torus_dims": [8, 16], )" + i), "fabric.torus_dims",
       "8x16 = 128 nodes, but fabric.nodes is 64"},
      {File(R"("kind": "torus", "torus_dims": [128], )" + i), "fabric.torus_dims",
       "2 or 3 dimensions, got 1"},
      {File(R"("kind": "torus", "torus_dims": [2, 2, 2, 2], )" + i), "fabric.torus_dims",
       "2 or 3 dimensions, got 4"},
      {File(R"("kind": "torus", "torus_dims": [8, 0], )" + i), "fabric.torus_dims[1]",
       "must be >= 1"},
      // The product used to overflow int64 (UBSan) before it was compared with the limit.
      {File(R"("kind": "torus", "torus_dims": [2147483647, 2147483647, 2147483647], )" + i),
       "fabric.torus_dims", "more than 2^24 nodes"},
      {File(R"("kind": "torus", "torus_dims": [4096, 4097], )" + i), "fabric.torus_dims",
       "more than 2^24 nodes"},
      {File(R"("kind": "two_tier", "nodes": 4, "torus_dims": [2, 2], )" + i), "fabric.torus_dims",
       "only a torus"},
      {File(R"("kind": "three_tier", "nodes": 16, "nodes_per_rack": 4, "oversubscription": 0.5, )" +
            i),
       "fabric.oversubscription", "must be finite and >= 1"},
      {File(R"("kind": "three_tier", "nodes": 16, "nodes_per_rack": 4, )"
            R"("oversubscription": "Infinity", )" +
            i),
       "fabric.oversubscription", "must be finite and >= 1 (R:1), got inf"},
      {File(R"("kind": "three_tier", "nodes": 16, "nodes_per_rack": 5, )" + i),
       "fabric.nodes_per_rack", "5 does not divide fabric.nodes 16"},
      {File(R"("kind": "three_tier", "nodes": 16, )" + i), "fabric.nodes_per_rack", "missing"},
      {File(R"("kind": "three_tier", "nodes": 16, "nodes_per_rack": 0, )" + i),
       "fabric.nodes_per_rack", "must be >= 1"},
      {File(R"("kind": "two_tier", "nodes": 16, "nodes_per_rack": 4, )" + i),
       "fabric.nodes_per_rack", "only three_tier"},
      {File(R"("kind": "two_tier", "nodes": 16, "oversubscription": 2, )" + i),
       "fabric.oversubscription", "only three_tier"},
      {File(R"("kind": "two_tier", "nodes": 4, "inter": {"alpha": "5us"})"),
       "fabric.inter.bandwidth", "missing"},
      {File(R"("kind": "two_tier", "nodes": 4, "inter": {"bandwidth": "0GB/s"})"),
       "fabric.inter.bandwidth", "must be > 0"},
      {File(R"("kind": "two_tier", "nodes": 4, "inter": {"bandwidth": "fast"})"),
       "fabric.inter.bandwidth", "bad bandwidth 'fast'"},
      {File(
           R"("kind": "two_tier", "nodes": 4, "inter": {"alpha": "3 parsecs", "bandwidth": "1GB/s"})"),
       "fabric.inter.alpha", "unknown unit 'parsecs'"},
      {File(R"("kind": "two_tier", "nodes": 4, "cpu_overhead": "-1us", )" + i),
       "fabric.cpu_overhead", "negative"},
      {File(R"("kind": "two_tier", "nodes": 4, "ranks_per_node": 0, )" + i),
       "fabric.ranks_per_node", "must be >= 1, got 0"},
      {File(R"("kind": "two_tier", "nodes": 4, "rails": 0, )" + i), "fabric.rails",
       "must be >= 1, got 0"},
      {File(R"("kind": "two_tier", "nodes": 0, )" + i), "fabric.nodes", "must be >= 1, got 0"},
      {File(R"("kind": "two_tier", )" + i), "fabric.nodes", "missing"},
      {File(R"("kind": "flat", "nodes": 16, "ranks_per_node": 8, )" + i), "fabric.ranks_per_node",
       "one rank per node"},
      {File(R"("kind": "two_tier", "nodes": 4, "ranks_per_node": 8, )" + i), "intra.bandwidth",
       "missing: 8 ranks per node"},
      {File(R"("kind": "two_tier", "nodes": 4, "ranks_per_node": 8, )" + i,
            R"("intra": {"bandwidth": "450 furlongs"})"),
       "intra.bandwidth", "unknown unit 'furlongs'"},
      {R"({"node": "a"})", "fabric", "missing"},
      {File(R"("kind": "two_tier", "nodes": 4, "racks": 2, )" + i), "racks", ""},
  };
  for (const Case& c : cases) {
    absl::StatusOr<FabricSpec> f = ParseFabric(c.json);
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(f.status().message(), AllOf(HasSubstr(c.field), HasSubstr(c.why))) << c.json;
  }
}

TEST(FabricFile, ErrorsNameTheFile) {
  const std::string path = ::testing::TempDir() + "/bad_fabric.json";
  std::ofstream(path) << File(R"("kind": "ring", "nodes": 2)");
  absl::StatusOr<FabricSpec> f = LoadFabricFile(path);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(f.status().message(), AllOf(HasSubstr(path), HasSubstr("fabric.kind")));
  std::filesystem::remove(path);
}

// Every example file parses and describes what its name says; a new file needs a row here.
TEST(ExampleTopologies, EveryFileLoads) {
  struct Expected {
    FabricKind kind;
    int nodes;
    int ranks_per_node;
    int rails;
  };
  const std::map<std::string, Expected> expected = {
      {"flat_128.json", {FabricKind::kFlat, 128, 1, 1}},
      {"two_tier_16x8.json", {FabricKind::kTwoTier, 16, 8, 8}},
      {"rail_optimized_16x8.json", {FabricKind::kRailOptimized, 16, 8, 8}},
      {"three_tier_16x8.json", {FabricKind::kThreeTier, 16, 8, 8}},
      {"torus_8x16.json", {FabricKind::kTorus, 128, 1, 1}},
      {"innetwork_16x8.json", {FabricKind::kRailOptimized, 16, 8, 8}},
      {"rail_optimized_1024x8.json", {FabricKind::kRailOptimized, 1024, 8, 8}},
  };
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(RAILYARD_EXAMPLE_TOPOLOGIES)) {
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    absl::StatusOr<FabricSpec> f = LoadFabricFile(entry.path().string());
    ASSERT_TRUE(f.ok()) << f.status();
    auto it = expected.find(name);
    ASSERT_NE(it, expected.end()) << "add " << name << " to this test's table";
    ++seen;
    EXPECT_EQ(f->kind, it->second.kind);
    EXPECT_EQ(f->nodes, it->second.nodes);
    EXPECT_EQ(f->ranks_per_node, it->second.ranks_per_node);
    EXPECT_EQ(f->nranks(), it->second.nodes * it->second.ranks_per_node);
    EXPECT_EQ(f->rails, it->second.rails);
    EXPECT_GT(f->inter.beta_bytes_per_s, 0);
    if (f->ranks_per_node > 1) {
      EXPECT_DOUBLE_EQ(f->intra.beta_bytes_per_s, 450e9);
      EXPECT_DOUBLE_EQ(f->intra.alpha_s, 0.5e-6);
      EXPECT_DOUBLE_EQ(f->inter.beta_bytes_per_s, 50e9);  // 400 Gbit/s
      EXPECT_DOUBLE_EQ(f->inter.alpha_s, 5e-6);
    }
    if (name == "three_tier_16x8.json") {
      EXPECT_EQ(f->nodes_per_rack, 4);
      EXPECT_DOUBLE_EQ(f->oversubscription, 2);
    }
    if (name == "torus_8x16.json") {
      EXPECT_EQ(f->torus_dims, (std::vector<int>{8, 16}));
    }
    EXPECT_EQ(f->in_network_reduction, name == "innetwork_16x8.json");
  }
  EXPECT_EQ(seen, static_cast<int>(expected.size()));
}

}  // namespace
}  // namespace railyard::topology
