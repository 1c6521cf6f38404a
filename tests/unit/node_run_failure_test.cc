// A NodeRun's first failed step while other transfers are in flight (Params::on_failing): the
// run ends only once those have completed, and one whose peer stopped sending completes only when
// aborted. With the hook the owner aborts them at once and the run ends with its first error;
// without it the run waits (what held a corrupted message's DATA_LOSS until the operation's
// deadline between two daemons, each waiting for the other's next chunk).
#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/scheduler/node_executor.h"
#include "daemon/scheduler/tags.h"
#include "daemon/transport/transport.h"

namespace railyard::scheduler {
namespace {

// One peer's endpoint: the receive tagged `corrupt_tag` fails at once with DATA_LOSS (a message
// whose CRC did not match), every other receive waits for a message that never comes, until
// Abort fails it, and every later one, with the abort's status (Endpoint::Abort's contract).
class StalledPeer : public transport::Endpoint {
 public:
  explicit StalledPeer(transport::Tag corrupt_tag) : corrupt_tag_(corrupt_tag) {}

  void SendV(transport::Tag, const transport::Segment*, int,
             transport::CompletionFn done) override {
    done(absl::OkStatus());
  }
  void RecvV(transport::Tag tag, const transport::Segment*, int,
             transport::RecvCompletionFn done) override {
    if (tag == corrupt_tag_) {
      done(absl::DataLossError("integrity check failed: CRC-32C mismatch"), 0);
      return;
    }
    absl::Status aborted;
    {
      absl::MutexLock lock(&mu_);
      if (aborted_.ok()) {
        pending_.push_back(std::move(done));
        return;
      }
      aborted = aborted_;
    }
    done(aborted, 0);
  }
  void Abort(const absl::Status& status) override {
    std::vector<transport::RecvCompletionFn> pending;
    {
      absl::MutexLock lock(&mu_);
      ++aborts_;
      if (aborted_.ok()) aborted_ = status;
      pending.swap(pending_);
    }
    for (auto& done : pending) done(status, 0);
  }
  int pending() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(pending_.size());
  }
  int aborts() {
    absl::MutexLock lock(&mu_);
    return aborts_;
  }

 private:
  const transport::Tag corrupt_tag_;
  absl::Mutex mu_;
  std::vector<transport::RecvCompletionFn> pending_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  int aborts_ ABSL_GUARDED_BY(mu_) = 0;
};

// Node 0 receives four independent chunks from node 1; the third arrives corrupted.
struct StalledRun {
  explicit StalledRun(bool hook) {
    schedule.node = 0;
    for (uint64_t k = 0; k < 4; ++k) {
      NodeStep s;
      s.kind = NodeStep::Kind::kRecv;
      s.peer = 1;
      s.rail = 0;
      s.tag = k;
      s.bytes = 1024;
      s.dst.rank = 0;
      s.dst.space = RankRef::Space::kRecv;
      s.dst.offset = k * 1024;
      schedule.steps.push_back(s);
    }
    // The tag node 0 posts for step 2 (tags.h: CollectiveTag(own slot, peer, seq, step tag)).
    peer = std::make_shared<StalledPeer>(tags::CollectiveTag(0, 1, 0, 2));
    endpoints = {{}, {peer}};
    memory.send = {send.data()};
    memory.recv = {recv.data()};
    memory.scratch = {nullptr};
    NodeRun::Params p;
    p.schedule = &schedule;
    p.memory = &memory;
    p.endpoints = &endpoints;
    p.node_slots = &slots;
    p.pool = &pool;
    if (hook) {
      p.on_failing = [this](const absl::Status& status) {
        {
          absl::MutexLock lock(&mu);
          failing.push_back(status);
        }
        peer->Abort(absl::CancelledError("aborted: the run failed"));
      };
    }
    run.Start(p, [this](absl::Status st) {
      result = st;
      done.Notify();
    });
  }
  NodeSchedule schedule;
  std::shared_ptr<StalledPeer> peer;
  EndpointTable endpoints;
  std::vector<std::byte> send = std::vector<std::byte>(4096);
  std::vector<std::byte> recv = std::vector<std::byte>(4096);
  RankMemory memory;
  std::vector<uint16_t> slots = {0, 1};
  Executor pool{1};
  absl::Mutex mu;
  std::vector<absl::Status> failing ABSL_GUARDED_BY(mu);
  absl::Notification done;
  absl::Status result = absl::UnknownError("not done");
  NodeRun run;  // last: destroyed first, once done
};

TEST(NodeRunFailureTest, TheFirstErrorAbortsWhatIsInFlightAndEndsTheRunWithIt) {
  StalledRun r(/*hook=*/true);
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(r.result.code(), absl::StatusCode::kDataLoss) << r.result;
  EXPECT_NE(r.result.message().find("CRC-32C mismatch"), absl::string_view::npos) << r.result;
  absl::MutexLock lock(&r.mu);
  ASSERT_EQ(r.failing.size(), 1u);  // once, with the first error
  EXPECT_EQ(r.failing[0].code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(r.peer->aborts(), 1);
  EXPECT_EQ(r.peer->pending(), 0);
}

TEST(NodeRunFailureTest, WithoutTheHookTheRunWaitsForItsTransfers) {
  StalledRun r(/*hook=*/false);
  // The three other receives wait; the run cannot end before they do.
  EXPECT_FALSE(r.done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  EXPECT_EQ(r.peer->pending(), 3);
  r.peer->Abort(absl::CancelledError("aborted by the deadline"));
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(r.result.code(), absl::StatusCode::kDataLoss) << r.result;  // still the first error
}

}  // namespace
}  // namespace railyard::scheduler
