// `railctl topo` against real daemons (with and without --topology), without one (discovery,
// noted on stderr) and on an example topology file.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "daemon/topology/units.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "railyard/v1/topology.pb.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/peer_tls.h"
#include "tests/integration/railctl_run.h"

namespace railyard::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

v1::NodeTopology ParseJson(const std::string& json) {
  v1::NodeTopology topo;
  auto status = google::protobuf::util::JsonStringToMessage(json, &topo);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return topo;
}

int OnlineCpus(const v1::NodeTopology& topo) {
  int n = 0;
  for (const v1::NumaNode& numa : topo.numa_nodes()) {
    std::stringstream ss(numa.cpus());
    std::string part;
    while (std::getline(ss, part, ',')) {
      const size_t dash = part.find('-');
      n += dash == std::string::npos ? 1 : std::stoi(part.substr(dash + 1)) - std::stoi(part) + 1;
    }
  }
  return n;
}

TEST(RailctlTopo, DaemonServesItsFileMergedWithDiscovery) {
  const std::string dir = MakeTempDir();
  const std::string topo = dir + "/node.json";
  std::ofstream(topo) << R"({"node": "vnode-t",
    "rails": [{"name": "rail0", "device": "lo"}, {"name": "rail1", "device": "lo", "speed_gbps": 25}],
    "gpus": [{"index": 0, "name": "Fake GPU", "pci_bus_id": "0000:01:00.0", "numa_node": 0}],
    "intra": {"alpha": "0.5us", "bandwidth": "450GB/s"}})";
  MakePeerCerts(dir + "/certs", {"vnode-t"});
  std::vector<std::string> flags = PeerTlsFlags(dir + "/certs", "vnode-t");
  flags.insert(flags.end(), {"--peer_listen=127.0.0.1:0", "--topology=" + topo});
  DaemonProcess daemon(flags);
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  // UCX still runs on the declared rails.
  const v1::StatusResponse status = daemon.Status();
  EXPECT_THAT(std::vector<std::string>(status.rails().begin(), status.rails().end()),
              ::testing::ElementsAre("rail0@lo", "rail1@lo"));

  RailctlRun r = Railctl(dir, "topo --json --socket " + daemon.socket());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const v1::NodeTopology got = ParseJson(r.out);
  EXPECT_EQ(got.node(), "vnode-t");
  ASSERT_EQ(got.rails_size(), 2);
  EXPECT_EQ(got.rails(0).name(), "rail0");
  EXPECT_EQ(got.rails(0).device(), "lo");
  EXPECT_EQ(got.rails(1).speed_gbps(), 25);
  ASSERT_EQ(got.gpus_size(), 1);  // the file's, not discovery's
  EXPECT_EQ(got.gpus(0).name(), "Fake GPU");
  EXPECT_EQ(got.gpus(0).pci_bus_id(), "0000:01:00.0");
  EXPECT_EQ(got.intra().bandwidth(), "450GB/s");
  // Discovered: every online CPU, and lo as a virtual NIC.
  EXPECT_EQ(OnlineCpus(got), ::sysconf(_SC_NPROCESSORS_ONLN));
  bool saw_lo = false;
  for (const v1::Nic& nic : got.nics()) {
    if (nic.name() == "lo") saw_lo = nic.is_virtual();
  }
  EXPECT_TRUE(saw_lo) << r.out;

  r = Railctl(dir, "topo --socket " + daemon.socket());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("node vnode-t: "));
  EXPECT_THAT(r.out, HasSubstr("gpu 0  Fake GPU  pci 0000:01:00.0"));
  EXPECT_THAT(r.out, HasSubstr("nic rail1  device lo  25 Gbit/s  rail 1 (tcp)"));
  std::filesystem::remove_all(dir);
}

TEST(RailctlTopo, DaemonWithoutTopologyFile) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  RailctlRun r = Railctl(daemon.dir(), "topo --json --socket=" + daemon.socket());
  ASSERT_EQ(r.code, 0) << r.err;
  const v1::NodeTopology got = ParseJson(r.out);
  EXPECT_EQ(got.node(), "itest");
  ASSERT_EQ(got.rails_size(), 1);
  EXPECT_EQ(got.rails(0).name(), "rail0");
  EXPECT_EQ(got.rails(0).device(), "");
  EXPECT_GE(got.nics_size(), 1);
  EXPECT_EQ(OnlineCpus(got), ::sysconf(_SC_NPROCESSORS_ONLN));
}

TEST(RailctlTopo, NoDaemonFallsBackToDiscovery) {
  const std::string dir = MakeTempDir();
  RailctlRun r = Railctl(dir, "topo --json --socket " + dir + "/nobody.sock");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("no daemon answered at " + dir + "/nobody.sock"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  const v1::NodeTopology got = ParseJson(r.out);
  EXPECT_EQ(got.rails_size(), 0);
  EXPECT_GE(got.nics_size(), 1);

  r = Railctl(dir, "topo --discover");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, StartsWith("node "));
  std::filesystem::remove_all(dir);
}

TEST(RailctlTopo, FileWithItsFabric) {
  const std::string dir = MakeTempDir();
  RailctlRun r =
      Railctl(dir, std::string("topo --file ") + EXAMPLE_TOPOLOGIES + "/rail_optimized_16x8.json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("fabric rail_optimized: 16 nodes x 8 ranks = 128 ranks, 8 rails "
                               "per node\n"));
  EXPECT_THAT(r.out, HasSubstr("inter-node links: alpha " + topology::FormatDuration(5e-6) + ", " +
                               topology::FormatBandwidth(50e9) + " per NIC"));

  r = Railctl(dir, "topo --file " + dir + "/missing.json");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot read topology file " + dir + "/missing.json"));
  std::ofstream(dir + "/bad.json") << R"({"fabric": {"kind": "hypercube", "nodes": 4}})";
  r = Railctl(dir, "topo --file " + dir + "/bad.json");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("fabric.kind: unknown kind 'hypercube'"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace railyard::testing
