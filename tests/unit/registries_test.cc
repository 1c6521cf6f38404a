// DaemonCore's communicator registry on its own: communicators, their builds shared by several
// joins, retirement, the bootstrap and its tag slots (sessions: session_registry_test.cc).
#include <malloc.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/comm/bootstrap.h"
#include "daemon/comm/comm_registry.h"
#include "daemon/scheduler/executor.h"
#include "daemon/scheduler/tags.h"
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

// One rank on each node.
// Bytes glibc's allocator has handed out (arenas and mmapped chunks).
size_t HeapBytes() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

v1::JoinCommResponse LayoutOf(const std::vector<std::pair<std::string, int64_t>>& nodes) {
  v1::JoinCommResponse out;
  for (const auto& [name, slot] : nodes) {
    out.add_node_of_rank(out.nodes_size());
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

// A member indexes the layout's nodes with node_of_rank (DaemonCommFactory::MakeMultiNode): a
// coordinator's layout whose ranks name nodes it does not list, or that lists nodes no rank is
// on, is refused before anything is built from it (found by tests/fuzz/peer_join_fuzz).
TEST(CommBootstrapTest, LayoutsMustPlaceEveryRankOnAListedNode) {
  v1::JoinCommResponse two = LayoutOf({{"a", 0}, {"b", 1}});
  two.add_node_of_rank(1);
  EXPECT_TRUE(CommBootstrap::CheckLayoutFits(two, "c").ok());

  v1::JoinCommResponse no_ranks = two;
  no_ranks.clear_node_of_rank();
  auto empty = CommBootstrap::CheckLayoutFits(no_ranks, "c");
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.message(), HasSubstr("layout of 0 ranks, not in [1, 65536]"));

  for (int bad : {2, -1, 1 << 30}) {
    v1::JoinCommResponse past = two;
    past.set_node_of_rank(1, bad);
    auto s = CommBootstrap::CheckLayoutFits(past, "c");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(),
                HasSubstr(absl::StrCat("node_of_rank[1] is ", bad, " but the layout has 2 nodes")));
  }

  v1::JoinCommResponse idle = two;
  idle.set_node_of_rank(0, 1);
  auto s = CommBootstrap::CheckLayoutFits(idle, "c");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("node 0 (a) of the layout holds no rank"));

  v1::JoinCommResponse twice = two;
  twice.mutable_nodes(1)->set_node_name("a");  // no peer address: the name is the daemon's id
  auto d = CommBootstrap::CheckLayoutFits(twice, "c");
  EXPECT_EQ(d.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.message(), HasSubstr("nodes 0 and 1 of the layout are one daemon (a)"));

  v1::JoinCommResponse wide;
  wide.add_nodes()->set_node_name("a");
  for (int r = 0; r <= scheduler::tags::kMaxRanks; ++r) wide.add_node_of_rank(0);
  auto w = CommBootstrap::CheckLayoutFits(wide, "c");
  EXPECT_EQ(w.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.message(), HasSubstr("layout of 65537 ranks"));
}

v1::JoinCommRequest JoinOf(const std::string& comm, int rank, int nranks, const std::string& node) {
  v1::JoinCommRequest req;
  req.set_job_id("job");
  req.set_comm_id(comm);
  req.set_rank(rank);
  req.set_nranks(nranks);
  req.mutable_node()->set_node_name(node);
  req.mutable_node()->set_peer_address(node + ":1");
  req.mutable_node()->set_tag_slot(3);
  return req;
}

struct JoinAnswers {
  std::vector<absl::StatusOr<v1::JoinCommResponse>> got;
  CommBootstrap::Done Done() {
    return [this](const absl::StatusOr<v1::JoinCommResponse>& r) { got.push_back(r); };
  }
};

TEST(CommBootstrapTest, EveryRankGetsTheLayoutOnceTheLastJoins) {
  testing::FakeClock clock;
  DeadlineTimer timer(&clock);
  CommBootstrap bootstrap(&timer);
  JoinAnswers answers;
  ASSERT_TRUE(bootstrap.Join(JoinOf("c", 2, 3, "b"), absl::Seconds(5), answers.Done()).ok());
  ASSERT_TRUE(bootstrap.Join(JoinOf("c", 0, 3, "a"), absl::Seconds(5), answers.Done()).ok());
  EXPECT_EQ(bootstrap.Join(JoinOf("c", 0, 3, "a"), absl::Seconds(5), answers.Done()).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(bootstrap.Join(JoinOf("c", 1, 4, "a"), absl::Seconds(5), answers.Done()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(answers.got.empty());
  ASSERT_TRUE(bootstrap.Join(JoinOf("c", 1, 3, "a"), absl::Seconds(5), answers.Done()).ok());
  ASSERT_EQ(answers.got.size(), 3u);
  for (const auto& r : answers.got) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->nodes_size(), 2);
    EXPECT_EQ(r->nodes(0).node_name(), "a");  // the node of rank 0 first
    EXPECT_THAT(r->node_of_rank(), ::testing::ElementsAre(0, 0, 1));
  }
  clock.Advance(absl::Seconds(10));
  EXPECT_EQ(timer.RunDue(), 0);  // the deadline was cancelled
}

TEST(CommBootstrapTest, ShutdownAnswersEveryPendingJoinAndRefusesLaterOnes) {
  testing::FakeClock clock;
  DeadlineTimer timer(&clock);
  CommBootstrap bootstrap(&timer);
  JoinAnswers answers;
  ASSERT_TRUE(bootstrap.Join(JoinOf("c", 0, 3, "a"), absl::Seconds(5), answers.Done()).ok());
  ASSERT_TRUE(bootstrap.Join(JoinOf("c", 2, 3, "b"), absl::Seconds(5), answers.Done()).ok());
  ASSERT_TRUE(bootstrap.Join(JoinOf("d", 0, 2, "a"), absl::Seconds(5), answers.Done()).ok());
  bootstrap.Shutdown(absl::UnavailableError("railyardd is shutting down"));
  ASSERT_EQ(answers.got.size(), 3u);
  for (const auto& r : answers.got) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(r.status().message(), "railyardd is shutting down");
  }
  EXPECT_EQ(bootstrap.pending(), 0u);
  EXPECT_EQ(bootstrap.pending_bytes(), 0u);
  EXPECT_EQ(bootstrap.Join(JoinOf("c", 1, 3, "a"), absl::Seconds(5), answers.Done()).code(),
            absl::StatusCode::kUnavailable);
  clock.Advance(absl::Seconds(10));
  EXPECT_EQ(timer.RunDue(), 0);  // their deadlines were cancelled
  EXPECT_EQ(answers.got.size(), 3u);
}

// A join's nranks used to size the pending state (a NodeInfo, a flag and a callback per rank),
// so one small JoinComm with nranks 65536 made the coordinator hold ~7 MB until its deadline
// (seen while writing tests/fuzz/peer_join_fuzz; through it, 274 such joins, 4 KB, took 2 GB). Now
// it holds what joined, and the deadline's message lists at most 16 missing ranks.
TEST(CommBootstrapTest, PendingJoinsHoldOnlyWhatJoined) {
  testing::FakeClock clock;
  DeadlineTimer timer(&clock);
  CommBootstrap::Limits limits;
  limits.max_pending_per_job = 0;  // one job's 201 bootstraps: no share
  CommBootstrap bootstrap(&timer, limits);
  JoinAnswers answers;
  // ASan's allocator is not glibc's: mallinfo2 sees nothing of it (build-asan).
#if defined(__SANITIZE_ADDRESS__)
  constexpr bool kHeapVisible = false;
#else
  constexpr bool kHeapVisible = true;
#endif
  const size_t before = HeapBytes();
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(bootstrap
                    .Join(JoinOf(absl::StrCat("c", i), 0, scheduler::tags::kMaxRanks, "a"),
                          absl::Seconds(5), answers.Done())
                    .ok());
  }
  if (kHeapVisible) {
    EXPECT_LT(HeapBytes() - before, size_t{16} << 20);
  }
  ASSERT_TRUE(bootstrap.Join(JoinOf("d", 3, 5, "a"), absl::Seconds(5), answers.Done()).ok());
  clock.Advance(absl::Seconds(6));
  EXPECT_EQ(timer.RunDue(), 201);
  ASSERT_EQ(answers.got.size(), 201u);
  EXPECT_EQ(answers.got[0].status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(
      answers.got[0].status().message(),
      "communicator c0: ranks 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 and 65519 "
      "more of 65536 did not join in time");
  EXPECT_EQ(answers.got[200].status().message(),
            "communicator d: ranks 0, 1, 2, 4 of 5 did not join in time");
}

// One job's bootstraps that never complete fill its share, not the coordinator: every other job
// still forms communicators (issue 55: 1,100 InitComm calls of one session filled all 1024
// slots). Its share comes back as its bootstraps expire or complete.
TEST(CommBootstrapTest, OneJobsPendingBootstrapsStopAtItsShareAndOthersAreServed) {
  testing::FakeClock clock;
  DeadlineTimer timer(&clock);
  CommBootstrap::Limits limits;
  limits.max_pending = 10;
  limits.max_pending_per_job = 4;
  CommBootstrap bootstrap(&timer, limits);
  JoinAnswers answers;
  const auto join = [&](const std::string& job, const std::string& comm, int rank, int nranks) {
    v1::JoinCommRequest req = JoinOf(comm, rank, nranks, "a");
    req.set_job_id(job);
    return bootstrap.Join(req, absl::Seconds(5), answers.Done());
  };
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(join("hog", absl::StrCat("h", i), 0, 2).ok());
  const absl::Status refused = join("hog", "h4", 0, 2);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(),
            "job hog has 4 communicator bootstraps waiting for ranks on this coordinator, its "
            "share (--max_pending_joins_per_job); other jobs are still served");
  // A rank of a bootstrap the job already has still joins it (no new slot).
  EXPECT_TRUE(join("hog", "h0", 1, 2).ok());
  EXPECT_EQ(bootstrap.pending_of("hog"), 3u);
  // Other jobs form theirs, up to the pool's backstop.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(join("a", absl::StrCat("a", i), 0, 2).ok());
  ASSERT_TRUE(join("b", "b0", 0, 2).ok());
  ASSERT_TRUE(join("b", "b1", 0, 2).ok());
  ASSERT_TRUE(join("hog", "h4", 0, 2).ok());  // its completed one's slot came back
  const absl::Status full = join("c", "c0", 0, 2);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()), ::testing::HasSubstr("(--max_pending_joins)"));
  clock.Advance(absl::Seconds(6));
  timer.RunDue();
  EXPECT_EQ(bootstrap.pending(), 0u);
  EXPECT_EQ(bootstrap.pending_of("hog"), 0u);
  EXPECT_EQ(bootstrap.pending_bytes(), 0u);
  EXPECT_TRUE(join("c", "c0", 0, 2).ok());
}

TEST(CommBootstrapTest, OneJobsNodeInformationStopsAtItsShareOfTheBytes) {
  testing::FakeClock clock;
  DeadlineTimer timer(&clock);
  CommBootstrap::Limits limits;
  limits.max_pending_bytes_per_job = 300;  // two joins of ~130 bytes, not three
  CommBootstrap bootstrap(&timer, limits);
  JoinAnswers answers;
  v1::JoinCommRequest big = JoinOf("x", 0, 100, "a");
  big.mutable_node()->set_node_name(std::string(120, 'n'));
  ASSERT_TRUE(bootstrap.Join(big, absl::Seconds(5), answers.Done()).ok());
  big.set_rank(1);
  ASSERT_TRUE(bootstrap.Join(big, absl::Seconds(5), answers.Done()).ok());
  big.set_rank(2);
  const absl::Status s = bootstrap.Join(big, absl::Seconds(5), answers.Done());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("job job's pending communicator"));
  v1::JoinCommRequest other = big;
  other.set_job_id("other");
  other.set_comm_id("y");
  EXPECT_TRUE(bootstrap.Join(other, absl::Seconds(5), answers.Done()).ok());
}

}  // namespace
}  // namespace railyard
