// Communicator on its own: joins, the merge of ranks' submissions, the planner's algorithm,
// deadlines on a fake clock, and multi-node execution over the in-process transport (two
// "daemons" in one process). No processes, no sleeping for deadlines.
#include "daemon/comm/communicator.h"

#include <atomic>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/diagnose/rail_check.h"
#include "daemon/scheduler/executor.h"
#include "daemon/scheduler/tags.h"
#include "daemon/util/deadline_timer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fakes.h"
#include "tests/unit/inproc_nodes.h"

namespace railyard {
namespace {

using scheduler::OpKind;
using testing::FakeClock;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using testing::RecordingSink;

// A rank's float buffer and the request that reduces it in place.
struct RankBuffer {
  std::vector<float> data;
  std::unique_ptr<PendingRequest> Request(uint64_t id, int rank, OpKind op,
                                          const std::shared_ptr<RecordingSink>& sink,
                                          const std::string& algo = "") {
    auto p = std::make_unique<PendingRequest>();
    p->request_id = id;
    p->rank = rank;
    p->session = sink;
    p->req.op = op;
    p->req.dtype = kernels::DataType::kFloat32;
    p->req.red_op = kernels::RedOp::kSum;
    p->req.count = op == OpKind::kBarrier ? 0 : data.size();
    p->req.algo = algo;
    p->req.send = reinterpret_cast<std::byte*>(data.data());
    p->req.recv = reinterpret_cast<std::byte*>(data.data());
    return p;
  }
};

class CommunicatorTest : public ::testing::Test {
 protected:
  CommEnv Env(std::string algo = "") {
    CommEnv env;
    env.executor = &executor_;
    env.timer = &timer_;
    env.chunk_bytes = 4096;
    env.op_timeout = absl::Seconds(30);
    env.default_algo = std::move(algo);
    return env;
  }
  // Joins every rank of comm (all local) and checks that each join completes OK.
  void JoinAll(Communicator& comm, const std::vector<int>& ranks) {
    auto joined = std::make_shared<std::atomic<int>>(0);
    for (int r : ranks) {
      ASSERT_TRUE(comm.Join(r, absl::Seconds(10),
                            [joined](const absl::Status& s) {
                              EXPECT_TRUE(s.ok()) << s;
                              ++*joined;
                            })
                      .ok());
    }
    EXPECT_EQ(joined->load(), static_cast<int>(ranks.size()));
  }

  FakeClock clock_;
  DeadlineTimer timer_{&clock_};
  scheduler::Executor executor_{2};
  std::shared_ptr<RecordingSink> sink_ = std::make_shared<RecordingSink>();
};

TEST_F(CommunicatorTest, OneNodeAllReduceByTheLocalPlanAndByAForcedRing) {
  auto comm = std::make_shared<Communicator>("c1", "job", 3, Env());
  JoinAll(*comm, {0, 1, 2});
  std::vector<RankBuffer> bufs(3);
  uint64_t id = 1;
  for (const std::string algo : {"", "ring", "local"}) {
    for (int r = 0; r < 3; ++r) {
      bufs[r].data.assign(10000, static_cast<float>(r + 1));
      auto seq = comm->Submit(bufs[r].Request(id + r, r, OpKind::kAllReduce, sink_, algo));
      ASSERT_TRUE(seq.ok()) << seq.status();
    }
    for (int r = 0; r < 3; ++r) {
      const auto c = sink_->Wait(id + r);
      ASSERT_TRUE(c.status.ok()) << algo << ": " << c.status;
      EXPECT_EQ(sink_->Count(id + r), 1u);
      for (float v : bufs[r].data) ASSERT_EQ(v, 6.0f) << algo;
    }
    id += 3;
  }
  EXPECT_EQ(comm->Stats().ops_completed, 3u);
}

TEST_F(CommunicatorTest, ARankThatNeverSubmitsIsNamedAtTheDeadline) {
  auto comm = std::make_shared<Communicator>("c2", "job", 2, Env());
  JoinAll(*comm, {0, 1});
  RankBuffer b{std::vector<float>(16, 1.0f)};
  ASSERT_TRUE(comm->Submit(b.Request(7, 0, OpKind::kAllReduce, sink_)).ok());
  EXPECT_EQ(timer_.RunDue(), 0);  // nothing due yet
  EXPECT_EQ(sink_->Count(7), 0u);
  clock_.Advance(absl::Seconds(31));
  EXPECT_GE(timer_.RunDue(), 1);
  const auto c = sink_->Wait(7);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(c.status.message(), HasSubstr("rank 1 of 2 did not submit"));
  // The communicator is aborted: later work is refused at once.
  auto later = comm->Submit(b.Request(8, 1, OpKind::kAllReduce, sink_));
  EXPECT_EQ(later.status().code(), absl::StatusCode::kAborted);
}

TEST_F(CommunicatorTest, RanksThatDisagreeFailWithTheirShapes) {
  auto comm = std::make_shared<Communicator>("c3", "job", 2, Env());
  JoinAll(*comm, {0, 1});
  RankBuffer a{std::vector<float>(16, 1.0f)};
  RankBuffer b{std::vector<float>(32, 1.0f)};
  ASSERT_TRUE(comm->Submit(a.Request(1, 0, OpKind::kAllReduce, sink_)).ok());
  auto second = comm->Submit(b.Request(2, 1, OpKind::kAllReduce, sink_));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sink_->Wait(1).status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(comm->failed());
}

TEST_F(CommunicatorTest, JoinDeadlineNamesTheMissingRanks) {
  auto comm = std::make_shared<Communicator>("c4", "job", 3, Env());
  absl::Status got;
  ASSERT_TRUE(comm->Join(1, absl::Seconds(5), [&got](const absl::Status& s) { got = s; }).ok());
  EXPECT_EQ(comm->Join(1, absl::Seconds(5), [](const absl::Status&) {}).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(comm->Join(3, absl::Seconds(5), [](const absl::Status&) {}).code(),
            absl::StatusCode::kInvalidArgument);
  clock_.Advance(absl::Seconds(6));
  timer_.RunDue();
  EXPECT_EQ(got.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.message(), HasSubstr("ranks 0, 2 of 3 did not join"));
}

TEST_F(CommunicatorTest, LocalSendRecvPairsMatchInOrder) {
  auto comm = std::make_shared<Communicator>("c5", "job", 2, Env());
  JoinAll(*comm, {0, 1});
  RankBuffer s1{std::vector<float>(100, 3.0f)}, s2{std::vector<float>(100, 4.0f)};
  RankBuffer r1{std::vector<float>(100, 0.0f)}, r2{std::vector<float>(100, 0.0f)};
  auto send = [&](RankBuffer& b, uint64_t id) {
    auto p = b.Request(id, 0, OpKind::kSend, sink_);
    p->req.root = 1;
    return comm->Submit(std::move(p));
  };
  auto recv = [&](RankBuffer& b, uint64_t id) {
    auto p = b.Request(id, 1, OpKind::kRecv, sink_);
    p->req.root = 0;
    return comm->Submit(std::move(p));
  };
  ASSERT_TRUE(recv(r1, 11).ok());
  ASSERT_TRUE(send(s1, 1).ok());
  ASSERT_TRUE(send(s2, 2).ok());
  ASSERT_TRUE(recv(r2, 12).ok());
  for (uint64_t id : {1, 2, 11, 12}) ASSERT_TRUE(sink_->Wait(id).status.ok());
  EXPECT_EQ(r1.data, s1.data);
  EXPECT_EQ(r2.data, s2.data);
}

// Quotas of the sessions that submit (daemon/session/quota.h): a job's accounts with small limits.
TEST_F(CommunicatorTest, AHandoverRunsWhatEveryRankSubmittedAndHandsBackTheRest) {
  auto comm = std::make_shared<Communicator>("c6", "job", 2, Env());
  JoinAll(*comm, {0, 1});
  RankBuffer a{std::vector<float>(64, 1.0f)}, b{std::vector<float>(64, 2.0f)};
  RankBuffer c{std::vector<float>(64, 5.0f)};
  RankBuffer s{std::vector<float>(8, 7.0f)};
  // seq 0: both ranks in (complete); seq 1: rank 0 only; a send still waiting for its receive.
  ASSERT_TRUE(comm->Submit(a.Request(1, 0, OpKind::kAllReduce, sink_)).ok());
  ASSERT_TRUE(comm->Submit(b.Request(2, 1, OpKind::kAllReduce, sink_)).ok());
  ASSERT_TRUE(comm->Submit(c.Request(3, 0, OpKind::kAllReduce, sink_)).ok());
  auto send = s.Request(4, 0, OpKind::kSend, sink_);
  send->req.root = 1;
  ASSERT_TRUE(comm->Submit(std::move(send)).ok());
  comm->BeginHandover("handing over (test)");
  // The complete one ran, exactly; the rest came back marked moved, untouched.
  ASSERT_TRUE(sink_->Wait(1).status.ok());
  ASSERT_TRUE(sink_->Wait(2).status.ok());
  for (float v : a.data) ASSERT_EQ(v, 3.0f);
  for (uint64_t id : {3, 4}) {
    const auto moved = sink_->Wait(id);
    EXPECT_EQ(moved.status.code(), absl::StatusCode::kUnavailable) << moved.status;
    EXPECT_TRUE(IsMoved(moved.status)) << moved.status;
    EXPECT_EQ(sink_->Count(id), 1u);
  }
  for (float v : c.data) ASSERT_EQ(v, 5.0f);
  // What comes after goes back too, and nothing is left running.
  auto later = comm->Submit(b.Request(5, 1, OpKind::kAllReduce, sink_));
  EXPECT_TRUE(IsMoved(later.status())) << later.status();
  for (int i = 0; i < 100 && !comm->idle(); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(comm->idle());
}

// A rank that leaves cleanly (DestroyComm with nothing of its own pending), as NCCL's
// ncclCommDestroy: the other ranks' sends and receives among themselves go on; a collective,
// which needs every rank, fails naming the rank that left, as does a send to it.
TEST_F(CommunicatorTest, ACleanLeaveLetsTheOthersPointToPointFinishAndFailsLaterCollectives) {
  auto comm = std::make_shared<Communicator>("c9", "job", 3, Env());
  JoinAll(*comm, {0, 1, 2});
  RankBuffer s{std::vector<float>(32, 9.0f)}, r{std::vector<float>(32, 0.0f)};
  auto recv = r.Request(1, 2, OpKind::kRecv, sink_);
  recv->req.root = 1;
  ASSERT_TRUE(comm->Submit(std::move(recv)).ok());
  comm->Leave(0, absl::AbortedError("rank 0 destroyed communicator c9"), /*graceful=*/true);
  EXPECT_FALSE(comm->failed());
  auto send = s.Request(2, 1, OpKind::kSend, sink_);
  send->req.root = 2;
  ASSERT_TRUE(comm->Submit(std::move(send)).ok());
  ASSERT_TRUE(sink_->Wait(1).status.ok());
  ASSERT_TRUE(sink_->Wait(2).status.ok());
  EXPECT_EQ(r.data, s.data);
  auto to_gone = s.Request(3, 1, OpKind::kSend, sink_);
  to_gone->req.root = 0;
  const auto refused = comm->Submit(std::move(to_gone));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAborted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("rank 0 has left communicator c9"));
  EXPECT_FALSE(comm->failed());
  const auto coll = comm->Submit(s.Request(4, 1, OpKind::kAllReduce, sink_));
  EXPECT_EQ(coll.status().code(), absl::StatusCode::kAborted) << coll.status();
  EXPECT_THAT(coll.status().message(), HasSubstr("rank 0 destroyed communicator c9"));
  EXPECT_TRUE(comm->failed());
}

TEST_F(CommunicatorTest, ACleanLeaveFailsACollectiveAlreadyWaitingAndALeaveWithWorkAborts) {
  {
    auto comm = std::make_shared<Communicator>("c10", "job", 2, Env());
    JoinAll(*comm, {0, 1});
    RankBuffer a{std::vector<float>(16, 1.0f)};
    ASSERT_TRUE(comm->Submit(a.Request(1, 0, OpKind::kAllReduce, sink_)).ok());
    comm->Leave(1, absl::AbortedError("rank 1 destroyed communicator c10"), /*graceful=*/true);
    const auto c = sink_->Wait(1);
    EXPECT_EQ(c.status.code(), absl::StatusCode::kAborted) << c.status;
    EXPECT_THAT(c.status.message(), HasSubstr("rank 1 destroyed communicator c10"));
  }
  {
    // Rank 0 leaves with its own collective queued: not clean, the communicator aborts.
    auto comm = std::make_shared<Communicator>("c11", "job", 2, Env());
    JoinAll(*comm, {0, 1});
    RankBuffer a{std::vector<float>(16, 1.0f)};
    ASSERT_TRUE(comm->Submit(a.Request(11, 0, OpKind::kAllReduce, sink_)).ok());
    comm->Leave(0, absl::AbortedError("rank 0 destroyed communicator c11"), /*graceful=*/true);
    EXPECT_TRUE(comm->failed());
    EXPECT_EQ(sink_->Wait(11).status.code(), absl::StatusCode::kAborted);
  }
}

TEST_F(CommunicatorTest, RejoinedRanksGoOnFromTheHighestResumeSeq) {
  auto comm = std::make_shared<Communicator>("c7", "job", 2, Env());
  // Rank 0's copy of seq 5 failed in a restart (it resumes at 6); rank 1 would run 5 next.
  ASSERT_TRUE(comm->Join(
                      0, absl::Seconds(5), [](const absl::Status&) {}, 6)
                  .ok());
  ASSERT_TRUE(comm->Join(
                      1, absl::Seconds(5), [](const absl::Status&) {}, 5)
                  .ok());
  EXPECT_EQ(comm->first_seq(), 6u);
  RankBuffer a{std::vector<float>(16, 1.0f)}, b{std::vector<float>(16, 2.0f)};
  auto s0 = comm->Submit(a.Request(1, 0, OpKind::kAllReduce, sink_));
  auto s1 = comm->Submit(b.Request(2, 1, OpKind::kAllReduce, sink_));
  ASSERT_TRUE(s0.ok() && s1.ok());
  EXPECT_EQ(*s0, 6u);
  EXPECT_EQ(*s1, 6u);
  EXPECT_EQ(sink_->Wait(1).seq, 6u);
  for (float v : a.data) ASSERT_EQ(v, 3.0f);
}

struct Quotas {
  explicit Quotas(uint64_t ops_per_session, uint64_t ops_per_job, uint64_t p2p_per_session = 0,
                  uint64_t p2p_per_job = 0) {
    limits.per_session[static_cast<int>(Resource::kQueuedOps)] = ops_per_session;
    limits.per_job[static_cast<int>(Resource::kQueuedOps)] = ops_per_job;
    limits.per_session[static_cast<int>(Resource::kQueuedP2p)] = p2p_per_session;
    limits.per_job[static_cast<int>(Resource::kQueuedP2p)] = p2p_per_job;
  }
  std::shared_ptr<QuotaAccount> Session(const std::string& job) {
    auto& usage = jobs[job];
    if (usage == nullptr) usage = std::make_shared<JobUsage>(job);
    return std::make_shared<QuotaAccount>(&limits, usage);
  }
  QuotaLimits limits;  // 0 everywhere else: unlimited
  std::map<std::string, std::shared_ptr<JobUsage>> jobs;
};

std::unique_ptr<PendingRequest> Charged(std::unique_ptr<PendingRequest> p,
                                        std::shared_ptr<QuotaAccount> quota) {
  p->quota = std::move(quota);
  return p;
}

TEST_F(CommunicatorTest, QueuedCollectivesPastTheSessionQuotaAreRefusedWithoutConsumingASequence) {
  Quotas q(/*ops_per_session=*/2, /*ops_per_job=*/0);
  auto fast = q.Session("job");  // rank 0 runs ahead
  auto slow = q.Session("job");
  auto comm = std::make_shared<Communicator>("cq", "job", 2, Env());
  JoinAll(*comm, {0, 1});
  RankBuffer a{std::vector<float>(64, 1.0f)}, b{std::vector<float>(64, 2.0f)};
  for (uint64_t id : {1, 2}) {
    auto seq = comm->Submit(Charged(a.Request(id, 0, OpKind::kAllReduce, sink_), fast));
    ASSERT_TRUE(seq.ok()) << seq.status();
    EXPECT_EQ(*seq, id - 1);
  }
  EXPECT_EQ(fast->used(Resource::kQueuedOps), 2u);
  EXPECT_EQ(fast->job().used(Resource::kQueuedOps), 2u);
  auto over = comm->Submit(Charged(a.Request(3, 0, OpKind::kAllReduce, sink_), fast));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(),
              HasSubstr("allreduce of rank 0 on communicator cq refused: operations queued ahead "
                        "of the slowest rank limit of this session (2) reached: it holds 2 and "
                        "asked for 1 more (--max_queued_ops_per_session)"));
  EXPECT_EQ(sink_->Count(3), 0u);  // refused, not accepted: no completion will come
  EXPECT_EQ(fast->used(Resource::kQueuedOps), 2u);
  EXPECT_EQ(comm->Stats().queued_ops, 2u);
  EXPECT_FALSE(comm->failed());
  // The slow rank catches up: both collectives run and the charges come back.
  for (uint64_t id : {11, 12}) {
    ASSERT_TRUE(comm->Submit(Charged(b.Request(id, 1, OpKind::kAllReduce, sink_), slow)).ok());
  }
  for (uint64_t id : {1, 2, 11, 12}) ASSERT_TRUE(sink_->Wait(id).status.ok()) << id;
  EXPECT_EQ(fast->used(Resource::kQueuedOps), 0u);
  EXPECT_EQ(slow->used(Resource::kQueuedOps), 0u);
  EXPECT_EQ(fast->job().used(Resource::kQueuedOps), 0u);
  // The refused submit consumed nothing: rank 0's next collective is sequence 2, and runs.
  auto again = comm->Submit(Charged(a.Request(4, 0, OpKind::kAllReduce, sink_), fast));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, 2u);
  ASSERT_TRUE(comm->Submit(Charged(b.Request(13, 1, OpKind::kAllReduce, sink_), slow)).ok());
  EXPECT_EQ(sink_->Wait(4).seq, 2u);
  EXPECT_TRUE(sink_->Wait(13).status.ok());
  EXPECT_EQ(comm->Stats().ops_completed, 3u);
}

TEST_F(CommunicatorTest, TheJobQuotaSpansItsSessionsAndCommunicatorsButNotOtherJobs) {
  Quotas q(/*ops_per_session=*/0, /*ops_per_job=*/2);
  auto a0 = q.Session("a"), a1 = q.Session("a"), a2 = q.Session("a");
  auto b0 = q.Session("b");
  auto x = std::make_shared<Communicator>("x", "a", 2, Env());
  auto y = std::make_shared<Communicator>("y", "a", 2, Env());
  auto z = std::make_shared<Communicator>("z", "b", 2, Env());
  JoinAll(*x, {0, 1});
  JoinAll(*y, {0, 1});
  JoinAll(*z, {0, 1});
  RankBuffer buf{std::vector<float>(8, 1.0f)};
  ASSERT_TRUE(x->Submit(Charged(buf.Request(1, 0, OpKind::kBarrier, sink_), a0)).ok());
  ASSERT_TRUE(x->Submit(Charged(buf.Request(2, 0, OpKind::kBarrier, sink_), a0)).ok());
  // Another session of job a, on another communicator: the job holds 2 already.
  auto over = y->Submit(Charged(buf.Request(3, 0, OpKind::kBarrier, sink_), a2));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(),
              HasSubstr("barrier of rank 0 on communicator y refused: operations queued ahead of "
                        "the slowest rank limit of this job (2) reached: it holds 2 and asked for "
                        "1 more (--max_queued_ops_per_job)"));
  EXPECT_EQ(a2->used(Resource::kQueuedOps), 0u);  // all-or-nothing: the session was not charged
  // Job b is not affected.
  ASSERT_TRUE(z->Submit(Charged(buf.Request(21, 0, OpKind::kBarrier, sink_), b0)).ok());
  EXPECT_EQ(b0->job().used(Resource::kQueuedOps), 1u);
  // x's slowest rank is what job a's backlog waits for: the job's limit never holds it back.
  for (uint64_t id : {11, 12}) {
    ASSERT_TRUE(x->Submit(Charged(buf.Request(id, 1, OpKind::kBarrier, sink_), a1)).ok());
  }
  // y takes the refused collective again, as its seq 0, once the backlog drained.
  for (uint64_t id : {1, 2, 11, 12}) ASSERT_TRUE(sink_->Wait(id).status.ok());
  EXPECT_EQ(a0->job().used(Resource::kQueuedOps), 0u);
  auto later = y->Submit(Charged(buf.Request(4, 0, OpKind::kBarrier, sink_), a2));
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(*later, 0u);
  EXPECT_EQ(a2->job().used(Resource::kQueuedOps), 1u);
}

TEST_F(CommunicatorTest, QueuedWorkThatFailsGivesItsChargesBack) {
  Quotas q(/*ops_per_session=*/4, /*ops_per_job=*/0, /*p2p_per_session=*/4);
  auto s0 = q.Session("job");
  auto comm = std::make_shared<Communicator>("cf", "job", 2, Env());
  JoinAll(*comm, {0, 1});
  RankBuffer buf{std::vector<float>(16, 1.0f)};
  ASSERT_TRUE(comm->Submit(Charged(buf.Request(1, 0, OpKind::kAllReduce, sink_), s0)).ok());
  ASSERT_TRUE(comm->Submit(Charged(buf.Request(2, 0, OpKind::kAllReduce, sink_), s0)).ok());
  auto send = Charged(buf.Request(3, 0, OpKind::kSend, sink_), s0);
  send->req.root = 1;
  ASSERT_TRUE(comm->Submit(std::move(send)).ok());
  EXPECT_EQ(s0->used(Resource::kQueuedOps), 2u);
  EXPECT_EQ(s0->used(Resource::kQueuedP2p), 1u);
  EXPECT_EQ(comm->Stats().queued_ops, 3u);
  comm->Abort(absl::UnavailableError("test abort"));
  for (uint64_t id : {1, 2, 3}) {
    EXPECT_EQ(sink_->Wait(id).status.code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_EQ(s0->used(Resource::kQueuedOps), 0u);
  EXPECT_EQ(s0->used(Resource::kQueuedP2p), 0u);
  EXPECT_EQ(s0->job().used(Resource::kQueuedP2p), 0u);
}

TEST_F(CommunicatorTest, SendsWaitingForTheirPeerPastTheQuotaAreRefusedUntilMatched) {
  Quotas q(0, 0, /*p2p_per_session=*/2, /*p2p_per_job=*/0);
  auto s0 = q.Session("job"), s1 = q.Session("job");
  auto comm = std::make_shared<Communicator>("cp", "job", 2, Env());
  JoinAll(*comm, {0, 1});
  RankBuffer src{std::vector<float>(32, 7.0f)};
  std::vector<RankBuffer> dst(3, RankBuffer{std::vector<float>(32, 0.0f)});
  auto send = [&](uint64_t id) {
    auto p = Charged(src.Request(id, 0, OpKind::kSend, sink_), s0);
    p->req.root = 1;
    return comm->Submit(std::move(p));
  };
  auto recv = [&](RankBuffer& b, uint64_t id) {
    auto p = Charged(b.Request(id, 1, OpKind::kRecv, sink_), s1);
    p->req.root = 0;
    return comm->Submit(std::move(p));
  };
  ASSERT_TRUE(send(1).ok());
  ASSERT_TRUE(send(2).ok());
  auto over = send(3);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(),
              HasSubstr("send of rank 0 on communicator cp refused: point-to-point messages "
                        "queued limit of this session (2) reached: it holds 2 and asked for 1 "
                        "more (--max_queued_p2p_per_session)"));
  EXPECT_EQ(comm->Stats().queued_ops, 2u);
  EXPECT_FALSE(comm->failed());
  // The receives match both sends; the refused one took no place in the channel's order.
  ASSERT_TRUE(recv(dst[0], 11).ok());
  ASSERT_TRUE(recv(dst[1], 12).ok());
  for (uint64_t id : {1, 2, 11, 12}) ASSERT_TRUE(sink_->Wait(id).status.ok()) << id;
  EXPECT_EQ(s0->used(Resource::kQueuedP2p), 0u);
  EXPECT_EQ(s1->used(Resource::kQueuedP2p), 0u);
  auto third = send(4);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(*third, 2u);
  ASSERT_TRUE(recv(dst[2], 13).ok());
  EXPECT_EQ(sink_->Wait(13).seq, 2u);
  EXPECT_EQ(dst[2].data, src.data);
}

// Two daemons in one process: each holds one Communicator per job over an in-process transport
// of 1 rail. Each daemon gives each communicator its own tag slot.
class TwoDaemonsTest : public CommunicatorTest {
 protected:
  // The communicator of job on node `me`, 2 nodes x ranks_per_node ranks, forced algo.
  // wrap: an endpoint around this node's endpoint to its peer (a hostile peer's sends).
  using WrapFn =
      std::function<std::shared_ptr<transport::Endpoint>(std::shared_ptr<transport::Endpoint>)>;
  std::shared_ptr<Communicator> Make(int me, const std::string& id, int ranks_per_node,
                                     const std::vector<uint16_t>& node_slots,
                                     const std::string& algo, const WrapFn& wrap = nullptr) {
    MultiNodeEnv net;
    net.layout = scheduler::CommLayout::Uniform(2, ranks_per_node, 1);
    net.my_node = me;
    net.node_names = {"node0", "node1"};
    net.node_addresses = {"a0", "a1"};
    net.endpoints.assign(2, {});
    const int peer = 1 - me;
    net.endpoints[peer].resize(1);
    std::shared_ptr<transport::Endpoint> ep = nodes_.Connect(me, peer);
    net.endpoints[peer][0] = wrap ? wrap(ep) : ep;
    net.node_slots = node_slots;
    return std::make_shared<Communicator>(id, "job-" + id, Env(algo), std::move(net));
  }

  testing::InProcNodes nodes_;
};

TEST_F(TwoDaemonsTest, AllReduceAcrossNodesWithEachForcedAlgorithm) {
  for (const std::string algo : {"ring", "tree", "rhd", "rd", "direct", "hier"}) {
    std::shared_ptr<Communicator> comm[2] = {Make(0, "x-" + algo, 2, {3, 9}, algo),
                                             Make(1, "x-" + algo, 2, {3, 9}, algo)};
    JoinAll(*comm[0], {0, 1});
    JoinAll(*comm[1], {2, 3});
    std::vector<RankBuffer> bufs(4);
    for (int r = 0; r < 4; ++r) {
      bufs[r].data.assign(3000, static_cast<float>(r));
      ASSERT_TRUE(comm[r / 2]->Submit(bufs[r].Request(100 + r, r, OpKind::kAllReduce, sink_)).ok());
    }
    for (int r = 0; r < 4; ++r) {
      const auto c = sink_->Wait(100 + r);
      ASSERT_TRUE(c.status.ok()) << algo << ": " << c.status;
      for (float v : bufs[r].data) ASSERT_EQ(v, 6.0f) << algo << " rank " << r;
    }
    sink_ = std::make_shared<RecordingSink>();
  }
}

// Device staging's pipelined copies (PendingRequest::input_gate): each rank's memory is still
// being filled when the operation starts. Nothing may read it early, including the first message
// that a small operation would send inside its digest before the run: every node sends that one
// on its own here, and the result is the sum of the filled values, not of what was there before.
TEST_F(TwoDaemonsTest, GatedMemoryIsTouchedOnlyOnceFilledAndRidesInNoDigest) {
  for (const size_t count : {size_t{50}, size_t{30000}}) {  // 200 bytes: a carried message
    const uint64_t id = 200 + count;  // the sink is the test's: one id per round
    std::shared_ptr<Communicator> comm[2] = {
        Make(0, "g" + std::to_string(count), 1, {4, 5}, "ring"),
        Make(1, "g" + std::to_string(count), 1, {4, 5}, "ring")};
    JoinAll(*comm[0], {0});
    JoinAll(*comm[1], {1});
    RankBuffer bufs[2];
    std::shared_ptr<scheduler::FillGate> gates[2];
    for (int r = 0; r < 2; ++r) {
      bufs[r].data.assign(count, -1000.0f);  // a leased buffer's old bytes
      auto p = bufs[r].Request(id + r, r, OpKind::kAllReduce, sink_);
      gates[r] = std::make_shared<scheduler::FillGate>(std::vector<scheduler::FillGate::Region>{
          {reinterpret_cast<const std::byte*>(bufs[r].data.data()), count * 4}});
      p->input_gate = gates[r];
      ASSERT_TRUE(comm[r]->Submit(std::move(p)).ok());
    }
    absl::SleepFor(absl::Milliseconds(50));
    for (int r = 0; r < 2; ++r) EXPECT_EQ(sink_->Count(id + r), 0u) << "count " << count;
    for (int r = 0; r < 2; ++r) {
      for (size_t i = 0; i < count; ++i) bufs[r].data[i] = static_cast<float>((r + 1) * (i % 7));
      gates[r]->Advance(0, count * 4);
    }
    for (int r = 0; r < 2; ++r) {
      const auto c = sink_->Wait(id + r);
      ASSERT_TRUE(c.status.ok()) << c.status;
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(bufs[r].data[i], static_cast<float>(3 * (i % 7)))
            << "count " << count << " " << i;
      }
    }
  }
}

// The in-process twin of the tag-collision integration test: two communicators in lockstep on
// the same two transports (same sequence numbers, nodes and steps), each with its own slots.
TEST_F(TwoDaemonsTest, TwoCommunicatorsInLockstepKeepTheirOwnData) {
  scheduler::tags::TagSlotTable slots[2];
  std::shared_ptr<const scheduler::tags::Slot> held[2][2];
  std::shared_ptr<Communicator> comms[2][2];  // [job][node]
  for (int j = 0; j < 2; ++j) {
    for (int n = 0; n < 2; ++n) held[j][n] = *slots[n].Acquire();
    const std::vector<uint16_t> node_slots = {held[j][0]->value(), held[j][1]->value()};
    for (int n = 0; n < 2; ++n) {
      comms[j][n] = Make(n, "job" + std::to_string(j), 1, node_slots, "ring");
      JoinAll(*comms[j][n], {n});
    }
  }
  for (int iter = 0; iter < 20; ++iter) {
    RankBuffer bufs[2][2];
    for (int j = 0; j < 2; ++j) {
      for (int n = 0; n < 2; ++n) {
        bufs[j][n].data.assign(5000, static_cast<float>(1000 * (j + 1) + n));
        const uint64_t id = 1000 * iter + 10 * j + n;
        ASSERT_TRUE(comms[j][n]->Submit(bufs[j][n].Request(id, n, OpKind::kAllReduce, sink_)).ok());
      }
    }
    for (int j = 0; j < 2; ++j) {
      for (int n = 0; n < 2; ++n) {
        const auto c = sink_->Wait(1000 * iter + 10 * j + n);
        ASSERT_TRUE(c.status.ok()) << c.status;
        const float want = static_cast<float>(2 * 1000 * (j + 1) + 1);
        for (float v : bufs[j][n].data) ASSERT_EQ(v, want) << "job " << j << " iter " << iter;
      }
    }
  }
}

// Who may fail a communicator or heartbeat this daemon for it (PeerPlane::AbortFromPeer,
// Heartbeat): the other nodes by name, never this daemon's own, none of a one-node communicator.
TEST_F(TwoDaemonsTest, PeerNodesAreTheOtherNodesByName) {
  std::shared_ptr<Communicator> comm = Make(0, "members", 1, {3, 9}, "ring");
  EXPECT_TRUE(comm->HasPeerNode("node1"));
  EXPECT_FALSE(comm->HasPeerNode("node0"));
  EXPECT_FALSE(comm->HasPeerNode("node2"));
  EXPECT_FALSE(comm->HasPeerNode(""));
  EXPECT_FALSE(Make(1, "members", 1, {3, 9}, "ring")->HasPeerNode("node1"));
  auto single = std::make_shared<Communicator>("solo", "job", 2, Env(""));
  EXPECT_FALSE(single->HasPeerNode("node0"));
}

TEST_F(TwoDaemonsTest, SendRecvAcrossNodes) {
  std::shared_ptr<Communicator> comm[2] = {Make(0, "p2p", 1, {1, 2}, ""),
                                           Make(1, "p2p", 1, {1, 2}, "")};
  JoinAll(*comm[0], {0});
  JoinAll(*comm[1], {1});
  RankBuffer src{std::vector<float>(777, 5.0f)}, dst{std::vector<float>(777, 0.0f)};
  auto s = src.Request(1, 0, OpKind::kSend, sink_);
  s->req.root = 1;
  auto r = dst.Request(2, 1, OpKind::kRecv, sink_);
  r->req.root = 0;
  ASSERT_TRUE(comm[1]->Submit(std::move(r)).ok());
  ASSERT_TRUE(comm[0]->Submit(std::move(s)).ok());
  ASSERT_TRUE(sink_->Wait(1).status.ok());
  ASSERT_TRUE(sink_->Wait(2).status.ok());
  EXPECT_EQ(dst.data, src.data);
}

// A rank on another daemon that sent and then left cleanly: its data is still received (the
// notice can overtake it); a send to it is refused.
TEST_F(TwoDaemonsTest, AReceiveFromARankThatSentAndLeftStillGetsItsData) {
  std::shared_ptr<Communicator> comm[2] = {Make(0, "sent-left", 1, {1, 2}, ""),
                                           Make(1, "sent-left", 1, {1, 2}, "")};
  JoinAll(*comm[0], {0});
  JoinAll(*comm[1], {1});
  RankBuffer src{std::vector<float>(300, 6.0f)}, dst{std::vector<float>(300, 0.0f)};
  auto s = src.Request(1, 1, OpKind::kSend, sink_);
  s->req.root = 0;
  ASSERT_TRUE(comm[1]->Submit(std::move(s)).ok());
  // (Over UCX an eager send completes before it is received, and its rank may leave at once; the
  // in-process fabric completes it on receipt: the notice arrives first here.)
  comm[0]->RanksDeparted({1}, absl::AbortedError("rank 1 destroyed communicator sent-left"));
  auto r = dst.Request(2, 0, OpKind::kRecv, sink_);
  r->req.root = 1;
  ASSERT_TRUE(comm[0]->Submit(std::move(r)).ok());
  ASSERT_TRUE(sink_->Wait(1).status.ok());
  ASSERT_TRUE(sink_->Wait(2).status.ok());
  EXPECT_EQ(dst.data, src.data);
  auto back = src.Request(3, 0, OpKind::kSend, sink_);
  back->req.root = 1;
  EXPECT_EQ(comm[0]->Submit(std::move(back)).status().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(comm[0]->failed());
}

// A send and a receive across nodes that disagree on the size fail the receive with
// INVALID_ARGUMENT naming both sizes, as on one node (where the daemon sees both and fails
// both); the sender's daemon saw a complete send, as an MPI sender does when its receiver
// truncates.
TEST_F(TwoDaemonsTest, SendRecvAcrossNodesOfDifferentSizesFailTheReceiveWithBothSizes) {
  int n = 0;
  for (auto [send_count, recv_count] : {std::pair{101, 100}, std::pair{100, 101},
                                        std::pair{70000, 69999}, std::pair{69999, 70000}}) {
    SCOPED_TRACE(absl::StrCat(send_count, " sent, ", recv_count, " received"));
    const std::string id = "p2p-size" + std::to_string(n++);
    std::shared_ptr<Communicator> comm[2] = {Make(0, id, 1, {1, 2}, ""),
                                             Make(1, id, 1, {1, 2}, "")};
    JoinAll(*comm[0], {0});
    JoinAll(*comm[1], {1});
    RankBuffer src{std::vector<float>(send_count, 5.0f)};
    RankBuffer dst{std::vector<float>(recv_count, 0.0f)};
    const uint64_t base = 100 * n;
    auto s = src.Request(base + 1, 0, OpKind::kSend, sink_);
    s->req.root = 1;
    auto r = dst.Request(base + 2, 1, OpKind::kRecv, sink_);
    r->req.root = 0;
    ASSERT_TRUE(comm[1]->Submit(std::move(r)).ok());
    ASSERT_TRUE(comm[0]->Submit(std::move(s)).ok());
    const absl::Status got = sink_->Wait(base + 2).status;
    EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument) << got;
    EXPECT_THAT(std::string(got.message()), HasSubstr("send/recv size mismatch"));
    EXPECT_THAT(std::string(got.message()),
                HasSubstr("receives " + std::to_string(recv_count) + " x float ("));
    if (send_count < recv_count) {
      EXPECT_THAT(std::string(got.message()),
                  HasSubstr("rank 0 sent " + std::to_string(send_count * 4) + " bytes"));
    } else {
      EXPECT_THAT(std::string(got.message()),
                  HasSubstr("rank 0 sent more than " + std::to_string(recv_count * 4)));
    }
    sink_->Wait(base + 1);  // the send's outcome, whatever it is: it does not hang
  }
}

TEST_F(TwoDaemonsTest, ReceivesWaitingForAPeerOnAnotherDaemonCountAgainstTheQuota) {
  Quotas q(0, 0, /*p2p_per_session=*/0, /*p2p_per_job=*/1);
  auto r1 = q.Session("job-pq");
  std::shared_ptr<Communicator> comm[2] = {Make(0, "pq", 1, {1, 2}, ""),
                                           Make(1, "pq", 1, {1, 2}, "")};
  JoinAll(*comm[0], {0});
  JoinAll(*comm[1], {1});
  RankBuffer src{std::vector<float>(99, 3.0f)};
  RankBuffer dst{std::vector<float>(99, 0.0f)}, dst2{std::vector<float>(99, 0.0f)};
  auto recv = [&](RankBuffer& b, uint64_t id) {
    auto p = Charged(b.Request(id, 1, OpKind::kRecv, sink_), r1);
    p->req.root = 0;
    return comm[1]->Submit(std::move(p));
  };
  ASSERT_TRUE(recv(dst, 2).ok());
  EXPECT_EQ(r1->used(Resource::kQueuedP2p), 1u);
  auto over = recv(dst2, 3);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("recv of rank 1 on communicator pq refused"));
  EXPECT_THAT(over.status().message(), HasSubstr("(--max_queued_p2p_per_job)"));
  auto s = src.Request(1, 0, OpKind::kSend, sink_);
  s->req.root = 1;
  ASSERT_TRUE(comm[0]->Submit(std::move(s)).ok());
  ASSERT_TRUE(sink_->Wait(1).status.ok());
  ASSERT_TRUE(sink_->Wait(2).status.ok());
  EXPECT_EQ(dst.data, src.data);
  EXPECT_EQ(r1->job().used(Resource::kQueuedP2p), 0u);
  // The refused receive took no number on the channel: the next send/recv pair matches.
  ASSERT_TRUE(recv(dst2, 4).ok());
  auto s2 = src.Request(5, 0, OpKind::kSend, sink_);
  s2->req.root = 1;
  ASSERT_TRUE(comm[0]->Submit(std::move(s2)).ok());
  ASSERT_TRUE(sink_->Wait(4).status.ok());
  EXPECT_EQ(dst2.data, src.data);
}

TEST_F(TwoDaemonsTest, CollectivesQueuedBehindARunningOneAreBoundedByTheSessionQuota) {
  // One rank per node: each submission is the last local one of its sequence number, so only the
  // session's limit holds it back (the job's is 1, and is passed).
  Quotas q(/*ops_per_session=*/2, /*ops_per_job=*/1);
  auto s0 = q.Session("job-run");
  std::shared_ptr<Communicator> comm[2] = {Make(0, "run", 1, {1, 2}, "ring"),
                                           Make(1, "run", 1, {1, 2}, "ring")};
  JoinAll(*comm[0], {0});
  JoinAll(*comm[1], {1});
  std::vector<RankBuffer> bufs(8, RankBuffer{std::vector<float>(256, 1.0f)});
  // seq 0 runs (waiting for node 1), seqs 1 and 2 queue behind it.
  for (uint64_t id = 0; id < 3; ++id) {
    auto seq = comm[0]->Submit(Charged(bufs[id].Request(id, 0, OpKind::kAllReduce, sink_), s0));
    ASSERT_TRUE(seq.ok()) << seq.status();
  }
  EXPECT_EQ(s0->used(Resource::kQueuedOps), 2u);
  EXPECT_EQ(s0->job().used(Resource::kQueuedOps), 2u);  // past the job's 1: not enforced here
  auto over = comm[0]->Submit(Charged(bufs[3].Request(3, 0, OpKind::kAllReduce, sink_), s0));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(),
              HasSubstr("limit of this session (2) reached: it holds 2 and asked for 1 more "
                        "(--max_queued_ops_per_session)"));
  for (uint64_t id = 0; id < 3; ++id) {
    ASSERT_TRUE(comm[1]->Submit(bufs[4 + id].Request(10 + id, 1, OpKind::kAllReduce, sink_)).ok());
  }
  for (uint64_t id : {0, 1, 2, 10, 11, 12}) ASSERT_TRUE(sink_->Wait(id).status.ok()) << id;
  EXPECT_EQ(s0->used(Resource::kQueuedOps), 0u);
  EXPECT_EQ(s0->job().used(Resource::kQueuedOps), 0u);
  EXPECT_EQ(bufs[0].data[0], 2.0f);
}

// Passes everything to the endpoint it wraps; the test endpoints below change their sends.
class ForwardingEndpoint : public transport::Endpoint {
 public:
  explicit ForwardingEndpoint(std::shared_ptr<transport::Endpoint> inner)
      : inner_(std::move(inner)) {}
  void SendV(transport::Tag tag, const transport::Segment* segments, int count,
             transport::CompletionFn done) override {
    inner_->SendV(tag, segments, count, std::move(done));
  }
  void RecvV(transport::Tag tag, const transport::Segment* segments, int count,
             transport::RecvCompletionFn done) override {
    inner_->RecvV(tag, segments, count, std::move(done));
  }
  void Abort(const absl::Status& status) override { inner_->Abort(status); }

 protected:
  std::shared_ptr<transport::Endpoint> inner_;
};

// A hostile (or broken) peer daemon: every message it sends a communicator, but the operation
// digests, has its payload replaced by 0x80 bytes, the same length as the real one. Compressed
// data of that shape is malformed for every codec (int8: a negative scale; top-k: an index past
// the unit), so decoding must refuse it, never index out of bounds.
class GarbageEndpoint final : public ForwardingEndpoint {
 public:
  using ForwardingEndpoint::ForwardingEndpoint;
  void SendV(transport::Tag tag, const transport::Segment* segments, int count,
             transport::CompletionFn done) override {
    const scheduler::tags::Fields f = scheduler::tags::Decode(tag);
    if (f.step == scheduler::tags::kDigestStep) {
      inner_->SendV(tag, segments, count, std::move(done));
      return;
    }
    auto junk = std::make_shared<std::vector<std::byte>>(transport::TotalSize(segments, count),
                                                         std::byte{0x80});
    const transport::Segment one{junk->data(), junk->size()};
    inner_->SendV(tag, &one, 1, [junk, done = std::move(done)](absl::Status st) { done(st); });
  }
};

// A peer's malformed compressed bytes fail the operation on the receiving node with
// INVALID_ARGUMENT naming the node and rail, for each codec; a bystander job on the same two
// daemons, compressed and exact, runs at the same time and gets its results.
TEST_F(TwoDaemonsTest, MalformedCompressedDataFromAPeerFailsTheOpAndNoOtherJob) {
  // fp16 and bf16 have no malformed encodings (every 16-bit pattern is a value): a member's
  // garbage in them is wrong data, which only --integrity=crc32c catches (docs/data-plane.md).
  const std::vector<std::string> codecs = {"int8", "topk:0.1"};
  for (size_t k = 0; k < codecs.size(); ++k) {
    SCOPED_TRACE(codecs[k]);
    auto codec = kernels::ParseCodec(codecs[k]);
    ASSERT_TRUE(codec.ok());
    const uint16_t slot = static_cast<uint16_t>(10 + 4 * k);
    const std::string evil_id = "evil" + std::to_string(k);
    const std::string good_id = "good" + std::to_string(k);
    std::shared_ptr<Communicator> evil[2] = {
        Make(0, evil_id, 1, {slot, slot}, ""),
        Make(1, evil_id, 1, {slot, slot}, "", [](std::shared_ptr<transport::Endpoint> ep) {
          return std::make_shared<GarbageEndpoint>(std::move(ep));
        })};
    std::shared_ptr<Communicator> good[2] = {
        Make(0, good_id, 1, {uint16_t(slot + 1), uint16_t(slot + 1)}, "ring"),
        Make(1, good_id, 1, {uint16_t(slot + 1), uint16_t(slot + 1)}, "ring")};
    for (int n = 0; n < 2; ++n) {
      JoinAll(*evil[n], {n});
      JoinAll(*good[n], {n});
    }
    constexpr size_t kCount = 4096;
    std::vector<RankBuffer> bad(2), by(2), exact(2);
    const uint64_t base = 1000 * (k + 1);
    for (int n = 0; n < 2; ++n) {
      bad[n].data.assign(kCount, 1.0f + n);
      by[n].data.assign(kCount, 0.25f * (n + 1));
      exact[n].data.assign(kCount, 3.0f * (n + 1));
      auto e = bad[n].Request(base + n, n, OpKind::kAllReduce, sink_);
      e->req.codec = *codec;
      ASSERT_TRUE(evil[n]->Submit(std::move(e)).ok());
      auto g = by[n].Request(base + 10 + n, n, OpKind::kAllReduce, sink_);
      g->req.codec = *codec;
      ASSERT_TRUE(good[n]->Submit(std::move(g)).ok());
      ASSERT_TRUE(
          good[n]->Submit(exact[n].Request(base + 20 + n, n, OpKind::kAllReduce, sink_)).ok());
    }
    // Node 0 decodes what node 1 sent: refused, naming the sender.
    const auto c = sink_->Wait(base);
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.status;
    EXPECT_THAT(std::string(c.status.message()),
                HasSubstr("compressed data from node 1 on rail 0 is malformed"));
    EXPECT_TRUE(evil[0]->failed());
    // What a real node 0 tells node 1 (Peer.AbortComm): its rank fails too, with node 0's reason.
    evil[1]->Abort(c.status, /*notify=*/false);
    EXPECT_FALSE(sink_->Wait(base + 1).status.ok());
    // The bystander: both collectives complete, the compressed one within the codec's error of
    // 0.25 + 0.5 (int8: half a step of each block's scale twice; top-k of a constant keeps an
    // arbitrary 10%, so only the ranks' agreement is checked).
    for (int n = 0; n < 2; ++n) {
      const auto gc = sink_->Wait(base + 10 + n);
      ASSERT_TRUE(gc.status.ok()) << gc.status;
      const auto ec = sink_->Wait(base + 20 + n);
      ASSERT_TRUE(ec.status.ok()) << ec.status;
      for (float v : exact[n].data) ASSERT_EQ(v, 9.0f);
      if (codecs[k] == "int8") {
        for (float v : by[n].data) ASSERT_NEAR(v, 0.75f, 0.75f / 254 * 2 + 1e-6);
      }
      EXPECT_EQ(by[0].data, by[1].data);
    }
    EXPECT_FALSE(good[0]->failed());
    EXPECT_FALSE(good[1]->failed());
  }
}

// Counts the messages an endpoint sends (one per SendV) and the bytes in them.
class SendCounter final : public ForwardingEndpoint {
 public:
  SendCounter(std::shared_ptr<transport::Endpoint> inner, std::atomic<int>* messages,
              std::atomic<size_t>* bytes)
      : ForwardingEndpoint(std::move(inner)), messages_(messages), bytes_(bytes) {}
  void SendV(transport::Tag tag, const transport::Segment* segments, int count,
             transport::CompletionFn done) override {
    ++*messages_;
    *bytes_ += transport::TotalSize(segments, count);
    inner_->SendV(tag, segments, count, std::move(done));
  }

 private:
  std::atomic<int>* messages_;
  std::atomic<size_t>* bytes_;
};

// A small operation's first message to the peer rides in the operation digest (OpDigest::
// kMaxCarriedBytes): with rd between two nodes of one rank, one message per node per operation
// up to 1 KiB, two from 1 KiB + 4 B, the same bytes either way, exact results with every
// algorithm and size.
TEST_F(TwoDaemonsTest, ASmallOperationsFirstMessageRidesInTheDigest) {
  uint16_t slot = 40;
  for (const std::string algo : {"rd", "ring", "tree", "rhd", "direct"}) {
    for (const size_t count : {size_t{1}, size_t{7}, size_t{256}, size_t{257}, size_t{2000}}) {
      SCOPED_TRACE(algo + " count " + std::to_string(count));
      std::atomic<int> messages[2] = {0, 0};
      std::atomic<size_t> bytes[2] = {0, 0};
      std::shared_ptr<Communicator> comm[2];
      const std::string id = "carry-" + algo + std::to_string(count);
      for (int n = 0; n < 2; ++n) {
        comm[n] =
            Make(n, id, 1, {slot, slot}, algo, [&, n](std::shared_ptr<transport::Endpoint> ep) {
              return std::make_shared<SendCounter>(std::move(ep), &messages[n], &bytes[n]);
            });
        JoinAll(*comm[n], {n});
      }
      ++slot;
      for (int iter = 0; iter < 3; ++iter) {
        std::vector<RankBuffer> bufs(2);
        for (int n = 0; n < 2; ++n) {
          bufs[n].data.resize(count);
          for (size_t e = 0; e < count; ++e) bufs[n].data[e] = float(n + 1) + float(e % 5);
          ASSERT_TRUE(
              comm[n]->Submit(bufs[n].Request(10 * iter + n, n, OpKind::kAllReduce, sink_)).ok());
        }
        for (int n = 0; n < 2; ++n) {
          const auto c = sink_->Wait(10 * iter + n);
          ASSERT_TRUE(c.status.ok()) << c.status;
          for (size_t e = 0; e < count; ++e) ASSERT_EQ(bufs[n].data[e], 3.0f + 2.0f * float(e % 5));
        }
      }
      if (algo == "rd" && count <= 257) {  // one message each way, 2 with the digest
        const int per_op = count * sizeof(float) <= OpDigest::kMaxCarriedBytes ? 1 : 2;
        for (int n = 0; n < 2; ++n) {
          EXPECT_EQ(messages[n].load(), 3 * per_op) << "node " << n;
          EXPECT_EQ(bytes[n].load(), 3 * (DigestSummary::kAgreeBytes + count * sizeof(float)))
              << "node " << n;
        }
      }
      sink_ = std::make_shared<RecordingSink>();
    }
  }
}

// Nodes that disagree on a small count fail at once with both shapes named, whether both,
// one or neither carries its first message in the digest (the digest receive has room for
// whatever a peer may carry), not at the deadline (which this test's clock never reaches). The
// first node to read the other's digest fails; it aborts its transfers, which may cancel its
// own digest before it was delivered, so the other learns it from that node's notice, as
// between real daemons (Peer.AbortComm).
TEST_F(TwoDaemonsTest, NodesThatDisagreeOnASmallCountFailAtOnce) {
  uint16_t slot = 80;
  const std::pair<size_t, size_t> counts[] = {{8, 9}, {8, 300}, {300, 8}, {300, 301}};
  for (const auto& [c0, c1] : counts) {
    SCOPED_TRACE(std::to_string(c0) + " vs " + std::to_string(c1));
    const std::string id = "disagree" + std::to_string(c0) + "-" + std::to_string(c1);
    std::shared_ptr<Communicator> comm[2] = {Make(0, id, 1, {slot, slot}, "rd"),
                                             Make(1, id, 1, {slot, slot}, "rd")};
    ++slot;
    JoinAll(*comm[0], {0});
    JoinAll(*comm[1], {1});
    std::vector<RankBuffer> bufs(2);
    bufs[0].data.assign(c0, 1.0f);
    bufs[1].data.assign(c1, 2.0f);
    for (int n = 0; n < 2; ++n) {
      ASSERT_TRUE(comm[n]->Submit(bufs[n].Request(500 + n, n, OpKind::kAllReduce, sink_)).ok());
    }
    int first = -1;
    for (int tries = 0; tries < 4000 && first < 0; ++tries) {
      for (int n = 0; n < 2 && first < 0; ++n) {
        if (sink_->Count(500 + n) > 0) first = n;
      }
      if (first < 0) absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_GE(first, 0) << "neither node saw the disagreement";
    const auto c = sink_->Wait(500 + first);
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.status;
    EXPECT_THAT(std::string(c.status.message()), HasSubstr("disagree at seq 0 on count"))
        << c.status;
    EXPECT_THAT(std::string(c.status.message()), HasSubstr("count=" + std::to_string(c0)));
    EXPECT_THAT(std::string(c.status.message()), HasSubstr("count=" + std::to_string(c1)));
    comm[1 - first]->Abort(c.status, /*notify=*/false);
    EXPECT_FALSE(sink_->Wait(500 + 1 - first).status.ok());
    sink_ = std::make_shared<RecordingSink>();
  }
}

TEST_F(TwoDaemonsTest, AnAllToAllvWhoseRankMatricesPassTheBoundIsRefusedBeforeQueueing) {
  EXPECT_TRUE(OpPlanner::CheckAllToAllvFits(2896).ok());  // 2896^2 x 8 bytes < 64 MiB
  absl::Status big = OpPlanner::CheckAllToAllvFits(2897);
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message(), HasSubstr("2897 x 2897 count and displacement matrices of 67140872 "
                                       "bytes each, 32008 bytes past the 67108864-byte bound "
                                       "(2896 ranks at most)"));
  EXPECT_EQ(OpPlanner::CheckAllToAllvFits(65536).code(), absl::StatusCode::kInvalidArgument);
  // A communicator across two daemons of 3000 ranks (1500 each): only rank 0 of each joins in
  // this test, which is enough to submit; the refusal comes before any queueing.
  MultiNodeEnv net;
  std::vector<int> node_of_rank(3000);
  for (int r = 0; r < 3000; ++r) node_of_rank[r] = r % 2;
  net.layout = scheduler::CommLayout::FromNodeOfRank(node_of_rank, 1);
  net.my_node = 0;
  net.node_names = {"node0", "node1"};
  net.node_addresses = {"a0", "a1"};
  net.endpoints.assign(2, std::vector<std::shared_ptr<transport::Endpoint>>(1));
  net.node_slots = {1, 2};
  auto comm = std::make_shared<Communicator>("wide", "job", Env(), std::move(net));
  std::vector<int> mine;
  for (int r = 0; r < 3000; r += 2) mine.push_back(r);
  JoinAll(*comm, mine);
  RankBuffer b{std::vector<float>(4, 1.0f)};
  auto p = b.Request(1, 0, OpKind::kAllToAllv, sink_);
  p->req.send_counts.assign(3000, 0);
  p->req.send_displs.assign(3000, 0);
  p->req.recv_counts.assign(3000, 0);
  p->req.recv_displs.assign(3000, 0);
  auto seq = comm->Submit(std::move(p));
  EXPECT_EQ(seq.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(seq.status().message(),
              HasSubstr("alltoallv of rank 0 on communicator wide: an alltoallv across nodes of "
                        "3000 ranks"));
  EXPECT_EQ(comm->Stats().queued_ops, 0u);
  EXPECT_FALSE(comm->failed());
}

TEST_F(TwoDaemonsTest, ADeadPeerFailsTheRunningOperationWithUnavailable) {
  std::shared_ptr<Communicator> comm = Make(0, "dead", 1, {1, 2}, "ring");
  JoinAll(*comm, {0});
  RankBuffer b{std::vector<float>(4096, 1.0f)};
  ASSERT_TRUE(comm->Submit(b.Request(1, 0, OpKind::kAllReduce, sink_)).ok());
  ASSERT_TRUE(nodes_.fabric().Kill("node1").ok());
  const auto c = sink_->Wait(1);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kUnavailable) << c.status;
  EXPECT_TRUE(comm->failed());
}

// Another node can find a disagreement at seq N (its digest against a third node's) and tell
// this one before this node's rank has submitted seq N: that rank still gets the disagreement's
// code (INVALID_ARGUMENT, as the ranks that had queued it do), and only later collectives get
// ABORTED. Seen in CI: rank 0 got ABORTED where its peers got INVALID_ARGUMENT.
TEST_F(TwoDaemonsTest, TheCollectiveAPeersNoticeIsAboutFailsWithItsCodeLaterOnesAreAborted) {
  std::shared_ptr<Communicator> comm = Make(0, "told", 1, {1, 2}, "ring");
  JoinAll(*comm, {0});
  RankBuffer b{std::vector<float>(16, 1.0f)};
  comm->Abort(absl::InvalidArgumentError("nodes disagree at seq 0 on compression: ..."),
              /*notify=*/false);
  auto first = comm->Submit(b.Request(1, 0, OpKind::kAllReduce, sink_));
  EXPECT_EQ(first.status().code(), absl::StatusCode::kInvalidArgument) << first.status();
  EXPECT_THAT(first.status().message(),
              HasSubstr("communicator told was aborted: nodes disagree at seq 0"));
  // Told once: a retry, and any other operation, finds the communicator aborted.
  auto again = comm->Submit(b.Request(2, 0, OpKind::kAllReduce, sink_));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAborted) << again.status();
  EXPECT_THAT(again.status().message(), HasSubstr("was aborted: nodes disagree at seq 0"));
  auto p2p = b.Request(3, 0, OpKind::kSend, sink_);
  p2p->req.root = 0;
  EXPECT_EQ(comm->Submit(std::move(p2p)).status().code(), absl::StatusCode::kAborted);
}

// A peer's ranks left cleanly (Peer.AbortComm with departed_ranks): not a failure; the next
// collective fails naming why, and the peer is no longer heartbeated.
TEST_F(TwoDaemonsTest, APeersCleanDepartureFailsOnlyWhatNeedsItsRanks) {
  std::shared_ptr<Communicator> comm = Make(0, "departed", 1, {1, 2}, "ring");
  JoinAll(*comm, {0});
  EXPECT_EQ(comm->LivePeerAddresses(), std::vector<std::string>{"a1"});
  comm->RanksDeparted({1}, absl::AbortedError("rank 1 destroyed communicator departed"));
  EXPECT_FALSE(comm->failed());
  EXPECT_TRUE(comm->LivePeerAddresses().empty());
  EXPECT_EQ(comm->PeerAddresses(), std::vector<std::string>{"a1"});
  RankBuffer b{std::vector<float>(16, 1.0f)};
  const auto coll = comm->Submit(b.Request(1, 0, OpKind::kAllReduce, sink_));
  EXPECT_EQ(coll.status().code(), absl::StatusCode::kAborted) << coll.status();
  EXPECT_THAT(coll.status().message(), HasSubstr("rank 1 destroyed communicator departed"));
  EXPECT_EQ(comm->NodeOfRank(1), 1);
  EXPECT_EQ(comm->NodeOfRank(7), -1);
}

// A rail whose link went down: sends on it complete (into a socket buffer, as UCX's eager sends
// do) and deliver nothing; receives on it wait until aborted.
class DeadRailEndpoint final : public transport::Endpoint {
 public:
  void SendV(transport::Tag, const transport::Segment*, int,
             transport::CompletionFn done) override {
    done(absl::OkStatus());
  }
  void RecvV(transport::Tag, const transport::Segment*, int,
             transport::RecvCompletionFn done) override {
    absl::MutexLock lock(&mu_);
    recvs_.push_back(std::move(done));
  }
  void Abort(const absl::Status& status) override {
    std::vector<transport::RecvCompletionFn> recvs;
    {
      absl::MutexLock lock(&mu_);
      recvs.swap(recvs_);
    }
    for (auto& done : recvs) done(status, 0);
  }

 private:
  absl::Mutex mu_;
  std::vector<transport::RecvCompletionFn> recvs_ ABSL_GUARDED_BY(mu_);
};

// Two nodes x 2 ranks on 2 rails (local rank i on rail i), rhd: ranks 0 and 2 exchange on
// rail 0, ranks 1 and 3 on rail 1. dead_rail1: rail 1 between the nodes delivers nothing.
class TwoRailsTest : public TwoDaemonsTest {
 protected:
  std::shared_ptr<Communicator> MakeTwoRails(int me, const std::string& id, bool dead_rail1) {
    MultiNodeEnv net;
    net.layout = scheduler::CommLayout::Uniform(2, 2, 2);
    net.my_node = me;
    net.node_names = {"node0", "node1"};
    net.node_addresses = {"a0", "a1"};
    net.endpoints.assign(2, {});
    const int peer = 1 - me;
    // Both rails ride the in-process fabric's one rail: tags are unique across rails.
    net.endpoints[peer] = {nodes_.Connect(me, peer), dead_rail1
                                                         ? std::make_shared<DeadRailEndpoint>()
                                                         : nodes_.Connect(me, peer)};
    net.node_slots = {1, 2};
    return std::make_shared<Communicator>(id, "job-" + id, Env("rhd"), std::move(net));
  }
};

// A rail that delivers nothing becomes a suspect past the timeout; each node's view confirms
// the other's suspicion (both wait on rail 1), and failing it fails the operation with
// UNAVAILABLE naming the rail, both nodes and the evidence.
TEST_F(TwoRailsTest, ARailThatStopsDeliveringFailsTheOperationNamingIt) {
  std::shared_ptr<Communicator> c0 = MakeTwoRails(0, "rails", true);
  std::shared_ptr<Communicator> c1 = MakeTwoRails(1, "rails", true);
  JoinAll(*c0, {0, 1});
  JoinAll(*c1, {2, 3});
  std::vector<RankBuffer> b(4, RankBuffer{std::vector<float>(1 << 16, 1.0f)});
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE((r < 2 ? c0 : c1)->Submit(b[r].Request(10 + r, r, OpKind::kAllReduce, sink_)).ok());
  }
  // Rail 0's exchange completes at once; rail 1's never does.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(c0->SuspectRail(absl::Seconds(10)).has_value());
  const auto suspect = c0->SuspectRail(absl::Milliseconds(200));
  ASSERT_TRUE(suspect.has_value());
  EXPECT_EQ(suspect->seq, 0u);
  EXPECT_EQ(suspect->stall.peer, 1);
  EXPECT_EQ(suspect->stall.rail, 1);
  EXPECT_EQ(suspect->stall.other_rail, 0);
  const auto evidence = diagnose::PeerConfirmsRailStall(c1->ProgressState(), {0, 0, 1, 0.2});
  ASSERT_TRUE(evidence.has_value());
  EXPECT_THAT(*evidence, MatchesRegex("waits [0-9.]+ s for its chunk from node0 on rail1 too"));
  // A suspect about another seq (the operation it named is over) fails nothing.
  EXPECT_FALSE(c0->FailStalledRail({suspect->stall, 1}, absl::Milliseconds(200), *evidence));
  EXPECT_FALSE(c0->failed());
  ASSERT_TRUE(c0->FailStalledRail(*suspect, absl::Milliseconds(200), *evidence));
  for (uint64_t id : {10, 11}) {
    const auto c = sink_->Wait(id);
    EXPECT_EQ(c.status.code(), absl::StatusCode::kUnavailable) << c.status;
    EXPECT_THAT(c.status.message(),
                HasSubstr("rail1 between node node0 and node node1 stopped delivering: seq 0"));
    EXPECT_THAT(c.status.message(), HasSubstr("and node1 waits"));
    EXPECT_THAT(c.status.message(), HasSubstr("; rail0 delivered from node1"));
  }
  EXPECT_TRUE(c0->failed());
  EXPECT_FALSE(c0->SuspectRail(absl::Milliseconds(200)).has_value());  // once
  EXPECT_FALSE(c0->FailStalledRail(*suspect, absl::Milliseconds(200), *evidence));
  // The peer fails the same way (over the daemons it is also told, Peer.AbortComm).
  const auto theirs = c1->SuspectRail(absl::Milliseconds(200));
  ASSERT_TRUE(theirs.has_value());
  ASSERT_TRUE(c1->FailStalledRail(*theirs, absl::Milliseconds(200), "finished seq 0"));
  for (uint64_t id : {12, 13}) {
    EXPECT_EQ(sink_->Wait(id).status.code(), absl::StatusCode::kUnavailable);
  }
}

// A peer whose ranks have not submitted yet delivers on no rail: a suspect here, but its view
// (nothing pending, seq 0 not finished) confirms nothing: late, not a rail down.
TEST_F(TwoRailsTest, APeerThatHasNotStartedConfirmsNoRailDown) {
  std::shared_ptr<Communicator> c0 = MakeTwoRails(0, "late", false);
  std::shared_ptr<Communicator> c1 = MakeTwoRails(1, "late", false);
  JoinAll(*c0, {0, 1});
  JoinAll(*c1, {2, 3});
  std::vector<RankBuffer> b(2, RankBuffer{std::vector<float>(1024, 1.0f)});
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(c0->Submit(b[r].Request(20 + r, r, OpKind::kAllReduce, sink_)).ok());
  }
  absl::SleepFor(absl::Milliseconds(300));
  const auto suspect = c0->SuspectRail(absl::Milliseconds(100));
  ASSERT_TRUE(suspect.has_value());
  EXPECT_EQ(suspect->stall.other_rail, -1);
  EXPECT_FALSE(
      diagnose::PeerConfirmsRailStall(c1->ProgressState(), {0, 0, suspect->stall.rail, 0.1})
          .has_value());
  EXPECT_FALSE(c0->failed());
  c0->Abort(absl::CancelledError("test over"));
  c1->Abort(absl::CancelledError("test over"));
  for (uint64_t id : {20, 21}) EXPECT_FALSE(sink_->Wait(id).status.ok());
}

TEST_F(TwoDaemonsTest, AStalledPeerFailsTheOperationAtItsDeadline) {
  std::shared_ptr<Communicator> comm = Make(0, "stall", 1, {1, 2}, "ring");
  JoinAll(*comm, {0});
  RankBuffer b{std::vector<float>(64, 1.0f)};
  ASSERT_TRUE(comm->Submit(b.Request(1, 0, OpKind::kAllReduce, sink_)).ok());
  clock_.Advance(absl::Seconds(31));
  timer_.RunDue();
  const auto c = sink_->Wait(1);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kDeadlineExceeded) << c.status;
  EXPECT_THAT(c.status.message(), HasSubstr("did not complete across its 2 nodes"));
}

}  // namespace
}  // namespace railyard
