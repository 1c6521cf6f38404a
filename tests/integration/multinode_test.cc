// Several railyardd on loopback ("virtual nodes", each with its own socket, peer port and a
// topology file declaring 2 rails): every op x every algorithm across daemons, checked byte for
// byte, and a daemon killed mid-run.
#include <iostream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/rank_cases.h"

namespace railyard::testing {
namespace {

using ::testing::HasSubstr;

// n virtual nodes; extra flags go to every daemon.
class VirtualCluster {
 public:
  VirtualCluster(int n, std::vector<std::string> extra = {}) : dir_(MakeTempDir()) {
    for (int i = 0; i < n; ++i) {
      const std::string topo = dir_ + "/node" + std::to_string(i) + ".json";
      std::ofstream(topo) << "{\"node\": \"vnode" << i
                          << "\", \"rails\": [{\"name\": \"rail0\", \"device\": \"lo\"},"
                             " {\"name\": \"rail1\", \"device\": \"lo\"}]}\n";
      std::vector<std::string> flags = {"--peer_listen=127.0.0.1:0", "--topology=" + topo};
      flags.insert(flags.end(), extra.begin(), extra.end());
      daemons_.push_back(std::make_unique<DaemonProcess>(flags));
    }
  }
  ~VirtualCluster() {
    daemons_.clear();
    std::filesystem::remove_all(dir_);
  }
  DaemonProcess& operator[](int i) { return *daemons_[i]; }
  int size() const { return static_cast<int>(daemons_.size()); }
  std::string Sockets() const {
    std::string s;
    for (const auto& d : daemons_) s += (s.empty() ? "" : ",") + d->socket();
    return s;
  }
  bool ready() const {
    for (const auto& d : daemons_) {
      if (!d->ready()) return false;
    }
    return true;
  }
  std::string Logs() const {
    std::string s;
    for (const auto& d : daemons_) s += d->Log() + "\n";
    return s;
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

// ranks_per_node ranks on each daemon run the collective matrix (rank_cases.h) together.
void RunMatrix(VirtualCluster& cluster, int ranks_per_node, const std::string& algo) {
  auto c = Client::Connect(cluster[0].Options());
  ASSERT_TRUE(c.ok()) << c.status();
  auto id = (*c)->CreateCommId();
  ASSERT_TRUE(id.ok());
  const int nranks = cluster.size() * ranks_per_node;
  if (!algo.empty()) ::setenv("RAILYARD_ALGO", algo.c_str(), 1);
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < nranks; ++r) {
    const DaemonProcess& d = cluster[r / ranks_per_node];
    ranks.push_back(std::make_unique<Process>(
        std::vector<std::string>{RANK_PATH, "--mode=cases", "--socket=" + d.socket(),
                                 "--comm_id=" + *id, "--rank=" + std::to_string(r),
                                 "--nranks=" + std::to_string(nranks)},
        cluster.dir() + "/" + algo + "-rank" + std::to_string(r) + ".log"));
  }
  ::unsetenv("RAILYARD_ALGO");
  const std::string pass = "PASS " + std::to_string(AllCases(nranks).size());
  for (int r = 0; r < nranks; ++r) {
    auto code = ranks[r]->Wait(std::chrono::seconds(300));
    ASSERT_TRUE(code.has_value()) << algo << " rank " << r << " hung";
    EXPECT_EQ(*code, 0) << algo << " rank " << r << ":\n" << ranks[r]->Output();
    EXPECT_THAT(ranks[r]->Output(), HasSubstr(pass)) << algo;
  }
}

class MultiNodeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MultiNodeTest, EveryCollectiveAcrossThreeDaemons) {
  VirtualCluster cluster(3);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  RunMatrix(cluster, 2, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Algorithms, MultiNodeTest,
                         ::testing::Values("", "ring", "tree", "rhd", "hier", "direct"),
                         [](const auto& info) {
                           return info.param.empty() ? std::string("default") : info.param;
                         });

TEST(MultiNodeTest, FourDaemonsWithOneThreeAndTwoRanks) {
  VirtualCluster cluster(4);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  RunMatrix(cluster, 1, "");
  RunMatrix(cluster, 3, "hier");
}

TEST(MultiNodeTest, RailyardPerfAcrossDaemons) {
  VirtualCluster cluster(3);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  for (const char* op :
       {"allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall"}) {
    Process perf({PERF_PATH, "--op", op, "-b", "8", "-e", "1M", "-f", "32", "-n", "3", "-w", "1",
                  "-c", "1", "--daemons", cluster.Sockets(), "--ranks-per-daemon", "2"},
                 cluster.dir() + "/perf-" + op + ".log");
    auto code = perf.Wait(std::chrono::seconds(120));
    ASSERT_TRUE(code.has_value()) << op << " hung";
    EXPECT_EQ(*code, 0) << op << ":\n" << perf.Output();
    EXPECT_THAT(perf.Output(), HasSubstr("# Avg bus bandwidth")) << op;
  }
}

TEST(MultiNodeTest, KilledDaemonFailsEverySurvivingRankInBoundedTime) {
  VirtualCluster cluster(3, {"--peer_timeout=3s"});
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  Process perf({PERF_PATH, "--op", "allreduce", "-b", "1M", "-e", "1M", "-n", "100000", "-w", "1",
                "-c", "0", "--daemons", cluster.Sockets(), "--ranks-per-daemon", "2"},
               cluster.dir() + "/perf-kill.log");
  // The header names the communicator once every rank has joined; then iterations are running.
  ASSERT_TRUE(perf.WaitForOutput("#  Comm ", std::chrono::seconds(60))) << perf.Output();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  cluster[2].process().Signal(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  auto code = perf.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value()) << "railyard-perf hung after a daemon died:\n" << perf.Output();
  EXPECT_NE(*code, 0) << perf.Output();
  // Bounded: UCX reports the dead peer's endpoints at once; heartbeats (3 s here) catch the rest.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_THAT(perf.Output(), HasSubstr("rank"));
  // The surviving daemons still serve.
  EXPECT_TRUE(cluster[0].ready());
  EXPECT_TRUE(cluster[1].ready());
}

}  // namespace
}  // namespace railyard::testing

namespace railyard::testing {
namespace {

TEST(MultiNodeFailureTest, SurvivorsGetUnavailableNamingTheDeadNode) {
  VirtualCluster cluster(3, {"--peer_timeout=3s"});
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  auto c = Client::Connect(cluster[0].Options());
  ASSERT_TRUE(c.ok());
  auto id = (*c)->CreateCommId();
  ASSERT_TRUE(id.ok());
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(std::make_unique<Process>(
        std::vector<std::string>{RANK_PATH, r == 2 ? "--mode=idle" : "--mode=submit",
                                 "--socket=" + cluster[r].socket(), "--comm_id=" + *id,
                                 "--rank=" + std::to_string(r), "--nranks=3", "--count=100000"},
        cluster.dir() + "/fail-rank" + std::to_string(r) + ".log"));
  }
  ASSERT_TRUE(ranks[2]->WaitForOutput("READY", std::chrono::seconds(30))) << ranks[2]->Output();
  ASSERT_TRUE(ranks[0]->WaitForOutput("SUBMITTED", std::chrono::seconds(30)));
  ASSERT_TRUE(ranks[1]->WaitForOutput("SUBMITTED", std::chrono::seconds(30)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  cluster[2].process().Signal(SIGKILL);
  for (int r = 0; r < 2; ++r) {
    auto code = ranks[r]->Wait(std::chrono::seconds(40));
    ASSERT_TRUE(code.has_value()) << "rank " << r << " hung after node vnode2 died";
    EXPECT_EQ(*code, 3) << ranks[r]->Output();
    EXPECT_THAT(ranks[r]->Output(), HasSubstr("RESULT code=14"));  // UNAVAILABLE
    EXPECT_THAT(ranks[r]->Output(), HasSubstr("vnode2"));
    std::cout << "rank " << r << " after "
              << std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - start)
                     .count()
              << " ms: " << ranks[r]->Output();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  // The communicator stays failed: a new collective on it is refused at once (ABORTED).
  EXPECT_TRUE(cluster[0].ready());
  EXPECT_TRUE(cluster[1].ready());
}

}  // namespace
}  // namespace railyard::testing
