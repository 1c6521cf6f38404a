// Discovery on fake sysfs/procfs trees built in a temp dir (exact results), on this machine (at
// least one NIC, every online CPU), and its merge into a daemon's declared topology.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/topology/discovery.h"
#include "daemon/topology/topology_graph.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard::topology {
namespace {

namespace fs = std::filesystem;

class FakeRoot {
 public:
  FakeRoot() {
    char tmpl[] = "/tmp/rytopo-XXXXXX";
    root_ = ::mkdtemp(tmpl);
  }
  ~FakeRoot() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  void Write(const std::string& rel, const std::string& text) const {
    const fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void Dir(const std::string& rel) const { fs::create_directories(fs::path(root_) / rel); }
  const std::string& path() const { return root_; }

 private:
  std::string root_;
};

// A 2-socket GPU node: eth0 (100G, NUMA 1), eno1 (down, speed -1, numa -1), lo, a veth, IPoIB
// ib0 on mlx5_0 (400G NDR), mlx5_1 without netdev (200G HDR), two GPUs, two NUMA nodes.
void BuildGpuNode(const FakeRoot& r) {
  r.Write("proc/sys/kernel/hostname", "fake-node\n");
  r.Write("sys/class/net/eth0/operstate", "up\n");
  r.Write("sys/class/net/eth0/speed", "100000\n");
  r.Write("sys/class/net/eth0/device/numa_node", "1\n");
  r.Write("sys/class/net/eno1/operstate", "down\n");
  r.Write("sys/class/net/eno1/speed", "-1\n");
  r.Write("sys/class/net/eno1/device/numa_node", "-1\n");
  r.Write("sys/class/net/lo/operstate", "unknown\n");  // no speed file: unreadable
  r.Write("sys/class/net/veth-a/operstate", "up\n");
  r.Write("sys/class/net/veth-a/speed", "10000\n");
  r.Write("sys/class/net/ib0/operstate", "up\n");
  r.Write("sys/class/net/ib0/speed", "-1\n");
  r.Write("sys/class/net/ib0/device/numa_node", "0\n");
  r.Write("sys/class/infiniband/mlx5_0/ports/1/rate", "400 Gb/sec (4X NDR)\n");
  r.Write("sys/class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n");
  r.Write("sys/class/infiniband/mlx5_0/ports/1/link_layer", "InfiniBand\n");
  r.Dir("sys/class/infiniband/mlx5_0/device/net/ib0");
  r.Write("sys/class/infiniband/mlx5_0/device/numa_node", "0\n");
  r.Write("sys/class/infiniband/mlx5_1/ports/1/rate", "200 Gb/sec (4X HDR)\n");
  r.Write("sys/class/infiniband/mlx5_1/ports/1/state", "1: DOWN\n");
  r.Write("sys/class/infiniband/mlx5_1/ports/1/link_layer", "Ethernet\n");
  r.Write("sys/class/infiniband/mlx5_1/device/numa_node", "1\n");
  r.Write("sys/devices/system/node/node0/cpulist", "0-3,8-11\n");
  r.Write("sys/devices/system/node/node1/cpulist", "4-7,12-15\n");
  r.Write("sys/devices/system/node/possible", "0-1\n");
  r.Write("sys/devices/system/cpu/online", "0-15\n");
  // Listed out of bus order: indices follow the PCI bus id.
  r.Write("proc/driver/nvidia/gpus/0000:9A:00.0/information",
          "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nBus Type: \t PCIe\n"
          "Bus Location: \t 0000:9A:00.0\nDevice Minor: \t 1\n");
  r.Write("proc/driver/nvidia/gpus/0000:18:00.0/information",
          "Model: \t\t NVIDIA H100 80GB HBM3\nBus Location: \t 0000:18:00.0\nDevice Minor: \t 0\n");
  r.Write("sys/bus/pci/devices/0000:18:00.0/numa_node", "0\n");
  r.Write("sys/bus/pci/devices/0000:9a:00.0/numa_node", "1\n");
}

const v1::Nic* Find(const v1::NodeTopology& t, const std::string& name) {
  for (const v1::Nic& nic : t.nics()) {
    if (nic.name() == name) return &nic;
  }
  return nullptr;
}

TEST(Discovery, FakeGpuNode) {
  FakeRoot root;
  BuildGpuNode(root);
  absl::StatusOr<v1::NodeTopology> t = Discover(root.path());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->node(), "fake-node");
  EXPECT_EQ(t->rails_size(), 0);
  ASSERT_EQ(t->nics_size(), 6);  // five netdevs + mlx5_1's port

  const v1::Nic* eth0 = Find(*t, "eth0");
  ASSERT_NE(eth0, nullptr);
  EXPECT_EQ(eth0->state(), "up");
  EXPECT_EQ(eth0->speed_gbps(), 100);
  ASSERT_TRUE(eth0->has_numa_node());
  EXPECT_EQ(eth0->numa_node(), 1);
  EXPECT_FALSE(eth0->is_virtual());
  EXPECT_EQ(eth0->rdma_device(), "");

  const v1::Nic* eno1 = Find(*t, "eno1");
  ASSERT_NE(eno1, nullptr);
  EXPECT_EQ(eno1->state(), "down");
  EXPECT_EQ(eno1->speed_gbps(), 0);
  EXPECT_FALSE(eno1->has_numa_node());
  EXPECT_FALSE(eno1->is_virtual());

  const v1::Nic* lo = Find(*t, "lo");
  ASSERT_NE(lo, nullptr);
  EXPECT_TRUE(lo->is_virtual());
  EXPECT_EQ(lo->speed_gbps(), 0);
  EXPECT_EQ(lo->state(), "unknown");
  const v1::Nic* veth = Find(*t, "veth-a");
  ASSERT_NE(veth, nullptr);
  EXPECT_TRUE(veth->is_virtual());
  EXPECT_EQ(veth->speed_gbps(), 10);

  const v1::Nic* ib0 = Find(*t, "ib0");
  ASSERT_NE(ib0, nullptr);
  EXPECT_EQ(ib0->rdma_device(), "mlx5_0:1");
  EXPECT_EQ(ib0->speed_gbps(), 400);
  EXPECT_EQ(ib0->link_layer(), "InfiniBand");
  EXPECT_EQ(ib0->numa_node(), 0);
  EXPECT_EQ(ib0->state(), "up");

  const v1::Nic* mlx1 = Find(*t, "mlx5_1:1");
  ASSERT_NE(mlx1, nullptr);
  EXPECT_EQ(mlx1->rdma_device(), "mlx5_1:1");
  EXPECT_EQ(mlx1->speed_gbps(), 200);
  EXPECT_EQ(mlx1->state(), "DOWN");
  EXPECT_EQ(mlx1->link_layer(), "Ethernet");
  EXPECT_EQ(mlx1->numa_node(), 1);

  ASSERT_EQ(t->numa_nodes_size(), 2);
  EXPECT_EQ(t->numa_nodes(0).id(), 0);
  EXPECT_EQ(t->numa_nodes(0).cpus(), "0-3,8-11");
  EXPECT_EQ(t->numa_nodes(1).id(), 1);
  EXPECT_EQ(t->numa_nodes(1).cpus(), "4-7,12-15");

  ASSERT_EQ(t->gpus_size(), 2);
  EXPECT_EQ(t->gpus(0).index(), 0);
  EXPECT_EQ(t->gpus(0).name(), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(t->gpus(0).pci_bus_id(), "0000:18:00.0");
  EXPECT_EQ(t->gpus(0).numa_node(), 0);
  EXPECT_EQ(t->gpus(1).index(), 1);
  EXPECT_EQ(t->gpus(1).pci_bus_id(), "0000:9a:00.0");
  EXPECT_EQ(t->gpus(1).numa_node(), 1);

  absl::StatusOr<TopologyGraph> g = TopologyGraph::FromProto(*t);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->cpu_count(), 16);
}

TEST(Discovery, WithoutNumaEveryOnlineCpuIsNodeZero) {
  FakeRoot root;
  root.Write("sys/devices/system/cpu/online", "0-5\n");
  root.Write("sys/class/net/lo/operstate", "unknown\n");
  absl::StatusOr<v1::NodeTopology> t = Discover(root.path());
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->numa_nodes_size(), 1);
  EXPECT_EQ(t->numa_nodes(0).id(), 0);
  EXPECT_EQ(t->numa_nodes(0).cpus(), "0-5");
  EXPECT_EQ(t->gpus_size(), 0);
  ASSERT_EQ(t->nics_size(), 1);
  EXPECT_EQ(t->node(), "");
}

TEST(Discovery, MissingRootIsNotFound) {
  absl::StatusOr<v1::NodeTopology> t = Discover("/nonexistent-railyard-root");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(t.status().message(), ::testing::HasSubstr("/nonexistent-railyard-root/sys"));
}

TEST(Discovery, ThisMachine) {
  absl::StatusOr<v1::NodeTopology> t = Discover("/");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_GE(t->nics_size(), 1);
  absl::StatusOr<TopologyGraph> g = TopologyGraph::FromProto(*t);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->cpu_count(), ::sysconf(_SC_NPROCESSORS_ONLN));
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ(t->node(), host);
}

TEST(Discovery, MergeKeepsDeclaredRailsAndFillsTheRest) {
  FakeRoot root;
  BuildGpuNode(root);
  absl::StatusOr<v1::NodeTopology> found = Discover(root.path());
  ASSERT_TRUE(found.ok()) << found.status();
  v1::NodeTopology declared;
  declared.set_node("declared");
  auto* r0 = declared.add_rails();
  r0->set_name("rail0");
  r0->set_device("eth0");
  auto* r1 = declared.add_rails();
  r1->set_name("rail1");
  r1->set_device("mlx5_0:1");
  r1->set_speed_gbps(123);
  r1->set_numa_node(7);
  auto* r2 = declared.add_rails();
  r2->set_name("rail2");  // UCX's choice: nothing to fill
  const v1::NodeTopology merged = MergeDiscovered(declared, *found);
  EXPECT_EQ(merged.node(), "declared");
  ASSERT_EQ(merged.rails_size(), 3);
  EXPECT_EQ(merged.rails(0).device(), "eth0");
  EXPECT_EQ(merged.rails(0).speed_gbps(), 100);
  EXPECT_EQ(merged.rails(0).numa_node(), 1);
  EXPECT_EQ(merged.rails(1).speed_gbps(), 123);  // declared values win
  EXPECT_EQ(merged.rails(1).numa_node(), 7);
  EXPECT_EQ(merged.rails(2).speed_gbps(), 0);
  EXPECT_FALSE(merged.rails(2).has_numa_node());
  EXPECT_EQ(merged.gpus_size(), 2);
  EXPECT_EQ(merged.numa_nodes_size(), 2);
  EXPECT_EQ(merged.nics_size(), 6);

  // A file that lists GPUs keeps its own.
  declared.add_gpus()->set_index(0);
  EXPECT_EQ(MergeDiscovered(declared, *found).gpus_size(), 1);
}

}  // namespace
}  // namespace railyard::topology
