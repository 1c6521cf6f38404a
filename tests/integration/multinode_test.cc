// Several railyardd on loopback ("virtual nodes", each with its own socket, peer port and a
// topology file declaring 2 rails): every op x every algorithm across daemons, checked byte for
// byte, and a daemon killed mid-run.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "railyard/v1/peer.grpc.pb.h"
#include "tests/integration/cluster_ranks.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/peer_tls.h"
#include "tests/integration/rank_cases.h"
#include "tests/integration/virtual_cluster.h"

namespace railyard::testing {
namespace {

using ::testing::HasSubstr;

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
                         ::testing::Values("", "ring", "tree", "rhd", "rd", "hier", "direct"),
                         [](const auto& info) {
                           return info.param.empty() ? std::string("default") : info.param;
                         });

// Plaintext stays covered: --peer_insecure daemons (what the loopback demo runs) still work, and
// say loudly that they are insecure.
TEST(MultiNodeTest, FourDaemonsWithOneThreeAndTwoRanks) {
  VirtualCluster cluster(4, {}, PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  EXPECT_THAT(cluster[0].Log(), HasSubstr("insecure: the peer service is plaintext"));
  EXPECT_THAT(cluster[0].Log(), HasSubstr("plaintext (--peer_insecure)"));
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

// --latency_file records one line per timed iteration on rank 0; --interval_us spaces their
// starts (a latency-sensitive job's duty cycle in bench/fairness.sh).
TEST(MultiNodeTest, RailyardPerfLatencyFileWithADutyCycle) {
  VirtualCluster cluster(2);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  const std::string file = cluster.dir() + "/latencies";
  const auto start = std::chrono::steady_clock::now();
  Process perf(
      {PERF_PATH, "--op", "allreduce", "-b", "64K", "-e", "64K", "-n", "10", "-w", "1", "-c", "1",
       "--daemons", cluster.Sockets(), "--latency_file", file, "--interval_us", "50000"},
      cluster.dir() + "/perf-latency.log");
  auto code = perf.Wait(std::chrono::seconds(120));
  ASSERT_TRUE(code.has_value()) << "railyard-perf hung";
  ASSERT_EQ(*code, 0) << perf.Output();
  // Out-of-place, then in-place: ten timed iterations each whose starts are 50 ms apart.
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(900));
  std::ifstream in(file);
  int lines = 0;
  size_t bytes = 0;
  double seconds = 0, total = 0;
  while (in >> bytes >> seconds) {
    ++lines;
    EXPECT_EQ(bytes, 65536u);
    EXPECT_GT(seconds, 0.0);
    total += seconds;
  }
  EXPECT_EQ(lines, 20);
  // Were the waits counted, the times would sum to >= 900 ms.
  EXPECT_LT(total, 0.8) << "the iterations' times include the waits between them";
}

// Two jobs whose communicator ids agree in the 16 bits of std::hash the old tag scheme kept, in
// lockstep on the same two daemons (same sequence numbers, node indices and steps): under that
// scheme their receives matched each other's messages. Every result must be the job's own.
TEST(MultiNodeTagTest, TwoJobsWhoseIdsCollidedUnderTheOldTagsKeepTheirOwnData) {
  VirtualCluster cluster(2);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  auto c = Client::Connect(cluster[0].Options());
  ASSERT_TRUE(c.ok()) << c.status();
  auto made = (*c)->CreateCommId();
  ASSERT_TRUE(made.ok()) << made.status();
  const std::string coordinator = made->substr(made->find('@'));
  // Birthday search for two 32-hex nonces with the same low 16 hash bits (a few hundred tries).
  std::map<uint64_t, std::string> by_bits;
  std::string ids[2];
  for (uint64_t i = 0; ids[0].empty() && i < 1'000'000; ++i) {
    char nonce[33];
    std::snprintf(nonce, sizeof nonce, "%016llx%016llx", 0x5eedULL,
                  static_cast<unsigned long long>(i));
    const std::string id = std::string("ry1-") + nonce + coordinator;
    auto [it, inserted] = by_bits.emplace(std::hash<std::string>{}(id)&0xFFFF, id);
    if (!inserted) {
      ids[0] = it->second;
      ids[1] = id;
    }
  }
  ASSERT_FALSE(ids[0].empty());
  ASSERT_EQ(std::hash<std::string>{}(ids[0]) & 0xFFFF, std::hash<std::string>{}(ids[1]) & 0xFFFF);
  ::setenv("RAILYARD_ALGO", "ring", 1);
  std::vector<std::unique_ptr<Process>> ranks;
  for (int job = 0; job < 2; ++job) {
    for (int r = 0; r < 2; ++r) {
      ranks.push_back(std::make_unique<Process>(
          std::vector<std::string>{RANK_PATH, "--mode=lockstep", "--socket=" + cluster[r].socket(),
                                   "--job=tagjob" + std::to_string(job), "--comm_id=" + ids[job],
                                   "--rank=" + std::to_string(r), "--nranks=2",
                                   "--seed=" + std::to_string(job + 1), "--count=16384",
                                   "--iters=2000"},
          cluster.dir() + "/tag-job" + std::to_string(job) + "-rank" + std::to_string(r) + ".log"));
    }
  }
  ::unsetenv("RAILYARD_ALGO");
  for (size_t i = 0; i < ranks.size(); ++i) {
    auto code = ranks[i]->Wait(std::chrono::seconds(300));
    ASSERT_TRUE(code.has_value()) << "job " << i / 2 << " rank " << i % 2 << " hung";
    EXPECT_EQ(*code, 0) << "job " << i / 2 << " rank " << i % 2 << ":\n" << ranks[i]->Output();
    EXPECT_THAT(ranks[i]->Output(), HasSubstr("LOCKSTEP 2000 nodes 2"));  // InitComm's nnodes
  }
}

TEST(MultiNodeTest, KilledDaemonFailsEverySurvivingRankInBoundedTime) {
  VirtualCluster cluster(3, {"--peer_timeout=3s"});
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  Process perf({PERF_PATH, "--op", "allreduce", "-b", "1M", "-e", "1M", "-n", "100000", "-w", "1",
                "-c", "0", "--daemons", cluster.Sockets(), "--ranks-per-daemon", "2"},
               cluster.dir() + "/perf-kill.log");
  // The header names the communicator once every rank has joined; then iterations are running.
  ASSERT_TRUE(perf.WaitForOutput("# Using devices", std::chrono::seconds(60))) << perf.Output();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  cluster[2].process().Signal(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  auto code = perf.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value()) << "railyard-perf hung after a daemon died:\n" << perf.Output();
  EXPECT_NE(*code, 0) << perf.Output();
  std::cout << "railyard-perf exited "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - start)
                   .count()
            << " ms after the kill:\n"
            << perf.Output();
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

namespace railyard::testing {
namespace {

TEST(MultiNodeFailureTest, MismatchAcrossNodesFailsInBoundedTime) {
  VirtualCluster cluster(2);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  RankPerNode ranks = JoinRankPerNode(cluster, 1 << 20);
  ASSERT_TRUE(ranks.ok);
  std::vector<Buffer>& bufs = ranks.bufs;
  std::vector<Comm>& comms = ranks.comms;
  CollectiveOptions o;
  o.timeout = std::chrono::milliseconds(1500);
  const auto start = std::chrono::steady_clock::now();
  // Each daemon sees one agreeing local rank; only the nodes disagree (count 1000 vs 9000).
  Work w0 = comms[0].AllReduce(bufs[0], bufs[0], 1000, DataType::kFloat32, RedOp::kSum, o);
  Work w1 = comms[1].AllReduce(bufs[1], bufs[1], 9000, DataType::kFloat32, RedOp::kSum, o);
  absl::Status s0 = w0.wait(std::chrono::seconds(30));
  absl::Status s1 = w1.wait(std::chrono::seconds(30));
  EXPECT_FALSE(s0.ok());
  EXPECT_FALSE(s1.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20)) << s0 << s1;
  // The communicator stays failed on both nodes.
  EXPECT_EQ(comms[0].Barrier().wait(std::chrono::seconds(10)).code(), absl::StatusCode::kAborted);
}

// A send and a receive on two daemons that disagree on the size. Only the receiving daemon
// knows both sizes. A shorter message in one frame (below 512 KiB, kDefaultSplitMinBytes)
// arrives whole with its trailer: INVALID_ARGUMENT with both sizes, at once, as on one node. A
// split frame (larger) of another size cannot be told from a foreign message: PERMISSION_DENIED
// at once, naming the mismatch as a cause. A longer message in one frame is cut off with its
// trailer and, like a foreign one, dropped while the receive waits for its own
// (docs/data-plane.md): it ends at the operation's deadline. The send completes either way.
TEST(MultiNodeFailureTest, SendRecvOfDifferentSizesAcrossNodesFailTheReceive) {
  VirtualCluster cluster(2);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  struct Case {
    int sent, received;
    absl::StatusCode code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {100, 101, absl::StatusCode::kInvalidArgument, "send/recv size mismatch on communicator "},
      {100000, 100001, absl::StatusCode::kInvalidArgument,
       "send/recv size mismatch on communicator "},
      {200000, 200001, absl::StatusCode::kPermissionDenied,
       "a send from rank 0 of another size than the 800004 bytes expected by rank 1"},
      {200001, 200000, absl::StatusCode::kPermissionDenied,
       "a send from rank 0 of another size than the 800000 bytes expected by rank 1"},
      {101, 100, absl::StatusCode::kDeadlineExceeded, "did not complete within 3s"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.sent, " sent, ", c.received, " received"));
    RankPerNode ranks = JoinRankPerNode(cluster, 1 << 20);
    ASSERT_TRUE(ranks.ok);
    CollectiveOptions o;
    o.timeout = std::chrono::seconds(3);
    const auto start = std::chrono::steady_clock::now();
    Work r = ranks.comms[1].Recv(ranks.bufs[1], c.received, DataType::kFloat32, 0, o);
    Work s = ranks.comms[0].Send(ranks.bufs[0], c.sent, DataType::kFloat32, 1, o);
    absl::Status rs = r.wait(std::chrono::seconds(30));
    absl::Status ss = s.wait(std::chrono::seconds(30));
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(rs.code(), c.code) << rs;
    EXPECT_THAT(std::string(rs.message()), HasSubstr(c.says)) << rs;
    EXPECT_TRUE(ss.ok()) << ss;
    if (c.code == absl::StatusCode::kDeadlineExceeded) {
      EXPECT_LT(took, std::chrono::seconds(15)) << rs;
      continue;
    }
    EXPECT_LT(took, std::chrono::seconds(2)) << rs;  // at once, not at the 3 s deadline
    EXPECT_THAT(std::string(rs.message()),
                HasSubstr(absl::StrCat("rank 1, which receives ", c.received, " x float (",
                                       c.received * 4, " bytes)")));
    if (c.code == absl::StatusCode::kInvalidArgument) {
      EXPECT_THAT(std::string(rs.message()),
                  HasSubstr(absl::StrCat("rank 0 sent ", c.sent * 4, " bytes")));
    }
  }
}

// The peer plane answers only members (daemon/comm/peer_input.h): a communicator of two daemons
// outlives several --peer_timeout periods (their heartbeats are answered), a daemon sharing none
// is refused a heartbeat, and only the other member may abort the communicator. Plaintext, so
// that this test can claim any node name: with mutual TLS the claims are checked against the
// caller's certificate as well (tests/integration/peer_plane_test.py).
TEST(MultiNodePeerPlaneTest, OnlyMembersHeartbeatAndAbort) {
  VirtualCluster cluster(2, {"--peer_timeout=2s"}, PeerPlane::kInsecure);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  RankPerNode ranks = JoinRankPerNode(cluster);
  ASSERT_TRUE(ranks.ok);
  std::vector<Comm>& comms = ranks.comms;
  // Both ranks' barrier: OK while the communicator lives.
  auto barrier = [&comms] {
    Work w0 = comms[0].Barrier();
    Work w1 = comms[1].Barrier();
    absl::Status s0 = w0.wait(std::chrono::seconds(10));
    absl::Status s1 = w1.wait(std::chrono::seconds(10));
    return s0.ok() ? s1 : s0;
  };
  std::this_thread::sleep_for(std::chrono::seconds(5));  // 2.5 x --peer_timeout
  const absl::Status alive = barrier();
  EXPECT_TRUE(alive.ok()) << alive << cluster.Logs();
  const v1::StatusResponse st = cluster[0].Status();
  ASSERT_EQ(st.comms_size(), 1);
  const std::string node0 = st.node_name();
  const std::string node1 = cluster[1].Status().node_name();
  auto peer =
      v1::Peer::NewStub(grpc::CreateChannel(st.peer_address(), grpc::InsecureChannelCredentials()));
  auto call = [](auto method) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return method(&ctx);
  };
  v1::HeartbeatResponse hb_resp;
  v1::HeartbeatRequest hb;
  hb.set_from_node("stranger");
  grpc::Status s =
      call([&](grpc::ClientContext* ctx) { return peer->Heartbeat(ctx, hb, &hb_resp); });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("Heartbeat from node stranger refused"));
  hb.set_from_node(node1);
  s = call([&](grpc::ClientContext* ctx) { return peer->Heartbeat(ctx, hb, &hb_resp); });
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(hb_resp.node_name(), node0);

  // Only the other member may read a communicator's progress (railctl diagnose), and an unknown
  // one is refused alike.
  v1::PeerCommStateRequest state_req;
  state_req.set_job_id("itest");
  state_req.set_comm_id(ranks.comm_id);
  v1::CommState state;
  for (const std::string& who : {std::string("stranger"), node0}) {
    state_req.set_from_node(who);
    s = call([&](grpc::ClientContext* ctx) { return peer->GetCommState(ctx, state_req, &state); });
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << who;
    EXPECT_THAT(s.error_message(), HasSubstr("is not another member node of communicator"));
  }
  state_req.set_from_node(node1);
  state_req.set_comm_id(ranks.comm_id + "x");
  s = call([&](grpc::ClientContext* ctx) { return peer->GetCommState(ctx, state_req, &state); });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  state_req.set_comm_id(ranks.comm_id);
  s = call([&](grpc::ClientContext* ctx) { return peer->GetCommState(ctx, state_req, &state); });
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(state.node_name(), node0);
  EXPECT_EQ(state.state(), "ready");
  ASSERT_EQ(state.ranks_size(), 1);
  EXPECT_EQ(state.ranks(0).submitted(), state.ranks(0).completed());  // the barriers, all done
  EXPECT_GT(state.ranks(0).pid(), 0);

  v1::AbortCommRequest abort;
  abort.set_job_id("itest");
  abort.set_comm_id(ranks.comm_id);
  abort.set_code(static_cast<int>(absl::StatusCode::kInternal));
  abort.set_message("forged");
  v1::AbortCommResponse abort_resp;
  for (const std::string& who : {std::string("stranger"), node0}) {
    abort.set_from_node(who);
    s = call([&](grpc::ClientContext* ctx) { return peer->AbortComm(ctx, abort, &abort_resp); });
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << who;
    EXPECT_THAT(s.error_message(), HasSubstr("is not another member node of communicator"));
  }
  const absl::Status still = barrier();
  EXPECT_TRUE(still.ok()) << "a refused abort failed it: " << still;
  // The other member may.
  abort.set_from_node(node1);
  s = call([&](grpc::ClientContext* ctx) { return peer->AbortComm(ctx, abort, &abort_resp); });
  EXPECT_TRUE(s.ok()) << s.error_message();
  const absl::Status after = comms[0].Barrier().wait(std::chrono::seconds(10));
  EXPECT_EQ(after.code(), absl::StatusCode::kAborted) << after;
  EXPECT_THAT(std::string(after.message()), HasSubstr("forged"));
}

// Runs fn when the scope ends, however the test leaves it.
struct Cleanup {
  std::function<void()> fn;
  ~Cleanup() { fn(); }
};

// Two daemons in network namespaces of their own, joined by a veth pair: the peer service and
// UCX run over that link, not loopback. Needs root (ip netns); skipped with the reason otherwise.
TEST(MultiNodeNetnsTest, CollectivesAcrossNetworkNamespaces) {
  const std::string tag = std::to_string(::getpid() % 100000);
  const std::string ns0 = "ryns0-" + tag, ns1 = "ryns1-" + tag;
  auto sh = [](const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); };
  if (sh("ip netns add " + ns0) != 0) GTEST_SKIP() << "cannot create network namespaces (root?)";
  sh("ip netns add " + ns1);
  Cleanup cleanup{[&] {
    sh("ip netns del " + ns0);
    sh("ip netns del " + ns1);
  }};
  const std::string va = "ryva" + tag, vb = "ryvb" + tag;
  ASSERT_EQ(
      sh("ip link add " + va + " netns " + ns0 + " type veth peer name " + vb + " netns " + ns1),
      0);
  ASSERT_EQ(sh("ip -n " + ns0 + " addr add 10.251.7.1/24 dev " + va), 0);
  ASSERT_EQ(sh("ip -n " + ns1 + " addr add 10.251.7.2/24 dev " + vb), 0);
  for (const auto& ns : {ns0, ns1}) {
    ASSERT_EQ(sh("ip -n " + ns + " link set lo up"), 0);
  }
  ASSERT_EQ(sh("ip -n " + ns0 + " link set " + va + " up"), 0);
  ASSERT_EQ(sh("ip -n " + ns1 + " link set " + vb + " up"), 0);
  // UCX only offers devices that are up and running: wait for the veth carrier on both ends.
  for (int n = 0; n < 2; ++n) {
    const std::string ns = n == 0 ? ns0 : ns1, dev = n == 0 ? va : vb;
    bool up = false;
    for (int i = 0; i < 300 && !up; ++i) {
      up = sh("ip -n " + ns + " link show dev " + dev + " | grep -q 'state UP'") == 0;
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(up) << dev << " in " << ns << " did not come up";
  }

  const std::string dir = MakeTempDir();
  Cleanup remove_dir{[&] { std::filesystem::remove_all(dir); }};
  std::vector<std::unique_ptr<Process>> daemons;
  std::vector<std::string> socks;
  const std::string nss[] = {ns0, ns1}, devs[] = {va, vb}, ips[] = {"10.251.7.1", "10.251.7.2"};
  // Mutual TLS over the veth: each certificate names its node and its namespace's address (what
  // the other daemon dials).
  const std::string certs = dir + "/certs";
  MakePeerCerts(certs, {"nsnode0=10.251.7.1", "nsnode1=10.251.7.2"});
  for (int n = 0; n < 2; ++n) {
    std::vector<std::string> argv = {"/usr/sbin/ip",
                                     "netns",
                                     "exec",
                                     nss[n],
                                     RAILYARDD_PATH,
                                     "--socket=" + dir + "/ns" + std::to_string(n) + ".sock",
                                     "--insecure_first_session_token",
                                     "--peer_listen=" + ips[n] + ":0",
                                     "--topology=" + dir + "/ns" + std::to_string(n) + ".json"};
    for (const auto& f : PeerTlsFlags(certs, "nsnode" + std::to_string(n))) argv.push_back(f);
    const std::string topo = dir + "/ns" + std::to_string(n) + ".json";
    std::ofstream(topo) << "{\"node\": \"nsnode" << n << "\", \"rails\": [{\"device\": \""
                        << devs[n] << "\"}]}\n";
    socks.push_back(dir + "/ns" + std::to_string(n) + ".sock");
    daemons.push_back(std::make_unique<Process>(argv, dir + "/ns" + std::to_string(n) + ".log"));
  }
  for (const auto& s : socks) {
    for (int i = 0; i < 500 && !SocketAccepts(s); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(SocketAccepts(s)) << daemons[0]->Output() << daemons[1]->Output();
  }
  Process perf({PERF_PATH, "--op", "allreduce", "-b", "8", "-e", "4M", "-f", "16", "-n", "3", "-w",
                "1", "-c", "1", "--daemons", socks[0] + "," + socks[1], "--ranks-per-daemon", "2"},
               dir + "/perf.log");
  auto code = perf.Wait(std::chrono::seconds(120));
  ASSERT_TRUE(code.has_value()) << "railyard-perf hung across namespaces";
  EXPECT_EQ(*code, 0) << perf.Output() << daemons[0]->Output() << daemons[1]->Output();
  EXPECT_THAT(perf.Output(), HasSubstr("@10.251.7.1:"));  // the coordinator is in ns0
  EXPECT_THAT(daemons[0]->Output(), HasSubstr("mutual TLS"));
  for (auto& d : daemons) {
    d->Signal(SIGTERM);
    EXPECT_EQ(d->Wait(std::chrono::seconds(15)).value_or(-1), 0) << d->Output();
  }
}

}  // namespace
}  // namespace railyard::testing

// ---- Data-plane integrity (--integrity=crc32c) and the test-only bit flipper ----

namespace railyard::testing {
namespace {

struct AllReduceRun {
  absl::Status status[2];          // of the first operation that failed on the rank, else OK
  int wrong_elements[2] = {0, 0};  // over every operation that succeeded
};

// `iters` float32 AllReduces (sum) of count elements by one rank on each of the cluster's two
// daemons, until one fails; every element is an exact small integer, so the correct sum is exact.
AllReduceRun RunAllReduce(VirtualCluster& cluster, const std::string& client_integrity,
                          size_t count, int iters) {
  AllReduceRun run;
  RankPerNode ranks =
      JoinRankPerNode(cluster, count * sizeof(float), "integrity", client_integrity);
  if (!ranks.ok) return run;
  std::vector<Buffer>& bufs = ranks.bufs;
  std::vector<Comm>& comms = ranks.comms;
  CollectiveOptions o;
  o.timeout = std::chrono::milliseconds(20000);
  for (int it = 0; it < iters; ++it) {
    Work w[2];
    for (int r = 0; r < 2; ++r) {
      for (size_t i = 0; i < count; ++i) bufs[r].span<float>()[i] = static_cast<float>(i % 97 + r);
      w[r] = comms[r].AllReduce(bufs[r], bufs[r], count, DataType::kFloat32, RedOp::kSum, o);
    }
    bool failed = false;
    for (int r = 0; r < 2; ++r) {
      absl::Status s = w[r].wait(std::chrono::seconds(60));
      if (!s.ok()) {
        if (run.status[r].ok()) run.status[r] = s;
        failed = true;
        continue;
      }
      for (size_t i = 0; i < count; ++i) {
        run.wrong_elements[r] += bufs[r].span<float>()[i] != static_cast<float>(2 * (i % 97) + 1);
      }
    }
    if (failed) break;
  }
  return run;
}

constexpr size_t kIntegrityCount = size_t{1} << 20;  // 4 MiB of float32
constexpr int kIntegrityIters = 20;

TEST(MultiNodeIntegrityTest, CrcCatchesAFlippedBitWithDataLossNamingTheLink) {
  VirtualCluster cluster(
      2, {"--integrity=crc32c", "--test_flip_bit_every=3", "--metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  AllReduceRun run = RunAllReduce(cluster, "", kIntegrityCount, kIntegrityIters);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(run.status[r].code(), absl::StatusCode::kDataLoss)
        << "rank " << r << ": " << run.status[r];
    EXPECT_THAT(std::string(run.status[r].message()),
                ::testing::MatchesRegex(".*integrity check failed on link vnode[01] <- vnode[01] "
                                        "rail rail[01]: CRC-32C 0x[0-9a-f]{8} of the [0-9]+-byte "
                                        "message tagged 0x[0-9a-f]+ does not match.*"))
        << run.status[r];
  }
  double errors = 0;
  for (int n = 0; n < 2; ++n) {
    const std::string address = MetricsAddress(cluster[n]);
    ASSERT_FALSE(address.empty()) << cluster[n].Log();
    const std::string text = HttpGet(address, "/metrics");
    ASSERT_THAT(text, HasSubstr("railyard_link_integrity_errors_total{"));
    errors += SumSamples(text, "railyard_link_integrity_errors_total");
    EXPECT_EQ(SumSamples(text, "railyard_peer_rejected_messages_total"), 0) << text;
  }
  EXPECT_GT(errors, 0) << cluster.Logs();
  EXPECT_THAT(cluster[0].Log(), HasSubstr("TEST ONLY fault injection on"));
}

TEST(MultiNodeIntegrityTest, CrcOnWithoutFaultsGivesExactResults) {
  VirtualCluster cluster(2, {"--integrity=crc32c", "--metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  AllReduceRun run = RunAllReduce(cluster, "", kIntegrityCount, kIntegrityIters);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(run.status[r].ok()) << "rank " << r << ": " << run.status[r];
    EXPECT_EQ(run.wrong_elements[r], 0) << "rank " << r;
  }
  for (int n = 0; n < 2; ++n) {
    const std::string text = HttpGet(MetricsAddress(cluster[n]), "/metrics");
    ASSERT_THAT(text, HasSubstr("railyard_link_integrity_errors_total{"));
    EXPECT_EQ(SumSamples(text, "railyard_link_integrity_errors_total"), 0);
  }
}

// Without CRC the injector's flips go through unnoticed: proof that it corrupts what it sends,
// and why --integrity=crc32c exists.
TEST(MultiNodeIntegrityTest, WithoutCrcAFlippedBitIsWrongData) {
  VirtualCluster cluster(2, {"--test_flip_bit_every=1"});
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  AllReduceRun run = RunAllReduce(cluster, "", kIntegrityCount, kIntegrityIters);
  int wrong = 0;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(run.status[r].ok()) << "rank " << r << ": " << run.status[r];
    wrong += run.wrong_elements[r];
  }
  EXPECT_GT(wrong, 0) << "every message had a flipped bit, yet the results are exact";
}

// Per job: daemons without --integrity, ranks asking for crc32c (ClientOptions.integrity, as
// $RAILYARD_INTEGRITY would).
TEST(MultiNodeIntegrityTest, AJobAsksForCrcThroughItsClients) {
  VirtualCluster cluster(2, {"--test_flip_bit_every=3"});
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  AllReduceRun run = RunAllReduce(cluster, "crc32c", kIntegrityCount, kIntegrityIters);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(run.status[r].code(), absl::StatusCode::kDataLoss)
        << "rank " << r << ": " << run.status[r];
    EXPECT_THAT(std::string(run.status[r].message()), HasSubstr("integrity check failed on link"));
  }
}

}  // namespace
}  // namespace railyard::testing

namespace railyard::testing {
namespace {

// 10^5 small AllReduces per rank, 4 ranks on 2 daemons, every result checked: the rings, the
// inline small-operation path and the transport between the daemons under a long run.
TEST(MultiNodeStressTest, HundredThousandSmallAllReducesPerRankAcrossTwoDaemonsAreExact) {
  VirtualCluster cluster(2);
  ASSERT_TRUE(cluster.ready()) << cluster.Logs();
  auto c = Client::Connect(cluster[0].Options());
  ASSERT_TRUE(c.ok()) << c.status();
  auto id = (*c)->CreateCommId();
  ASSERT_TRUE(id.ok()) << id.status();
#if defined(__SANITIZE_ADDRESS__)
  const int iters = 20000;  // the same path, in the time a sanitized build allows
#else
  const int iters = 100000;
#endif
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(std::make_unique<Process>(
        std::vector<std::string>{RANK_PATH, "--mode=lockstep",
                                 "--socket=" + cluster[r / 2].socket(), "--comm_id=" + *id,
                                 "--rank=" + std::to_string(r), "--nranks=4", "--count=2",
                                 "--iters=" + std::to_string(iters)},
        cluster.dir() + "/stress-rank" + std::to_string(r) + ".log"));
  }
  for (int r = 0; r < 4; ++r) {
    auto code = ranks[r]->Wait(std::chrono::seconds(500));
    ASSERT_TRUE(code.has_value()) << "rank " << r << " did not finish";
    EXPECT_EQ(*code, 0) << "rank " << r << ":\n" << ranks[r]->Output();
    EXPECT_THAT(ranks[r]->Output(), HasSubstr("LOCKSTEP " + std::to_string(iters) + " nodes 2"));
  }
}

}  // namespace
}  // namespace railyard::testing
