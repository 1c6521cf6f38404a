// railctl diagnose's verdicts from hand-made member views (daemon/diagnose/verdicts.h): each kind
// of finding names the right ranks, nodes, sequence number and link, and a healthy
// communicator diagnoses as healthy.
#include "daemon/diagnose/verdicts.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard::diagnose {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::vector<std::string> kNames = {"n0", "n1", "n2"};

// Node `node` of 3 with two ranks (2*node, 2*node+1) that submitted `submitted` collectives and
// completed `completed`.
v1::CommState Node(int node, uint64_t submitted0, uint64_t submitted1, uint64_t completed) {
  v1::CommState st;
  st.set_comm_id("c@x:1");
  st.set_job_id("job");
  st.set_node_index(node);
  st.set_node_name(kNames[node]);
  for (const auto& n : kNames) st.add_node_names(n);
  st.set_nranks(6);
  st.set_nnodes(3);
  st.set_state("ready");
  const uint64_t sub[2] = {submitted0, submitted1};
  for (int k = 0; k < 2; ++k) {
    v1::RankProgress* r = st.add_ranks();
    r->set_rank(2 * node + k);
    r->set_pid(1000 + 2 * node + k);
    r->set_submitted(sub[k]);
    r->set_completed(completed);
  }
  return st;
}

v1::OpProgress* Front(v1::CommState* st, uint64_t seq, const std::string& op, uint64_t count,
                      double age, std::vector<int> submitted, std::vector<int> missing = {}) {
  v1::OpProgress* f = st->mutable_front();
  f->set_seq(seq);
  f->set_op(op);
  f->set_dtype("float");
  f->set_count(count);
  f->set_bytes(count * 4);
  if (op == "allreduce") f->set_red_op("sum");
  f->set_age_seconds(age);
  for (int r : submitted) f->add_submitted_ranks(r);
  for (int r : missing) f->add_missing_ranks(r);
  return f;
}

void AddTransfer(v1::OpProgress* op, bool send, int peer, int rail, double age, uint32_t step) {
  v1::TransferProgress* t = op->add_transfers();
  t->set_send(send);
  t->set_peer_node(peer);
  t->set_peer_name(kNames[peer]);
  t->set_rail(rail);
  t->set_bytes(65536);
  t->set_step(step);
  t->set_age_seconds(age);
}

TEST(VerdictsTest, RankRangesCollapseRuns) {
  EXPECT_EQ(RankRanges({7, 0, 1, 2, 3, 4, 6}), "0-4, 6-7");
  EXPECT_EQ(RankRanges({5}), "5");
  EXPECT_EQ(RankRanges({}), "");
  EXPECT_EQ(RankRanges({1, 1, 3}), "1, 3");
}

TEST(VerdictsTest, ARankThatNeverSubmittedIsNamedWithItsNodeAndPid) {
  // Seq 4: every rank but 5 submitted it; n0 and n1 run it and wait on n2.
  auto n0 = Node(0, 5, 5, 4), n1 = Node(1, 5, 5, 4), n2 = Node(2, 5, 4, 4);
  Front(&n0, 4, "allreduce", 1 << 24, 212, {0, 1})->set_running(true);
  Front(&n1, 4, "allreduce", 1 << 24, 211, {2, 3})->set_running(true);
  Front(&n2, 4, "allreduce", 1 << 24, 212, {4}, {5});
  const v1::CommDiagnosis d = Diagnose({n0, n1, n2}, {}, absl::Seconds(1));
  EXPECT_FALSE(d.healthy());
  ASSERT_GE(d.verdicts_size(), 1);
  EXPECT_EQ(d.verdicts(0),
            "rank 5 (node n2, pid 1005) has not submitted seq 4 (allreduce float "
            "count=16777216 (64 MiB) sum); ranks 0-4 are waiting since 212 s");
  EXPECT_EQ(d.states_size(), 3);
}

TEST(VerdictsTest, NothingIsAFindingBeforeTheStallThreshold) {
  auto n0 = Node(0, 5, 5, 4), n1 = Node(1, 5, 4, 4);
  Front(&n0, 4, "allreduce", 8, 0.2, {0, 1});
  Front(&n1, 4, "allreduce", 8, 0.2, {2}, {3});
  const v1::CommDiagnosis d = Diagnose({n0, n1}, {}, absl::Seconds(1));
  EXPECT_TRUE(d.healthy());
  ASSERT_EQ(d.verdicts_size(), 1);
  EXPECT_THAT(d.verdicts(0), HasSubstr("healthy: 4 ranks on 2 nodes, seq 4 pending"));
}

TEST(VerdictsTest, NodesThatDisagreeAreNamedWithWhatEachSubmitted) {
  auto n0 = Node(0, 89, 89, 88), n1 = Node(1, 89, 89, 88), n2 = Node(2, 89, 89, 88);
  Front(&n0, 88, "allreduce", 1024, 3, {0, 1});
  Front(&n1, 88, "allreduce", 1024, 3, {2, 3});
  Front(&n2, 88, "allgather", 1024, 3, {4, 5});
  const v1::CommDiagnosis d = Diagnose({n0, n1, n2}, {}, absl::Seconds(1));
  EXPECT_FALSE(d.healthy());
  ASSERT_GE(d.verdicts_size(), 1);
  EXPECT_THAT(d.verdicts(0), HasSubstr("disagree at seq 88"));
  EXPECT_THAT(d.verdicts(0), HasSubstr("n0, n1 ranks 0-3 submitted allreduce float count=1024"));
  EXPECT_THAT(d.verdicts(0), HasSubstr("n2 ranks 4-5 submitted allgather float count=1024"));
  // Not also reported as ranks that did not submit.
  for (const auto& v : d.verdicts()) EXPECT_THAT(v, Not(HasSubstr("has not submitted")));
}

TEST(VerdictsTest, ACountDisagreementSeenAfterTheFailureStillNamesBothSides) {
  auto n0 = Node(0, 3, 3, 2), n1 = Node(1, 3, 3, 2);
  n0.set_state("failed");
  n0.set_error("seq 2: transfer from n1 failed");
  n1.set_state("failed");
  n1.set_error("seq 2: transfer from n0 failed");
  *n0.mutable_failed_op() = *Front(&n0, 2, "allreduce", 1024, 2, {0, 1});
  n0.clear_front();
  *n1.mutable_failed_op() = *Front(&n1, 2, "allreduce", 2048, 2, {2, 3});
  n1.clear_front();
  const v1::CommDiagnosis d = Diagnose({n0, n1}, {}, absl::Seconds(1));
  EXPECT_FALSE(d.healthy());
  EXPECT_THAT(d.verdicts(0), HasSubstr("nodes n0 and n1 disagree at seq 2"));
  EXPECT_THAT(d.verdicts(0), HasSubstr("count=1024"));
  EXPECT_THAT(d.verdicts(0), HasSubstr("count=2048"));
  // Both failure reasons follow as evidence.
  EXPECT_EQ(d.verdicts_size(), 3);
}

TEST(VerdictsTest, AStalledLinkNamesBothEndsAndTheRail) {
  auto n0 = Node(0, 41, 41, 40), n2 = Node(2, 41, 41, 40);
  auto* f0 = Front(&n0, 40, "allreduce", 1 << 20, 30, {0, 1});
  f0->set_running(true);
  AddTransfer(f0, /*send=*/false, /*peer=*/2, /*rail=*/1, 30, 17);
  AddTransfer(f0, false, 2, 1, 0.1, 18);  // younger: not the one reported
  auto* f2 = Front(&n2, 40, "allreduce", 1 << 20, 30, {4, 5});
  f2->set_running(true);
  AddTransfer(f2, /*send=*/true, /*peer=*/0, /*rail=*/1, 30, 9);
  const v1::CommDiagnosis d = Diagnose({n0, n2}, {}, absl::Seconds(1));
  EXPECT_FALSE(d.healthy());
  ASSERT_GE(d.verdicts_size(), 1);
  EXPECT_EQ(d.verdicts(0),
            "seq 40 step 17: n0 waits for a chunk from n2 on rail1 (64 KiB) since 30 s; n2 "
            "reports that send in flight (link stalled)");
}

// A link down: both nodes' sends left (into the socket), both wait for the other's chunk on
// rail1. Neither wait is a chain of the other's (before, each was taken for the other's chain
// and the communicator was called healthy): the link is the finding, once.
TEST(VerdictsTest, TwoNodesWaitingForEachOtherOnOneRailNameTheLinkOnce) {
  auto n0 = Node(0, 41, 41, 40), n2 = Node(2, 41, 41, 40);
  auto* f0 = Front(&n0, 40, "allreduce", 1 << 20, 45, {0, 1});
  f0->set_running(true);
  AddTransfer(f0, /*send=*/false, /*peer=*/2, /*rail=*/1, 43.5, 26);
  auto* f2 = Front(&n2, 40, "allreduce", 1 << 20, 45, {4, 5});
  f2->set_running(true);
  AddTransfer(f2, /*send=*/false, /*peer=*/0, /*rail=*/1, 43.4, 22);
  const v1::CommDiagnosis d = Diagnose({n0, n2}, {}, absl::Seconds(1));
  EXPECT_FALSE(d.healthy());
  ASSERT_EQ(d.verdicts_size(), 1) << d.DebugString();
  EXPECT_EQ(d.verdicts(0),
            "seq 40 step 26: n0 waits for a chunk from n2 on rail1 (64 KiB) since 44 s; n2 waits "
            "for a chunk from n0 on rail1 too, since 43 s (neither side's data arrives: the link "
            "is down, cut or very slow)");
  // On another rail each, waits in a cycle still mean something sent was lost.
  f2->mutable_transfers(0)->set_rail(0);
  const v1::CommDiagnosis cycle = Diagnose({n0, n2}, {}, absl::Seconds(1));
  ASSERT_EQ(cycle.verdicts_size(), 1) << cycle.DebugString();
  EXPECT_EQ(cycle.verdicts(0),
            "seq 40 step 26: n0 waits for a chunk from n2 on rail1 (64 KiB) since 44 s; n2 waits "
            "for a chunk from n0 on rail0, since 43 s (each waits for the other: what one sent "
            "has not arrived, on rail1 or rail0)");
}

TEST(VerdictsTest, ADaemonThatDoesNotAnswerIsAFindingAndExplainsTheWait) {
  auto n0 = Node(0, 8, 8, 7), n1 = Node(1, 8, 8, 7);
  auto* f0 = Front(&n0, 7, "allreduce", 256, 12, {0, 1});
  f0->set_running(true);
  AddTransfer(f0, false, 2, 0, 12, 3);
  Front(&n1, 7, "allreduce", 256, 12, {2, 3})->set_running(true);
  const v1::CommDiagnosis d =
      Diagnose({n0, n1}, {{2, "n2", "DEADLINE_EXCEEDED after 2 s"}}, absl::Seconds(1));
  EXPECT_FALSE(d.healthy());
  ASSERT_EQ(d.unreachable_size(), 1);
  EXPECT_EQ(d.unreachable(0), "n2: DEADLINE_EXCEEDED after 2 s");
  bool link = false, silent = false;
  for (const auto& v : d.verdicts()) {
    link |= v.find("n0 waits for a chunk from n2 on rail0") != std::string::npos &&
            v.find("n2 did not answer") != std::string::npos;
    silent |= v.find("n2 did not answer the diagnosis (DEADLINE_EXCEEDED") != std::string::npos;
  }
  EXPECT_TRUE(link) << d.DebugString();
  EXPECT_TRUE(silent) << d.DebugString();
}

// n1 waits on n0, which waits on silent n2: the cause is n0's wait, not n1's.
TEST(VerdictsTest, AChainOfWaitsIsReportedAtItsEnd) {
  auto n0 = Node(0, 8, 8, 7), n1 = Node(1, 8, 8, 7);
  auto* f0 = Front(&n0, 7, "allreduce", 256, 12, {0, 1});
  f0->set_running(true);
  f0->set_steps_total(26);
  f0->set_steps_done(6);
  AddTransfer(f0, false, 2, 0, 12, 5);
  auto* f1 = Front(&n1, 7, "allreduce", 256, 12, {2, 3});
  f1->set_running(true);
  AddTransfer(f1, false, 0, 0, 11, 7);
  const v1::CommDiagnosis d =
      Diagnose({n1, n0}, {{2, "n2", "DEADLINE_EXCEEDED after 1 s"}}, absl::Seconds(1));
  ASSERT_EQ(d.verdicts_size(), 2) << d.DebugString();
  EXPECT_EQ(d.verdicts(0),
            "seq 7 step 5: n0 waits for a chunk from n2 on rail0 (64 KiB) since 12 s; n2 did not "
            "answer (its daemon is stopped, overloaded or cut off)");
  EXPECT_THAT(d.verdicts(1), HasSubstr("n2 did not answer the diagnosis"));
}

TEST(VerdictsTest, AnIdleCommunicatorIsHealthy) {
  const v1::CommDiagnosis d = Diagnose(
      {Node(0, 10, 10, 10), Node(1, 10, 10, 10), Node(2, 10, 10, 10)}, {}, absl::Seconds(1));
  EXPECT_TRUE(d.healthy());
  ASSERT_EQ(d.verdicts_size(), 1);
  EXPECT_EQ(d.verdicts(0), "healthy: 6 ranks on 3 nodes, nothing pending");
  EXPECT_EQ(d.comm_id(), "c@x:1");
  EXPECT_EQ(d.job_id(), "job");
}

}  // namespace
}  // namespace railyard::diagnose
