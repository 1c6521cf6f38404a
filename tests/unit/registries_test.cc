// DaemonCore's communicator registry on its own: communicators, their builds shared by several
// joins, retirement, and the bootstrap tag slots (sessions: session_registry_test.cc).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/comm/bootstrap.h"
#include "daemon/comm/comm_registry.h"
#include "daemon/scheduler/executor.h"
#include "daemon/util/deadline_timer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fakes.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

class CommRegistryTest : public ::testing::Test {
 protected:
  std::shared_ptr<Communicator> MakeComm(const std::string& id, int nranks = 1) {
    CommEnv env;
    env.executor = &executor_;
    env.timer = &timer_;
    return std::make_shared<Communicator>(id, "job", nranks, env);
  }
  testing::FakeClock clock_;
  DeadlineTimer timer_{&clock_};
  scheduler::Executor executor_{1};
};

TEST_F(CommRegistryTest, OneJoinBuildsTheOthersWaitAndAllGetTheSameCommunicator) {
  CommRegistry reg;
  const CommRegistry::Key key("job", "c1");
  std::shared_ptr<Communicator> found;
  std::vector<std::shared_ptr<Communicator>> got;
  auto record = [&got](const absl::StatusOr<std::shared_ptr<Communicator>>& c) {
    ASSERT_TRUE(c.ok());
    got.push_back(*c);
  };
  EXPECT_EQ(reg.FindOrClaim(key, record, &found), CommRegistry::Claim::kBuild);
  EXPECT_EQ(reg.FindOrClaim(key, record, &found), CommRegistry::Claim::kWaiting);
  EXPECT_EQ(reg.FindOrClaim(key, record, &found), CommRegistry::Claim::kWaiting);
  absl::StatusOr<std::shared_ptr<Communicator>> made = MakeComm("c1");
  auto waiters = reg.Built(key, made);
  ASSERT_EQ(waiters.size(), 2u);
  for (auto& w : waiters) w(made);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], *made);
  EXPECT_EQ(got[1], *made);
  EXPECT_EQ(reg.FindOrClaim(key, record, &found), CommRegistry::Claim::kFound);
  EXPECT_EQ(found, *made);
  EXPECT_EQ(reg.Find(key), *made);
}

TEST_F(CommRegistryTest, AFailedBuildReachesTheWaitersAndRegistersNothing) {
  CommRegistry reg;
  const CommRegistry::Key key("job", "c2");
  std::shared_ptr<Communicator> found;
  absl::Status seen;
  ASSERT_EQ(reg.FindOrClaim(key, nullptr, &found), CommRegistry::Claim::kBuild);
  ASSERT_EQ(
      reg.FindOrClaim(
          key,
          [&seen](const absl::StatusOr<std::shared_ptr<Communicator>>& c) { seen = c.status(); },
          &found),
      CommRegistry::Claim::kWaiting);
  absl::StatusOr<std::shared_ptr<Communicator>> made = absl::UnavailableError("connect failed");
  for (auto& w : reg.Built(key, made)) w(made);
  EXPECT_EQ(seen.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reg.Find(key), nullptr);
  EXPECT_EQ(reg.FindOrClaim(key, nullptr, &found), CommRegistry::Claim::kBuild);  // try again
}

TEST_F(CommRegistryTest, AFailedCommunicatorIsReplacedAndRetiringCountsItsOps) {
  CommRegistry reg;
  const CommRegistry::Key key("job", "c3");
  std::shared_ptr<Communicator> found;
  ASSERT_EQ(reg.FindOrClaim(key, nullptr, &found), CommRegistry::Claim::kBuild);
  absl::StatusOr<std::shared_ptr<Communicator>> first = MakeComm("c3");
  reg.Built(key, first);
  (*first)->Abort(absl::AbortedError("test"), /*notify=*/false);
  EXPECT_EQ(reg.FindOrClaim(key, nullptr, &found), CommRegistry::Claim::kBuild);
  absl::StatusOr<std::shared_ptr<Communicator>> second = MakeComm("c3");
  reg.Built(key, second);
  reg.Retire(*first);  // no longer key's communicator: nothing happens
  EXPECT_EQ(reg.Find(key), *second);
  // One barrier on the second: retiring it adds its operations to the daemon's totals.
  ASSERT_TRUE((*second)->Join(0, absl::Seconds(5), [](const absl::Status&) {}).ok());
  auto sink = std::make_shared<testing::RecordingSink>();
  auto barrier = std::make_unique<PendingRequest>();
  barrier->request_id = 1;
  barrier->session = sink;
  barrier->req.op = scheduler::OpKind::kBarrier;
  ASSERT_TRUE((*second)->Submit(std::move(barrier)).ok());
  ASSERT_TRUE(sink->Wait(1).status.ok());
  reg.Retire(*second);
  EXPECT_EQ(reg.Find(key), nullptr);
  EXPECT_EQ(reg.retired_ops(), std::make_pair(uint64_t{1}, uint64_t{0}));
}

TEST_F(CommRegistryTest, NothingRegistersAfterClose) {
  CommRegistry reg;
  const CommRegistry::Key key("job", "c4");
  std::shared_ptr<Communicator> found;
  ASSERT_EQ(reg.FindOrClaim(key, nullptr, &found), CommRegistry::Claim::kBuild);
  EXPECT_TRUE(reg.Close().empty());
  absl::StatusOr<std::shared_ptr<Communicator>> made = MakeComm("c4");
  reg.Built(key, made);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(reg.Find(key), nullptr);
}

TEST_F(CommRegistryTest, BootstrapSlotsAreSharedPerCommunicatorAndReturnedWhenReleased) {
  CommRegistry reg(2);
  const CommRegistry::Key a("job", "a"), b("job", "b"), c("job", "c");
  auto a1 = reg.BootstrapSlot(a);
  auto a2 = reg.BootstrapSlot(a);  // another local rank of the same communicator
  ASSERT_TRUE(a1.ok() && a2.ok());
  EXPECT_EQ(*a1, *a2);
  auto b1 = reg.BootstrapSlot(b);
  ASSERT_TRUE(b1.ok());
  EXPECT_NE((*b1)->value(), (*a1)->value());
  auto c1 = reg.BootstrapSlot(c);
  EXPECT_EQ(c1.status().code(), absl::StatusCode::kResourceExhausted);
  // The layout of a arrived: the communicator keeps the slot, later joins of a get a new one.
  reg.EndBootstrap(a);
  std::shared_ptr<const scheduler::tags::Slot> held = *a1;
  a1 = absl::UnknownError("dropped");
  a2 = absl::UnknownError("dropped");
  EXPECT_EQ(reg.tag_slots_in_use(), 2);
  held.reset();  // the communicator is gone
  EXPECT_EQ(reg.tag_slots_in_use(), 1);
  auto c2 = reg.BootstrapSlot(c);
  ASSERT_TRUE(c2.ok()) << c2.status();
}

}  // namespace
}  // namespace railyard

namespace railyard {
namespace {

v1::JoinCommResponse LayoutOf(const std::vector<std::pair<std::string, int64_t>>& nodes) {
  v1::JoinCommResponse out;
  for (const auto& [name, slot] : nodes) {
    v1::NodeInfo* n = out.add_nodes();
    n->set_node_name(name);
    if (slot >= 0) n->set_tag_slot(static_cast<uint32_t>(slot));
  }
  return out;
}

// What the coordinator checks in the layout it makes, and every member in the one it receives.
TEST(CommBootstrapTest, LayoutsMustFitTheTagSpace) {
  EXPECT_TRUE(CommBootstrap::CheckLayoutFits(LayoutOf({{"a", 0}, {"b", 17}}), "c").ok());
  EXPECT_TRUE(CommBootstrap::CheckLayoutFits(LayoutOf({{"a", -1}}), "c").ok());  // one node
  auto missing = CommBootstrap::CheckLayoutFits(LayoutOf({{"a", 0}, {"b", -1}}), "c");
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.message(), HasSubstr("node b has no transport"));
  auto wide = CommBootstrap::CheckLayoutFits(LayoutOf({{"a", 0}, {"b", 1 << 16}}), "c");
  EXPECT_EQ(wide.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wide.message(), HasSubstr("does not fit 16 bits"));
  std::vector<std::pair<std::string, int64_t>> many;
  for (int i = 0; i <= scheduler::tags::kMaxNodes; ++i) many.emplace_back("n", i % 4096);
  auto big = CommBootstrap::CheckLayoutFits(LayoutOf(many), "c");
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message(), HasSubstr("4097 nodes"));
}

}  // namespace
}  // namespace railyard
