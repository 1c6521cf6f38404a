// OpPlanner: what runs a merged collective, for one node and many, from the same code.
#include "daemon/comm/op_planner.h"

#include <memory>
#include <vector>

#include "daemon/scheduler/cost/calibration.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using scheduler::OpKind;
using ::testing::HasSubstr;

std::shared_ptr<scheduler::cost::Tuner> TunerFor(const scheduler::CommLayout& layout) {
  const auto c = scheduler::cost::Calibration::Defaults();
  return std::make_shared<scheduler::cost::Tuner>(
      layout, scheduler::cost::FabricForLayout(layout, c.intra, c.inter, c.overhead_s));
}

std::vector<scheduler::RankRequest> Requests(int n, OpKind op, uint64_t count,
                                             const std::string& algo = "") {
  std::vector<scheduler::RankRequest> reqs(n);
  for (auto& r : reqs) {
    r.op = op;
    r.count = count;
    r.algo = algo;
  }
  return reqs;
}

std::vector<const scheduler::RankRequest*> Ptrs(const std::vector<scheduler::RankRequest>& v) {
  std::vector<const scheduler::RankRequest*> out;
  for (const auto& r : v) out.push_back(&r);
  return out;
}

TEST(OpPlannerTest, OneNodeDefaultsToTheLocalPlanWithAPrediction) {
  const auto layout = scheduler::CommLayout::Uniform(1, 4, 1);
  OpPlanner planner(layout, 0, TunerFor(layout), "", 256 << 10);
  for (OpKind op : {OpKind::kAllReduce, OpKind::kAllGather, OpKind::kBroadcast, OpKind::kBarrier,
                    OpKind::kAllToAll}) {
    const auto reqs = Requests(4, op, op == OpKind::kBarrier ? 0 : 1024);
    auto plan = planner.Plan(Ptrs(reqs));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(plan->local()) << scheduler::OpName(op);
    EXPECT_EQ(plan->algorithm, scheduler::kAlgoLocal);
    EXPECT_FALSE(plan->forced);
    EXPECT_GT(plan->predicted_s, 0) << scheduler::OpName(op);
  }
  EXPECT_EQ(planner.cached_schedules(), 0u);
}

TEST(OpPlannerTest, AForcedAlgorithmRunsItsScheduleOnOneNodeAndIsCached) {
  const auto layout = scheduler::CommLayout::Uniform(1, 3, 1);
  OpPlanner planner(layout, 0, TunerFor(layout), "", 4096);
  const auto reqs = Requests(3, OpKind::kAllReduce, 10000, "ring");
  auto plan = planner.Plan(Ptrs(reqs));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->local());
  EXPECT_EQ(plan->algorithm, "ring");
  EXPECT_TRUE(plan->forced);
  EXPECT_FALSE(plan->schedule->steps.empty());
  auto again = planner.Plan(Ptrs(reqs));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->schedule, plan->schedule);  // the cached schedule, not a new one
  EXPECT_EQ(planner.cached_schedules(), 1u);
}

TEST(OpPlannerTest, TheDaemonDefaultForcesAndTheRequestWins) {
  const auto layout = scheduler::CommLayout::Uniform(1, 2, 1);
  OpPlanner planner(layout, 0, TunerFor(layout), "tree", 4096);
  auto by_default = planner.Plan(Ptrs(Requests(2, OpKind::kAllReduce, 64)));
  ASSERT_TRUE(by_default.ok());
  EXPECT_EQ(by_default->algorithm, "tree");
  auto by_request = planner.Plan(Ptrs(Requests(2, OpKind::kAllReduce, 64, "local")));
  ASSERT_TRUE(by_request.ok());
  EXPECT_TRUE(by_request->local());
}

TEST(OpPlannerTest, AnAlgorithmThatDoesNotImplementTheOpLeavesItToTheTuner) {
  const auto layout = scheduler::CommLayout::Uniform(1, 2, 1);
  OpPlanner planner(layout, 0, TunerFor(layout), "", 4096);
  auto plan = planner.Plan(Ptrs(Requests(2, OpKind::kAllGather, 64, "rhd")));
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->forced);
  EXPECT_TRUE(plan->local());
  EXPECT_TRUE(OpPlanner::Forces("rhd", OpKind::kAllReduce, true));
  EXPECT_FALSE(OpPlanner::Forces("rhd", OpKind::kAllGather, true));
  EXPECT_FALSE(OpPlanner::Forces("local", OpKind::kAllReduce, false));
  EXPECT_TRUE(OpPlanner::Forces("torus", OpKind::kAllReduce, false));
}

TEST(OpPlannerTest, AcrossNodesTheTunerPicksAScheduleAndLocalIsNotAnOption) {
  const auto layout = scheduler::CommLayout::Uniform(2, 2, 2);
  OpPlanner planner(layout, 1, TunerFor(layout), "", 256 << 10);
  for (uint64_t count : {uint64_t{2}, uint64_t{1} << 20}) {
    auto plan = planner.Plan(Ptrs(Requests(2, OpKind::kAllReduce, count, "local")));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_FALSE(plan->local());
    EXPECT_FALSE(plan->forced);
    EXPECT_NE(plan->algorithm, scheduler::kAlgoLocal);
    EXPECT_EQ(plan->schedule->node, 1);
    EXPECT_GT(plan->predicted_s, 0);
  }
}

TEST(OpPlannerTest, WithoutATunerAcrossNodesOnlyAForcedAlgorithmRuns) {
  const auto layout = scheduler::CommLayout::Uniform(2, 1, 1);
  OpPlanner planner(layout, 0, nullptr, "", 4096);
  auto refused = planner.Plan(Ptrs(Requests(1, OpKind::kAllReduce, 64)));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  auto forced = planner.Plan(Ptrs(Requests(1, OpKind::kAllReduce, 64, "ring")));
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(forced->algorithm, "ring");
  EXPECT_LT(forced->predicted_s, 0);  // no model to predict with
}

TEST(OpPlannerTest, AForcedAlgorithmThatDoesNotFitTheLayoutFallsBackToTheTuner) {
  // hier needs the same number of ranks on every node.
  const auto layout = scheduler::CommLayout::FromNodeOfRank({0, 0, 1}, 1);
  OpPlanner planner(layout, 0, TunerFor(layout), "", 4096);
  auto plan = planner.Plan(Ptrs(Requests(2, OpKind::kAllReduce, 4096, "hier")));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->algorithm, "hier");
  EXPECT_FALSE(plan->forced);
}

TEST(OpPlannerTest, AllToAllvIsLocalOnOneNodeAndDirectAcrossNodes) {
  {
    const auto layout = scheduler::CommLayout::Uniform(1, 2, 1);
    OpPlanner planner(layout, 0, TunerFor(layout), "", 4096);
    auto reqs = Requests(2, OpKind::kAllToAllv, 0);
    auto plan = planner.Plan(Ptrs(reqs));
    ASSERT_TRUE(plan.ok());
    EXPECT_TRUE(plan->local());
  }
  const auto layout = scheduler::CommLayout::Uniform(2, 1, 1);
  OpPlanner planner(layout, 0, TunerFor(layout), "", 4096);
  auto reqs = Requests(1, OpKind::kAllToAllv, 0);
  reqs[0].send_counts = {3, 5};
  reqs[0].send_displs = {0, 3};
  reqs[0].recv_counts = {3, 7};
  reqs[0].recv_displs = {0, 3};
  auto plan = planner.Plan(Ptrs(reqs));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->algorithm, scheduler::kAlgoDirect);
  uint64_t sent = 0, received = 0;
  for (const auto& s : plan->schedule->steps) {
    if (s.kind == scheduler::NodeStep::Kind::kSend) sent += s.bytes;
    if (s.kind == scheduler::NodeStep::Kind::kRecv) received += s.bytes;
  }
  EXPECT_EQ(sent, 5 * sizeof(float));      // rank 0's block for rank 1
  EXPECT_EQ(received, 7 * sizeof(float));  // rank 1's block for rank 0
}

}  // namespace
}  // namespace railyard

namespace railyard {
namespace {

TEST(OpPlannerTest, PacedRailsCapEveryMessageAtThePacedChunk) {
  const auto layout = scheduler::CommLayout::Uniform(4, 1, 1);
  OpPlanner planner(layout, 0, TunerFor(layout), "", 256 << 10, /*max_chunk_bytes=*/64 << 10);
  for (const std::string algo : {"", "ring", "rhd"}) {
    auto plan = planner.Plan(Ptrs(Requests(1, OpKind::kAllReduce, uint64_t{4} << 20, algo)));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->chunk_bytes, size_t{64} << 10) << algo;
    size_t sends = 0;
    for (const auto& s : plan->schedule->steps) {
      if (s.kind != scheduler::NodeStep::Kind::kSend) continue;
      ++sends;
      EXPECT_LE(s.bytes, uint64_t{64} << 10) << algo;
    }
    EXPECT_GT(sends, 0u) << algo;
  }
  // Without the cap the tuner's own chunk stands (larger for 16 MiB on this model).
  OpPlanner free_planner(layout, 0, TunerFor(layout), "", 256 << 10);
  auto plan = free_planner.Plan(Ptrs(Requests(1, OpKind::kAllReduce, uint64_t{4} << 20, "ring")));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->chunk_bytes, size_t{256} << 10);
}

}  // namespace
}  // namespace railyard
