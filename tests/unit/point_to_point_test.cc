// PointToPoint on its own, behind a fake host (its communicator's lock, counters and failure):
// same-daemon pairs copied in order, a partner that never comes failing at the deadline on a fake
// clock, a drain failing what is queued, and sends/receives with a rank on another "daemon" over
// the in-process transport, a receive of another size named with both. No processes, no sleeps
// for deadlines.
#include "daemon/comm/point_to_point.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/scheduler/executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fakes.h"
#include "tests/unit/inproc_nodes.h"

namespace railyard {
namespace {

using scheduler::OpKind;
using testing::FakeClock;
using ::testing::HasSubstr;
using testing::RecordingSink;

// The communicator's side: a lock, counters, the first failure, and delivery of what the part
// gathered (completions to the sink, copies on the executor, transport posts).
class FakeHost : public PointToPoint::Host, public std::enable_shared_from_this<FakeHost> {
 public:
  explicit FakeHost(scheduler::Executor* executor) : executor_(executor) {}
  void Attach(PointToPoint* p2p) { p2p_ = p2p; }

  void WithLock(absl::FunctionRef<void(CommOutcomes*)> fn) override {
    CommOutcomes out;
    {
      absl::MutexLock lock(&mu);
      fn(&out);
    }
    Deliver(out);
  }
  bool FailedLocked() const override { return !failure.ok(); }
  void FailLocked(const absl::Status& status, CommOutcomes* out, bool transfers_now) override {
    if (!failure.ok()) return;
    failure = status;
    ++fails;
    drained += p2p_->DrainLocked(status, out);
  }
  void CountLocked(bool ok, uint64_t bytes_moved) override {
    (ok ? completed : failed) += 1;
    bytes += bytes_moved;
  }
  std::weak_ptr<Host> Weak() override { return shared_from_this(); }

  // Submits under the lock and delivers, as Communicator::Submit does.
  absl::StatusOr<uint64_t> Submit(std::unique_ptr<PendingRequest> r, absl::Time deadline) {
    r->deadline = deadline;
    absl::StatusOr<uint64_t> seq;
    WithLock([&](CommOutcomes* out) { seq = p2p_->SubmitLocked(std::move(r), out); });
    return seq;
  }

  void Deliver(CommOutcomes& out) {
    for (auto& o : out.completions) {
      if (auto s = o.request->session.lock())
        s->PostCompletion(o.request->request_id, o.status, o.seq);
    }
    for (auto& post : out.transport_posts) post();
    for (scheduler::Execution* e : out.copies) executor_->Run(e);
  }

  absl::Mutex mu;
  absl::Status failure;
  int fails = 0;
  size_t drained = 0;
  int completed = 0;
  int failed = 0;
  uint64_t bytes = 0;

 private:
  scheduler::Executor* executor_;
  PointToPoint* p2p_ = nullptr;
};

std::unique_ptr<PendingRequest> Request(uint64_t id, int rank, OpKind op, int peer,
                                        std::vector<float>& data,
                                        const std::shared_ptr<RecordingSink>& sink) {
  auto p = std::make_unique<PendingRequest>();
  p->request_id = id;
  p->rank = rank;
  p->session = sink;
  p->req.op = op;
  p->req.root = peer;
  p->req.dtype = kernels::DataType::kFloat32;
  p->req.count = data.size();
  p->req.send = reinterpret_cast<std::byte*>(data.data());
  p->req.recv = reinterpret_cast<std::byte*>(data.data());
  return p;
}

class PointToPointTest : public ::testing::Test {
 protected:
  // One part of a communicator of `layout` on node `me`.
  struct Side {
    std::shared_ptr<FakeHost> host;
    std::unique_ptr<PointToPoint> p2p;
  };
  Side Make(const scheduler::CommLayout* layout, int me = 0,
            const scheduler::EndpointTable* endpoints = nullptr) {
    Side s;
    s.host = std::make_shared<FakeHost>(&executor_);
    PointToPoint::Env env;
    env.comm_id = "c1";
    env.timer = &timer_;
    env.chunk_bytes = 4096;
    env.op_timeout = absl::Seconds(30);
    env.layout = layout;
    env.my_node = me;
    env.endpoints = endpoints;
    env.node_slots = &slots_;
    s.p2p = std::make_unique<PointToPoint>(env, s.host.get());
    s.host->Attach(s.p2p.get());
    return s;
  }
  absl::Time In(absl::Duration d) { return clock_.Now() + d; }

  FakeClock clock_;
  DeadlineTimer timer_{&clock_};
  scheduler::Executor executor_{2};
  std::vector<uint16_t> slots_{5, 6};
  std::shared_ptr<RecordingSink> sink_ = std::make_shared<RecordingSink>();
};

TEST_F(PointToPointTest, SameDaemonPairsAreCopiedInPostingOrderAndCounted) {
  const auto layout = scheduler::CommLayout::Uniform(1, 2, 1);
  Side side = Make(&layout);
  std::vector<float> s1(3000, 3.0f), s2(3000, 4.0f), r1(3000, 0.0f), r2(3000, 0.0f);
  ASSERT_TRUE(
      side.host->Submit(Request(11, 1, OpKind::kRecv, 0, r1, sink_), In(absl::Seconds(5))).ok());
  auto a = side.host->Submit(Request(1, 0, OpKind::kSend, 1, s1, sink_), In(absl::Seconds(5)));
  auto b = side.host->Submit(Request(2, 0, OpKind::kSend, 1, s2, sink_), In(absl::Seconds(5)));
  auto c = side.host->Submit(Request(12, 1, OpKind::kRecv, 0, r2, sink_), In(absl::Seconds(5)));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, 1u);
  for (uint64_t id : {1, 2, 11, 12}) ASSERT_TRUE(sink_->Wait(id).status.ok()) << id;
  EXPECT_EQ(sink_->Wait(12).seq, 1u);
  EXPECT_EQ(r1, s1);
  EXPECT_EQ(r2, s2);
  absl::MutexLock lock(&side.host->mu);
  EXPECT_EQ(side.host->completed, 2);
  EXPECT_EQ(side.host->bytes, 2u * 3000 * sizeof(float));
  EXPECT_EQ(side.p2p->queued_locked(), 0u);
}

TEST_F(PointToPointTest, APartnerThatNeverComesFailsTheHostAtTheDeadlineNamingBothRanks) {
  const auto layout = scheduler::CommLayout::Uniform(1, 2, 1);
  Side side = Make(&layout);
  std::vector<float> s1(16, 1.0f);
  ASSERT_TRUE(
      side.host->Submit(Request(1, 0, OpKind::kSend, 1, s1, sink_), In(absl::Seconds(5))).ok());
  clock_.Advance(absl::Seconds(4));
  timer_.RunDue();
  EXPECT_EQ(sink_->Count(1), 0u);
  clock_.Advance(absl::Seconds(2));
  timer_.RunDue();
  const auto c = sink_->Wait(1);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(
      std::string(c.status.message()),
      HasSubstr("send of rank 0 on communicator c1: rank 1 did not post the matching recv"));
  absl::MutexLock lock(&side.host->mu);
  EXPECT_EQ(side.host->fails, 1);
  EXPECT_EQ(side.host->drained, 1u);
}

TEST_F(PointToPointTest, ADrainFailsEveryQueuedSideWithTheStatus) {
  const auto layout = scheduler::CommLayout::Uniform(1, 3, 1);
  Side side = Make(&layout);
  std::vector<float> d(8, 0.0f);
  ASSERT_TRUE(
      side.host->Submit(Request(1, 0, OpKind::kSend, 1, d, sink_), In(absl::Seconds(5))).ok());
  ASSERT_TRUE(
      side.host->Submit(Request(2, 2, OpKind::kRecv, 1, d, sink_), In(absl::Seconds(5))).ok());
  side.host->WithLock([&](CommOutcomes* out) {
    side.host->FailLocked(absl::AbortedError("rank 1 left"), out, false);
  });
  for (uint64_t id : {1, 2}) {
    const auto c = sink_->Wait(id);
    EXPECT_EQ(c.status.code(), absl::StatusCode::kAborted);
    EXPECT_EQ(c.status.message(), "rank 1 left");
  }
  absl::MutexLock lock(&side.host->mu);
  EXPECT_EQ(side.host->drained, 2u);
}

class RemotePointToPointTest : public PointToPointTest {
 protected:
  void SetUp() override {
    for (int me = 0; me < 2; ++me) endpoints_[me] = nodes_.EndpointsOf(me);
  }
  const scheduler::CommLayout layout_ = scheduler::CommLayout::Uniform(2, 1, 1);
  testing::InProcNodes nodes_;
  scheduler::EndpointTable endpoints_[2];
};

TEST_F(RemotePointToPointTest, ASendReachesTheReceiveOnTheOtherDaemon) {
  Side node0 = Make(&layout_, 0, &endpoints_[0]);
  Side node1 = Make(&layout_, 1, &endpoints_[1]);
  std::vector<float> src(5000), dst(5000, 0.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  ASSERT_TRUE(
      node1.host->Submit(Request(2, 1, OpKind::kRecv, 0, dst, sink_), In(absl::Seconds(5))).ok());
  {
    absl::MutexLock lock(&node1.host->mu);
    EXPECT_EQ(node1.p2p->in_flight_locked(), 1u);
  }
  ASSERT_TRUE(
      node0.host->Submit(Request(1, 0, OpKind::kSend, 1, src, sink_), In(absl::Seconds(5))).ok());
  ASSERT_TRUE(sink_->Wait(1).status.ok());
  ASSERT_TRUE(sink_->Wait(2).status.ok());
  EXPECT_EQ(dst, src);
  absl::MutexLock lock(&node1.host->mu);
  EXPECT_EQ(node1.host->completed, 1);
  EXPECT_FALSE(node1.p2p->remote_in_flight_locked());
}

TEST_F(RemotePointToPointTest, AReceiveOfAnotherSizeFailsWithBothSizesAndFailsTheHost) {
  Side node0 = Make(&layout_, 0, &endpoints_[0]);
  Side node1 = Make(&layout_, 1, &endpoints_[1]);
  std::vector<float> src(100, 1.0f), dst(200, 0.0f);
  ASSERT_TRUE(
      node1.host->Submit(Request(2, 1, OpKind::kRecv, 0, dst, sink_), In(absl::Seconds(5))).ok());
  ASSERT_TRUE(
      node0.host->Submit(Request(1, 0, OpKind::kSend, 1, src, sink_), In(absl::Seconds(5))).ok());
  const auto c = sink_->Wait(2);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status.message()),
              HasSubstr("rank 0 sent 400 bytes to rank 1, which receives 200 x float (800 bytes)"));
  absl::MutexLock lock(&node1.host->mu);
  EXPECT_EQ(node1.host->failed, 1);
  EXPECT_EQ(node1.host->fails, 1);
}

TEST_F(RemotePointToPointTest, ARemoteTransferPastItsDeadlineFailsTheHost) {
  Side node1 = Make(&layout_, 1, &endpoints_[1]);
  std::vector<float> dst(10, 0.0f);
  ASSERT_TRUE(
      node1.host->Submit(Request(2, 1, OpKind::kRecv, 0, dst, sink_), In(absl::Seconds(3))).ok());
  clock_.Advance(absl::Seconds(4));
  timer_.RunDue();
  absl::MutexLock lock(&node1.host->mu);
  EXPECT_EQ(node1.host->failure.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(node1.host->failure.message()),
              HasSubstr("recv of rank 1 with rank 0 on communicator c1 did not complete within"));
}

}  // namespace
}  // namespace railyard
