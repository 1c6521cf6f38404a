// railctl diagnose on 3 virtual nodes x 2 ranks (ranks 2n and 2n+1 on vnode<n>), each rank its
// own process: a healthy job, a rank that never submits, nodes that disagree on the operation
// or its count, and a peer daemon stopped with SIGSTOP. Each time the verdict (from any daemon
// of the job, within 5 s of asking) names the ranks, nodes, sequence number and link, and the
// surviving ranks fail with an error instead of hanging.
#include <google/protobuf/util/json_util.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "railyard/client.h"
#include "railyard/v1/admin.pb.h"
#include "tests/integration/virtual_cluster.h"

namespace railyard::testing {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Rank `rank` of 6 on vnode<rank/2>.
std::unique_ptr<Process> Rank(VirtualCluster& cluster, const std::string& comm_id, int rank,
                              const std::string& mode, std::vector<std::string> extra = {}) {
  DaemonProcess& d = cluster[rank / 2];
  std::vector<std::string> argv = {RANK_PATH,
                                   "--mode=" + mode,
                                   "--socket=" + d.socket(),
                                   "--comm_id=" + comm_id,
                                   "--rank=" + std::to_string(rank),
                                   "--nranks=6",
                                   "--job=diagjob"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return std::make_unique<Process>(argv, cluster.dir() + "/rank" + std::to_string(rank) + ".log");
}

struct Diagnosis {
  int exit_code = -1;
  std::string output;
  double seconds = 0;
  v1::DiagnoseResponse response;
  bool parsed = false;
};

// railctl diagnose COMM_ID --json against daemon `via`.
Diagnosis Diagnose(VirtualCluster& cluster, int via, const std::string& comm_id,
                   std::vector<std::string> extra = {}) {
  Diagnosis d;
  std::vector<std::string> argv = {RAILCTL_PATH, "diagnose", comm_id,
                                   "--json",     "--socket", cluster[via].socket(),
                                   "--stall_ms", "300"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  static int n = 0;
  const auto start = Clock::now();
  Process p(argv, cluster.dir() + "/diagnose" + std::to_string(n++) + ".log");
  d.exit_code = p.Wait(std::chrono::seconds(30)).value_or(-1);
  d.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  d.output = p.Output();
  const size_t brace = d.output.find('{');
  const size_t end = d.output.find('\n', brace);
  if (brace != std::string::npos) {
    d.parsed =
        google::protobuf::util::JsonStringToMessage(
            d.output.substr(brace, end == std::string::npos ? end : end - brace), &d.response)
            .ok();
  }
  return d;
}

// The checks every problem's diagnosis passes: exit 1 within 5 s of asking, one communicator,
// not healthy, at least one verdict. Null (with the failures reported) when it does not.
const v1::CommDiagnosis* Problem(const Diagnosis& d) {
  EXPECT_EQ(d.exit_code, 1) << d.output;
  EXPECT_LT(d.seconds, 5.0);
  EXPECT_TRUE(d.parsed) << d.output;
  if (!d.parsed || d.response.comms_size() != 1) {
    ADD_FAILURE() << "expected one communicator's diagnosis:\n" << d.output;
    return nullptr;
  }
  const v1::CommDiagnosis& c = d.response.comms(0);
  EXPECT_FALSE(c.healthy()) << d.output;
  if (c.verdicts_size() < 1) {
    ADD_FAILURE() << "no verdict:\n" << d.output;
    return nullptr;
  }
  return &c;
}

class DiagnoseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<VirtualCluster>(3);
    ASSERT_TRUE(cluster_->ready()) << cluster_->Logs();
    auto c = Client::Connect((*cluster_)[0].Options("diagjob"));
    ASSERT_TRUE(c.ok()) << c.status();
    auto id = (*c)->CreateCommId();
    ASSERT_TRUE(id.ok()) << id.status();
    comm_id_ = *id;
  }
  // Waits for every rank's marker line ("SUBMITTED" or "READY").
  void WaitAll(const std::vector<std::unique_ptr<Process>>& ranks,
               const std::vector<std::string>& markers) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      ASSERT_TRUE(ranks[r]->WaitForOutput(markers[r], std::chrono::seconds(60)))
          << "rank " << r << ": " << ranks[r]->Output() << cluster_->Logs();
    }
  }
  std::unique_ptr<VirtualCluster> cluster_;
  std::string comm_id_;
};

TEST_F(DiagnoseTest, AHealthyJobDiagnosesAsHealthyFromAnyDaemon) {
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < 6; ++r) ranks.push_back(Rank(*cluster_, comm_id_, r, "idle"));
  WaitAll(ranks, std::vector<std::string>(6, "READY"));
  for (int via : {0, 2}) {
    Diagnosis d = Diagnose(*cluster_, via, comm_id_);
    EXPECT_EQ(d.exit_code, 0) << d.output;
    ASSERT_TRUE(d.parsed) << d.output;
    ASSERT_EQ(d.response.comms_size(), 1);
    const v1::CommDiagnosis& c = d.response.comms(0);
    EXPECT_TRUE(c.healthy());
    EXPECT_EQ(c.comm_id(), comm_id_);
    EXPECT_EQ(c.job_id(), "diagjob");
    EXPECT_EQ(c.states_size(), 3);
    EXPECT_EQ(c.unreachable_size(), 0);
    ASSERT_EQ(c.verdicts_size(), 1);
    EXPECT_EQ(c.verdicts(0), "healthy: 6 ranks on 3 nodes, nothing pending");
  }
  // What railctl refuses, and a communicator no daemon has.
  struct Bad {
    std::vector<std::string> args;
    int code;
    const char* says;
  };
  const std::string sock = (*cluster_)[0].socket();
  const Bad bad[] = {
      {{"--socket", sock}, 2, "name a communicator (COMM_ID) or a job (--job J)"},
      {{comm_id_, "--job", "diagjob", "--socket", sock}, 2, "not both"},
      {{comm_id_, "--timeout_ms", "0", "--socket", sock}, 2, "--timeout_ms '0'"},
      {{comm_id_, "--timeout_ms", "60000", "--socket", sock}, 2, "--timeout_ms '60000'"},
      {{comm_id_, "--stall_ms", "soon", "--socket", sock}, 2, "--stall_ms 'soon'"},
      {{comm_id_, "extra", "--socket", sock}, 2, "unexpected argument 'extra'"},
      {{"ry1-nosuch@127.0.0.1:1", "--socket", sock}, 1, "no communicator here matches"},
      {{"--job", "otherjob", "--socket", sock}, 1, "no communicator here matches job otherjob"},
  };
  for (const Bad& b : bad) {
    std::vector<std::string> argv = {RAILCTL_PATH, "diagnose"};
    argv.insert(argv.end(), b.args.begin(), b.args.end());
    Process p(argv, cluster_->dir() + "/diagnose-bad.log");
    EXPECT_EQ(p.Wait(std::chrono::seconds(30)).value_or(-1), b.code) << p.Output();
    EXPECT_THAT(p.Output(), HasSubstr(b.says));
  }
  // And by job, in the human form.
  Process p({RAILCTL_PATH, "diagnose", "--job", "diagjob", "--socket", (*cluster_)[1].socket()},
            cluster_->dir() + "/diagnose-job.log");
  EXPECT_EQ(p.Wait(std::chrono::seconds(30)).value_or(-1), 0) << p.Output();
  EXPECT_THAT(p.Output(), HasSubstr("healthy: 6 ranks on 3 nodes"));
  EXPECT_THAT(p.Output(), HasSubstr("vnode2"));
}

TEST_F(DiagnoseTest, ARankThatNeverSubmitsIsNamedWithItsNodeAndPid) {
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < 5; ++r) {
    ranks.push_back(Rank(*cluster_, comm_id_, r, "submit", {"--timeout_ms=8000"}));
  }
  ranks.push_back(Rank(*cluster_, comm_id_, 5, "idle"));
  WaitAll(ranks, {"SUBMITTED", "SUBMITTED", "SUBMITTED", "SUBMITTED", "SUBMITTED", "READY"});
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // past --stall_ms
  Diagnosis d = Diagnose(*cluster_, 1, comm_id_);
  const v1::CommDiagnosis* problem = Problem(d);
  ASSERT_NE(problem, nullptr);
  const v1::CommDiagnosis& c = *problem;
  EXPECT_THAT(c.verdicts(0),
              HasSubstr("rank 5 (node vnode2, pid " + std::to_string(ranks[5]->pid()) +
                        ") has not submitted seq 0 (allreduce float count=1024"));
  EXPECT_THAT(c.verdicts(0), HasSubstr("ranks 0-4 are waiting since"));
  // The others fail at the deadline, told which rank they waited for.
  for (int r = 0; r < 5; ++r) {
    auto code = ranks[r]->Wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value()) << "rank " << r << " hung";
    EXPECT_EQ(*code, 3) << ranks[r]->Output();
    EXPECT_THAT(ranks[r]->Output(), HasSubstr("rank 5 of 6 did not submit")) << "rank " << r;
  }
}

// The three nodes submit seq 0 differently: vnode2's ranks an AllGather (or AllReduce of another
// count) where the others submit AllReduce count=1024. The daemons' digests disagree as soon as
// they run it: every rank fails at once with INVALID_ARGUMENT naming both sides, and the
// diagnosis (the ranks stay connected, so the communicators are still there) says the same.
void CheckDisagreement(VirtualCluster& cluster, const std::string& comm_id,
                       const std::vector<std::string>& vnode2_flags, const std::string& side) {
  // A bystander job on the same three daemons, one rank each, runs checked AllReduces the whole
  // time: it must neither fail nor see wrong data.
  auto bc = Client::Connect(cluster[0].Options("bystander"));
  ASSERT_TRUE(bc.ok()) << bc.status();
  auto bid = (*bc)->CreateCommId();
  ASSERT_TRUE(bid.ok()) << bid.status();
  std::vector<std::unique_ptr<Process>> bystanders;
  for (int r = 0; r < 3; ++r) {
    bystanders.push_back(std::make_unique<Process>(
        std::vector<std::string>{RANK_PATH, "--mode=lockstep", "--socket=" + cluster[r].socket(),
                                 "--comm_id=" + *bid, "--rank=" + std::to_string(r), "--nranks=3",
                                 "--job=bystander", "--count=4096", "--iters=300", "--seed=2"},
        cluster.dir() + "/bystander" + std::to_string(r) + ".log"));
  }
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < 6; ++r) {
    std::vector<std::string> flags = {"--timeout_ms=60000", "--linger_s=60"};
    if (r >= 4) flags.insert(flags.end(), vnode2_flags.begin(), vnode2_flags.end());
    ranks.push_back(Rank(cluster, comm_id, r, "submit", flags));
  }
  for (int r = 0; r < 6; ++r) {
    ASSERT_TRUE(ranks[r]->WaitForOutput("SUBMITTED", std::chrono::seconds(60)))
        << ranks[r]->Output();
  }
  // Far sooner than the 60 s deadline.
  for (int r = 0; r < 6; ++r) {
    ASSERT_TRUE(ranks[r]->WaitForOutput("RESULT", std::chrono::seconds(10)))
        << "rank " << r << " was not told: " << ranks[r]->Output() << cluster.Logs();
    const std::string out = ranks[r]->Output();
    // INVALID_ARGUMENT; ABORTED with the same words for a rank whose submission reached its
    // daemon only after another node had failed the communicator.
    EXPECT_TRUE(out.find("RESULT code=3 ") != std::string::npos ||
                out.find("RESULT code=10 ") != std::string::npos)
        << out;
    EXPECT_THAT(out, HasSubstr("disagree at seq 0")) << out;
    EXPECT_THAT(out, HasSubstr("vnode2 ranks 4-5 submitted " + side)) << out;
  }
  Diagnosis d = Diagnose(cluster, 0, comm_id);
  const v1::CommDiagnosis* problem = Problem(d);
  ASSERT_NE(problem, nullptr);
  const v1::CommDiagnosis& c = *problem;
  EXPECT_THAT(c.verdicts(0), HasSubstr("disagree at seq 0")) << d.output;
  // The ranks of each side that had submitted seq 0 when it failed there. vnode1's ranks printed
  // SUBMITTED once their entries were on the ring; when vnode0 and vnode2 compared digests and
  // failed the communicator before vnode1's daemon had taken them (seen in CI), vnode1 had no
  // side, its state says so, and the verdict names vnode0's ranks alone.
  const std::string& verdict = c.verdicts(0);
  if (verdict.find("vnode0, vnode1 ranks ") == std::string::npos) {
    EXPECT_THAT(verdict, HasSubstr("nodes vnode0 and vnode2 disagree at seq 0: vnode0 ranks 0-1 "))
        << d.output;
    int vnode1_ranks = 0;
    for (const v1::CommState& state : c.states()) {
      if (state.node_name() != "vnode1") continue;
      for (const v1::RankProgress& rank : state.ranks()) {
        ++vnode1_ranks;
        EXPECT_EQ(rank.submitted(), 0u) << d.output;
      }
    }
    EXPECT_EQ(vnode1_ranks, 2) << d.output;
  }
  EXPECT_THAT(c.verdicts(0), HasSubstr("submitted allreduce float count=1024 (4 KiB) sum; vnode2"))
      << d.output;
  EXPECT_THAT(c.verdicts(0), HasSubstr("vnode2 ranks 4-5 submitted " + side)) << d.output;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(bystanders[r]->Wait(std::chrono::seconds(120)).value_or(-1), 0)
        << bystanders[r]->Output();
    EXPECT_THAT(bystanders[r]->Output(), HasSubstr("LOCKSTEP 300 nodes 3"));
  }
}

TEST_F(DiagnoseTest, NodesThatSubmitADifferentOpAreNamedWithWhatEachSubmitted) {
  CheckDisagreement(*cluster_, comm_id_, {"--op=allgather"}, "allgather float count=1024");
}

TEST_F(DiagnoseTest, NodesThatDisagreeOnTheCountAreNamedWithBothCounts) {
  CheckDisagreement(*cluster_, comm_id_, {"--count=2048"}, "allreduce float count=2048");
}

TEST_F(DiagnoseTest, AStoppedPeerDaemonIsNamedWithTheLinkWaitingForIt) {
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(Rank(*cluster_, comm_id_, r, "submit", {"--timeout_ms=60000"}));
  }
  ranks.push_back(Rank(*cluster_, comm_id_, 4, "idle"));
  ranks.push_back(Rank(*cluster_, comm_id_, 5, "idle"));
  WaitAll(ranks, {"SUBMITTED", "SUBMITTED", "SUBMITTED", "SUBMITTED", "READY", "READY"});
  Process& stopped = (*cluster_)[2].process();
  ASSERT_EQ(::kill(stopped.pid(), SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  Diagnosis d = Diagnose(*cluster_, 0, comm_id_, {"--timeout_ms", "1000"});
  const v1::CommDiagnosis* problem = Problem(d);
  ASSERT_NE(problem, nullptr);
  const v1::CommDiagnosis& c = *problem;
  ASSERT_EQ(c.unreachable_size(), 1) << d.output;
  EXPECT_THAT(c.unreachable(0), HasSubstr("vnode2: DEADLINE_EXCEEDED"));
  bool link = false, silent = false;
  for (const std::string& v : c.verdicts()) {
    link |= v.find("waits for a chunk from vnode2 on rail") != std::string::npos &&
            v.find("vnode2 did not answer") != std::string::npos;
    silent |= v.find("vnode2 did not answer the diagnosis") != std::string::npos;
  }
  EXPECT_TRUE(link) << d.output;
  EXPECT_TRUE(silent) << d.output;
  // The human form, as an operator sees it.
  Process human({RAILCTL_PATH, "diagnose", comm_id_, "--socket", (*cluster_)[1].socket(),
                 "--timeout_ms", "1000", "--stall_ms", "300"},
                cluster_->dir() + "/diagnose-human.log");
  EXPECT_EQ(human.Wait(std::chrono::seconds(30)).value_or(-1), 1) << human.Output();
  EXPECT_THAT(human.Output(), HasSubstr("PROBLEM"));
  EXPECT_THAT(human.Output(), HasSubstr("no answer: vnode2: DEADLINE_EXCEEDED"));
  std::printf("%s", human.Output().c_str());
  // The survivors learn of it from the heartbeats (--peer_timeout, 10 s) and name it too.
  for (int r = 0; r < 4; ++r) {
    auto code = ranks[r]->Wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value()) << "rank " << r << " hung";
    EXPECT_EQ(*code, 3) << ranks[r]->Output();
    EXPECT_THAT(ranks[r]->Output(), HasSubstr("vnode2")) << "rank " << r;
  }
  ::kill(stopped.pid(), SIGCONT);
}

}  // namespace
}  // namespace railyard::testing
