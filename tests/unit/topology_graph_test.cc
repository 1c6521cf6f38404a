// The node graph built from a topology: rails on their NICs, NUMA grouping, cpulists, the text
// tree and the JSON that reads back as the same topology.
#include "daemon/topology/topology_graph.h"

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "daemon/topology/topology_file.h"
#include "daemon/topology/units.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace railyard::topology {
namespace {

using ::testing::HasSubstr;

TEST(CpuList, ParsesKernelSyntax) {
  EXPECT_EQ(*ParseCpuList("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(*ParseCpuList(" 5 \n"), (std::vector<int>{5}));
  EXPECT_TRUE(ParseCpuList("")->empty());
  for (const char* bad : {"3-1", "a", "1-", "-1", "1,,2", "+1", "1-2-3", "0x3"}) {
    absl::StatusOr<std::vector<int>> cpus = ParseCpuList(bad);
    EXPECT_EQ(cpus.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(cpus.status().message(), HasSubstr("bad cpulist")) << bad;
  }
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({}), "");
}

// Repeated and overlapping ranges cost what the distinct CPUs cost (through
// tests/fuzz/topology_file_fuzz, 400 copies of "0-1048575", a 4 KB file, made a 2 GiB vector).
TEST(CpuList, RepeatedRangesCostOnlyTheirDistinctCpus) {
  EXPECT_EQ(*ParseCpuList("8-10,0-3,2-9,9,1"),
            (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  std::vector<std::string> parts(400, "0-1048575");
  absl::StatusOr<std::vector<int>> cpus = ParseCpuList(absl::StrJoin(parts, ","));
  ASSERT_TRUE(cpus.ok()) << cpus.status();
  EXPECT_EQ(cpus->size(), 1u << 20);
  EXPECT_LE(cpus->capacity(), 2u << 20);
  EXPECT_EQ(cpus->front(), 0);
  EXPECT_EQ(cpus->back(), (1 << 20) - 1);
}

constexpr char kNode[] = R"({
  "node": "gpu-a",
  "rails": [{"name": "r0", "device": "eth0", "transports": "tcp"},
            {"name": "r1", "device": "mlx5_1:1", "speed_gbps": 200, "numa_node": 1},
            {"name": "r2", "device": "eth0"}],
  "nics": [{"name": "eth0", "speed_gbps": 100, "numa_node": 0, "state": "up"},
           {"name": "ib1", "speed_gbps": 400, "numa_node": 1, "state": "up", "rdma_device": "mlx5_1:1"},
           {"name": "lo", "state": "unknown", "is_virtual": true}],
  "gpus": [{"index": 1, "name": "H100", "pci_bus_id": "0000:9a:00.0", "numa_node": 1},
           {"index": 0, "name": "H100", "pci_bus_id": "0000:18:00.0", "numa_node": 0}],
  "numa_nodes": [{"id": 1, "cpus": "4-7"}, {"id": 0, "cpus": "0-3"}],
  "intra": {"alpha": "0.5us", "bandwidth": "450GB/s"}
})";

TEST(TopologyGraph, RailsSitOnTheirNics) {
  absl::StatusOr<v1::NodeTopology> topo = ParseTopology(kNode);
  ASSERT_TRUE(topo.ok()) << topo.status();
  absl::StatusOr<TopologyGraph> g = TopologyGraph::FromProto(*topo);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->node(), "gpu-a");
  EXPECT_EQ(g->rails(), 3);
  EXPECT_EQ(g->cpu_count(), 8);
  ASSERT_EQ(g->gpus().size(), 2u);
  EXPECT_EQ(g->gpus()[0].index, 0);
  EXPECT_EQ(g->gpus()[0].pci_bus_id, "0000:18:00.0");
  EXPECT_EQ(g->gpus()[1].numa_node, 1);
  ASSERT_EQ(g->numa_nodes().size(), 2u);
  EXPECT_EQ(g->numa_nodes()[0].id, 0);
  EXPECT_EQ(g->numa_nodes()[1].cpus, (std::vector<int>{4, 5, 6, 7}));

  // Three rails (two on eth0), then the NIC no rail uses.
  ASSERT_EQ(g->nics().size(), 4u);
  const NicNode& r0 = g->nics()[0];
  EXPECT_EQ(r0.name, "r0");
  EXPECT_EQ(r0.device, "eth0");
  EXPECT_EQ(r0.rail, 0);
  EXPECT_EQ(r0.speed_gbps, 100);  // from the NIC
  EXPECT_EQ(r0.numa_node, 0);
  EXPECT_EQ(r0.state, "up");
  const NicNode& r1 = g->nics()[1];
  EXPECT_EQ(r1.rail, 1);
  EXPECT_EQ(r1.speed_gbps, 200);  // the rail's own value wins
  EXPECT_EQ(r1.rdma_device, "mlx5_1:1");
  EXPECT_EQ(g->nics()[2].rail, 2);
  EXPECT_EQ(g->nics()[2].device, "eth0");
  const NicNode& lo = g->nics()[3];
  EXPECT_EQ(lo.name, "lo");
  EXPECT_EQ(lo.rail, -1);
  EXPECT_TRUE(lo.is_virtual);
  EXPECT_EQ(lo.numa_node, -1);

  ASSERT_TRUE(g->intra().has_value());
  EXPECT_DOUBLE_EQ(g->intra()->beta_bytes_per_s, 450e9);
  EXPECT_FALSE(g->fabric().has_value());
}

TEST(TopologyGraph, TextTreeGroupsByNuma) {
  absl::StatusOr<TopologyGraph> g = TopologyGraph::FromProto(*ParseTopology(kNode));
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string text = g->ToText();
  EXPECT_EQ(text,
            "node gpu-a: 2 NUMA nodes, 8 CPUs, 2 GPUs, 3 rails, 1 other NIC\n"
            "  intra-node links: alpha " +
                FormatDuration(0.5e-6) + ", " + FormatBandwidth(450e9) +
                " per port\n"
                "  numa 0: 4 CPUs 0-3\n"
                "    gpu 0  H100  pci 0000:18:00.0\n"
                "    nic r0  device eth0  100 Gbit/s  rail 0 (tcp)  up\n"
                "    nic r2  device eth0  100 Gbit/s  rail 2 (tcp)  up\n"
                "  numa 1: 4 CPUs 4-7\n"
                "    gpu 1  H100  pci 0000:9a:00.0\n"
                "    nic r1  device mlx5_1:1  200 Gbit/s  rail 1 (tcp)  up\n"
                "  numa ?: placement unknown\n"
                "    nic lo  speed ?  unknown  virtual\n");
}

TEST(TopologyGraph, FabricInTheTree) {
  absl::StatusOr<v1::NodeTopology> topo = ParseTopology(R"({
    "node": "n", "intra": {"alpha": "1us", "bandwidth": "100GB/s"},
    "fabric": {"kind": "three_tier", "nodes": 8, "ranks_per_node": 4, "nodes_per_rack": 2,
               "oversubscription": 3, "inter": {"alpha": "5us", "bandwidth": "400Gbit/s"},
               "in_network_reduction": true, "cpu_overhead": "2us"}})");
  ASSERT_TRUE(topo.ok()) << topo.status();
  absl::StatusOr<TopologyGraph> g = TopologyGraph::FromProto(*topo);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(g->fabric().has_value());
  EXPECT_EQ(g->fabric()->nranks(), 32);
  const std::string text = g->ToText();
  EXPECT_THAT(text, HasSubstr("fabric three_tier: 8 nodes x 4 ranks = 32 ranks, 1 rail per node\n"
                              "  4 racks of 2 nodes, leaf->spine 3:1 oversubscribed\n"
                              "  intra-node links: alpha " +
                              FormatDuration(1e-6) + ", " + FormatBandwidth(100e9) +
                              " per port\n"
                              "  inter-node links: alpha " +
                              FormatDuration(5e-6) + ", " + FormatBandwidth(50e9) +
                              " per NIC\n"
                              "  cpu overhead " +
                              FormatDuration(2e-6) +
                              "\n"
                              "  in-network reduction (SHARP)\n"));
}

TEST(TopologyGraph, JsonReadsBackAsTheSameTopology) {
  absl::StatusOr<v1::NodeTopology> topo = ParseTopology(kNode);
  ASSERT_TRUE(topo.ok()) << topo.status();
  absl::StatusOr<TopologyGraph> g = TopologyGraph::FromProto(*topo);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string json = g->ToJson();
  EXPECT_THAT(json, HasSubstr("\"pci_bus_id\": \"0000:18:00.0\""));
  EXPECT_THAT(json, HasSubstr("\"is_virtual\": true"));
  absl::StatusOr<v1::NodeTopology> back = ParseTopology(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*back, *topo));
}

TEST(TopologyGraph, RejectsWhatTheFileParserRejects) {
  v1::NodeTopology topo;
  topo.add_numa_nodes()->set_cpus("0-");
  EXPECT_EQ(TopologyGraph::FromProto(topo).status().code(), absl::StatusCode::kInvalidArgument);
  topo.Clear();
  topo.add_gpus()->set_index(2);
  topo.add_gpus()->set_index(2);
  EXPECT_THAT(TopologyGraph::FromProto(topo).status().message(), HasSubstr("appears twice"));
  topo.Clear();
  topo.mutable_fabric()->set_kind("mesh");
  EXPECT_THAT(TopologyGraph::FromProto(topo).status().message(), HasSubstr("fabric.kind"));
}

}  // namespace
}  // namespace railyard::topology
