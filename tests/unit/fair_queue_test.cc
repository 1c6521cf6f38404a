// The fair queue of a paced rail: the schedule's shares and pacing with time passed in (exact),
// then the threaded queue and the endpoint that sends through it.
#include "daemon/transport/fair_queue.h"

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/transport/paced_endpoint.h"
#include "gtest/gtest.h"

namespace railyard::transport {
namespace {

constexpr double kRate = 1e9;  // bytes per second: 1 byte per ns

FairSchedule::Options Opts(std::map<std::string, double> weights = {}) {
  FairSchedule::Options o;
  o.rate_bytes_per_s = kRate;
  o.burst_bytes = 64 * 1024;
  o.quantum_bytes = 64 * 1024;
  o.weight = [weights](const std::string& job) {
    auto it = weights.find(job);
    return it == weights.end() ? 1.0 : it->second;
  };
  return o;
}

// Keeps every flow backlogged with items of its size and drains `total` bytes at the rate,
// returning the bytes each job sent.
std::map<std::string, uint64_t> Drive(FairSchedule& s,
                                      const std::map<std::string, size_t>& item_bytes,
                                      uint64_t total,
                                      std::map<std::string, uint64_t>* per_comm = nullptr) {
  std::map<std::string, uint64_t> sent;
  uint64_t id = 1;
  int64_t now = 0;
  // Two items queued per flow at all times (key "job/comm").
  std::map<std::string, int> queued;
  auto refill = [&] {
    for (const auto& [flow, bytes] : item_bytes) {
      const std::string job = flow.substr(0, flow.find('/'));
      const std::string comm = flow.substr(flow.find('/') + 1);
      while (queued[flow] < 2) {
        s.Enqueue({id++, job, comm, bytes, now});
        ++queued[flow];
      }
    }
  };
  uint64_t done = 0;
  while (done < total) {
    refill();
    FairSchedule::Item item;
    int64_t wake = 0;
    if (!s.Next(now, &item, &wake)) {
      EXPECT_GT(wake, now);
      now = wake;
      continue;
    }
    sent[item.job] += item.bytes;
    if (per_comm != nullptr) (*per_comm)[item.job + "/" + item.comm] += item.bytes;
    --queued[item.job + "/" + item.comm];
    done += item.bytes;
  }
  return sent;
}

TEST(FairScheduleTest, EqualWeightsShareBytesEquallyWhateverTheMessageSizes) {
  FairSchedule s(Opts());
  auto sent = Drive(s, {{"a/c", 1 << 20}, {"b/c", 4096}}, uint64_t{512} << 20);
  const double ratio = static_cast<double>(sent["a"]) / static_cast<double>(sent["b"]);
  EXPECT_NEAR(ratio, 1.0, 0.01) << sent["a"] << " vs " << sent["b"];
}

TEST(FairScheduleTest, WeightsThreeToOneGiveThreeTimesTheBytes) {
  FairSchedule s(Opts({{"a", 3}, {"b", 1}}));
  auto sent = Drive(s, {{"a/c", 256 * 1024}, {"b/c", 256 * 1024}}, uint64_t{1} << 30);
  const double ratio = static_cast<double>(sent["a"]) / static_cast<double>(sent["b"]);
  EXPECT_NEAR(ratio, 3.0, 0.03) << sent["a"] << " vs " << sent["b"];
}

TEST(FairScheduleTest, FractionalAndLargeWeightsHold) {
  FairSchedule s(Opts({{"a", 0.25}, {"b", 10}}));
  auto sent = Drive(s, {{"a/c", 1 << 20}, {"b/c", 16384}}, uint64_t{2} << 30);
  const double ratio = static_cast<double>(sent["b"]) / static_cast<double>(sent["a"]);
  EXPECT_NEAR(ratio, 40.0, 0.8);
}

TEST(FairScheduleTest, CommunicatorsOfOneJobShareItsPartEqually) {
  FairSchedule s(Opts());
  std::map<std::string, uint64_t> per_comm;
  auto sent =
      Drive(s, {{"a/c1", 65536}, {"a/c2", 8192}, {"b/c", 65536}}, uint64_t{256} << 20, &per_comm);
  EXPECT_NEAR(static_cast<double>(sent["a"]) / static_cast<double>(sent["b"]), 1.0, 0.01);
  EXPECT_NEAR(static_cast<double>(per_comm["a/c1"]) / static_cast<double>(per_comm["a/c2"]), 1.0,
              0.02);
}

TEST(FairScheduleTest, BackloggedRailSendsExactlyAtItsRate) {
  FairSchedule s(Opts());
  int64_t now = 0;
  for (uint64_t i = 1; i <= 100; ++i) s.Enqueue({i, "a", "c", 1000000, 0});
  FairSchedule::Item item;
  int64_t wake = 0;
  int sent = 0;
  int64_t last_send = 0;
  while (sent < 100) {
    if (s.Next(now, &item, &wake)) {
      ++sent;
      last_send = now;
      continue;
    }
    ASSERT_GT(wake, now);
    now = wake;
  }
  // 100 MB at 1 GB/s: the last send leaves once 99 MB have gone, less the burst's head start.
  EXPECT_EQ(last_send, 99 * 1000000 - 64 * 1024);
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.queued_bytes(), 0u);
  // Idle: nothing queued, no wake-up asked for.
  EXPECT_FALSE(s.Next(now, &item, &wake));
  EXPECT_EQ(wake, 0);
}

TEST(FairScheduleTest, AnIdleRailSendsABurstAtOnceThenPaces) {
  FairSchedule s(Opts());
  EXPECT_TRUE(s.CanSendNow(0));
  s.Sent(64 * 1024, 0);
  EXPECT_TRUE(s.CanSendNow(0));  // the clock is exactly one burst ahead
  s.Sent(1, 0);
  EXPECT_FALSE(s.CanSendNow(0));
  EXPECT_TRUE(s.CanSendNow(1));
  // After a long idle time the clock restarts from now: no credit piles up beyond the burst.
  EXPECT_TRUE(s.CanSendNow(int64_t{1} << 40));
  s.Sent(64 * 1024, int64_t{1} << 40);
  s.Sent(1, int64_t{1} << 40);
  EXPECT_FALSE(s.CanSendNow(int64_t{1} << 40));
}

TEST(FairScheduleTest, AMessageFarLargerThanTheQuantumIsServedInOnePass) {
  FairSchedule::Options o = Opts({{"a", 0.001}});
  o.quantum_bytes = 1;  // a 1 GiB head needs 10^12 rounds at this weight
  FairSchedule s(o);
  s.Enqueue({1, "a", "c", size_t{1} << 30, 0});
  s.Enqueue({2, "b", "c", size_t{1} << 30, 0});
  FairSchedule::Item item;
  int64_t wake = 0;
  ASSERT_TRUE(s.Next(0, &item, &wake));
  EXPECT_EQ(item.id, 2u);  // b, of weight 1, gets there first
}

// A bulk job keeps the rail backlogged with chunks of `bulk_bytes`; a latency-bound job sends
// one `small`-byte message at a time (the next as soon as the last has left, as a collective's
// steps do). Returns the bytes each sent over `duration_ns`, and the small job's worst wait.
struct Mixed {
  std::map<std::string, uint64_t> sent;
  int64_t worst_wait_ns = 0;
};
Mixed DriveMixed(FairSchedule& s, size_t bulk_bytes, size_t small, int64_t duration_ns) {
  Mixed m;
  uint64_t id = 1;
  int bulk_queued = 0;
  bool small_waiting = false;
  int64_t small_since = 0;
  for (int64_t now = 0; now < duration_ns; now += 1000) {  // 1 us steps
    while (bulk_queued < 2) {
      s.Enqueue({id++, "bulk", "c", bulk_bytes, now});
      ++bulk_queued;
    }
    if (!small_waiting) {
      if (s.TrySendNow("small", small, now)) {
        m.sent["small"] += small;
      } else {
        s.Enqueue({id++, "small", "c", small, now});
        small_waiting = true;
        small_since = now;
      }
    }
    FairSchedule::Item item;
    int64_t wake = 0;
    while (s.Next(now, &item, &wake)) {
      m.sent[item.job] += item.bytes;
      if (item.job == "bulk") {
        --bulk_queued;
      } else {
        small_waiting = false;
        m.worst_wait_ns = std::max(m.worst_wait_ns, now - small_since);
      }
    }
  }
  return m;
}

TEST(FairScheduleTest, ASmallSendOfAnIdleJobTakesTheExpressLaneAheadOfTheClock) {
  FairSchedule s(Opts());
  // The bulk job's 1 MB chunk puts the clock ~1 ms ahead of now.
  ASSERT_TRUE(s.TrySendNow("bulk", 1000000, 0));
  s.Enqueue({1, "bulk", "c", 1000000, 0});
  EXPECT_FALSE(s.CanSendNow(0));
  // Another job's 16 KiB message leaves now, not after the chunk; the clock counts its bytes.
  EXPECT_TRUE(s.TrySendNow("small", 16384, 0));
  EXPECT_EQ(s.express_sends(), 1u);
  FairSchedule::Item item;
  int64_t wake = 0;
  EXPECT_FALSE(s.Next(0, &item, &wake));
  EXPECT_EQ(wake, 1000000 + 16384 - 64 * 1024);
  // Too large for the lane: queued.
  EXPECT_FALSE(s.TrySendNow("small", 64 * 1024 + 1, 0));
  // The bulk job has a chunk queued: its small sends queue behind it (FIFO within a job).
  EXPECT_FALSE(s.TrySendNow("bulk", 100, 0));
  EXPECT_EQ(s.express_sends(), 1u);
}

TEST(FairScheduleTest, TheExpressLaneIsOffAtZeroBytes) {
  FairSchedule::Options o = Opts();
  o.express_bytes = 0;
  FairSchedule s(o);
  ASSERT_TRUE(s.TrySendNow("bulk", 1000000, 0));
  EXPECT_FALSE(s.TrySendNow("small", 100, 0));
  EXPECT_EQ(s.express_sends(), 0u);
}

TEST(FairScheduleTest, AGreedySmallJobGetsItsShareAndNoMoreThroughTheExpressLane) {
  FairSchedule s(Opts());
  // The small job sends its next 16 KiB as soon as the last has left: it asks for the whole
  // rail. Its credit runs out, and then it is queued in fair order.
  Mixed m = DriveMixed(s, 1000000, 16384, 200'000'000);  // 0.2 s at 1 GB/s
  const double small = static_cast<double>(m.sent["small"]);
  const double bulk = static_cast<double>(m.sent["bulk"]);
  // Equal weights: the small job, which asks for all it can get, gets no more than its half.
  EXPECT_LE(small / (small + bulk), 0.5 + 0.01) << small << " vs " << bulk;
  EXPECT_GT(s.express_sends(), 0u);
  // Without the lane, one message at a time gets one 16 KiB send per round of deficit round
  // robin against the bulk job's 64 KiB: the lane gives it more of its share, never beyond.
  FairSchedule::Options off = Opts();
  off.express_bytes = 0;
  FairSchedule plain(off);
  Mixed p = DriveMixed(plain, 1000000, 16384, 200'000'000);
  const double plain_small = static_cast<double>(p.sent["small"]);
  EXPECT_GT(small, 1.5 * plain_small) << small << " vs " << plain_small;
}

TEST(FairScheduleTest, TheExpressLaneKeepsAJobBelowItsShareFromWaitingForChunks) {
  FairSchedule::Options o = Opts({{"bulk", 3}, {"small", 1}});
  FairSchedule s(o);
  // The small job sends 4 KiB per 20 us of real time at most (0.2 GB/s, under its 0.25 share):
  // emulate by sending only on every 20th microsecond.
  uint64_t id = 1;
  int bulk_queued = 0;
  int64_t worst = 0;
  uint64_t small_bytes = 0, bulk_bytes = 0;
  for (int64_t now = 0; now < 100'000'000; now += 1000) {
    while (bulk_queued < 2) {
      s.Enqueue({id++, "bulk", "c", 1000000, now});
      ++bulk_queued;
    }
    if (now % 20000 == 0) {
      if (s.TrySendNow("small", 4096, now)) {
        small_bytes += 4096;
      } else {
        s.Enqueue({id++, "small", "c", 4096, now});
      }
    }
    FairSchedule::Item item;
    int64_t wake = 0;
    while (s.Next(now, &item, &wake)) {
      if (item.job == "bulk") {
        --bulk_queued;
        bulk_bytes += item.bytes;
      } else {
        small_bytes += item.bytes;
        worst = std::max(worst, now - item.enqueued_ns);
      }
    }
  }
  // Every small send went at once (none waited for a 1 ms chunk), and the bulk job had the rest.
  EXPECT_EQ(worst, 0);
  EXPECT_EQ(s.express_sends(), 100'000'000 / 20000);
  EXPECT_EQ(small_bytes, 4096u * (100'000'000 / 20000));
  EXPECT_NEAR(static_cast<double>(small_bytes + bulk_bytes), 1e8, 2.1e6);
}

TEST(FairScheduleTest, TheExpressLaneCannotTakeMoreThanAWeightedShare) {
  FairSchedule s(Opts({{"bulk", 3}, {"small", 1}}));
  Mixed m = DriveMixed(s, 256 * 1024, 16384, 200'000'000);
  const double small = static_cast<double>(m.sent["small"]);
  const double bulk = static_cast<double>(m.sent["bulk"]);
  EXPECT_NEAR(bulk / small, 3.0, 0.2) << bulk << " vs " << small;
}

TEST(FairScheduleTest, DrainRemovesOnlyThatCommunicatorsItemsInOrder) {
  FairSchedule s(Opts());
  s.Enqueue({1, "a", "c1", 10, 0});
  s.Enqueue({2, "a", "c2", 20, 0});
  s.Enqueue({3, "a", "c1", 30, 0});
  s.Enqueue({4, "b", "c1", 40, 0});
  std::vector<FairSchedule::Item> out = s.Drain("a", "c1");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].id, 1u);
  EXPECT_EQ(out[1].id, 3u);
  EXPECT_EQ(s.queued_items(), 2u);
  EXPECT_EQ(s.queued_bytes(), 60u);
  EXPECT_TRUE(s.Drain("a", "nope").empty());
  EXPECT_TRUE(s.Drain("zz", "c1").empty());
  FairSchedule::Item item;
  int64_t wake = 0;
  std::vector<uint64_t> ids;
  while (s.Next(0, &item, &wake)) ids.push_back(item.id);
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(s.DrainAll().size(), 0u);
}

// --- the threaded queue -----------------------------------------------------------------------

FairQueue::Options QueueOpts(double rate) {
  FairQueue::Options o;
  o.rail = "rail0";
  o.schedule.rate_bytes_per_s = rate;
  o.schedule.burst_bytes = 64 * 1024;
  return o;
}

TEST(FairQueueTest, IssuesEverySendOnceInOrderPerCommunicatorAndNoFasterThanTheRate) {
  std::atomic<uint64_t> waited_ns{0};
  FairQueue::Options o = QueueOpts(20e6);  // 20 MB/s
  o.on_sent = [&](const std::string&, size_t, double waited_s) {
    waited_ns += static_cast<uint64_t>(waited_s * 1e9);
  };
  FairQueue q(o);
  absl::Mutex mu;
  std::vector<int> order;
  absl::Notification all;
  const auto start = std::chrono::steady_clock::now();
  constexpr int kSends = 40;
  for (int i = 0; i < kSends; ++i) {
    q.Submit("j", "c", 50000, [&, i] {
      absl::MutexLock l(&mu);
      order.push_back(i);
      if (order.size() == kSends) all.Notify();
    });
  }
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(20)));
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // 2 MB at 20 MB/s, less the burst: at least 0.0967 s. (Only a lower bound is asserted.)
  EXPECT_GE(elapsed, (kSends * 50000.0 - 64 * 1024 - 50000) / 20e6);
  for (int i = 0; i < kSends; ++i) EXPECT_EQ(order[i], i);
  EXPECT_GT(waited_ns.load(), 0u);
  EXPECT_EQ(q.queued_items(), 0u);
}

TEST(FairQueueTest, AnEmptyQueueIssuesOnTheCallersThread) {
  FairQueue q(QueueOpts(1e9));
  std::thread::id ran_on;
  q.Submit("j", "c", 100, [&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(FairQueueTest, FlushAndShutdownIssueWhatIsQueuedWithoutWaiting) {
  auto q = std::make_unique<FairQueue>(QueueOpts(1000));  // 1 KB/s: queued sends wait long
  std::atomic<int> a{0}, b{0};
  for (int i = 0; i < 5; ++i) q->Submit("j", "a", 100000, [&] { ++a; });
  for (int i = 0; i < 5; ++i) q->Submit("j", "b", 100000, [&] { ++b; });
  EXPECT_EQ(a.load(), 1);  // the first went at once; the rest wait for 100 s each
  q->Flush("j", "a");
  EXPECT_EQ(a.load(), 5);
  EXPECT_EQ(b.load(), 0);
  q->Shutdown();
  EXPECT_EQ(b.load(), 5);
  q->Submit("j", "b", 100000, [&] { ++b; });  // after shutdown: at once
  EXPECT_EQ(b.load(), 6);
}

// --- the endpoint ---------------------------------------------------------------------------

class RecordingEndpoint : public Endpoint {
 public:
  void SendV(Tag tag, const Segment* segments, int count, CompletionFn done) override {
    {
      absl::MutexLock l(&mu);
      tags.push_back(tag);
      bytes += TotalSize(segments, count);
    }
    done(aborted ? absl::CancelledError("aborted") : absl::OkStatus());
  }
  void RecvV(Tag tag, const Segment*, int, RecvCompletionFn done) override {
    recv_tags.push_back(tag);
    done(absl::OkStatus(), 0);
  }
  void Abort(const absl::Status&) override { aborted = true; }
  absl::Mutex mu;
  std::vector<Tag> tags;
  std::vector<Tag> recv_tags;
  size_t bytes = 0;
  std::atomic<bool> aborted{false};
};

TEST(PacedEndpointTest, SendsGoThroughTheQueueAndAbortReleasesThemFailed) {
  auto inner = std::make_shared<RecordingEndpoint>();
  auto q = std::make_shared<FairQueue>(QueueOpts(1000));
  PacedEndpoint ep(inner, q, "job", "comm");
  char data[200000] = {};
  Segment segs[2] = {{data, 100000}, {data + 100000, 16}};
  std::vector<absl::Status> results;
  for (Tag t = 1; t <= 3; ++t) {
    ep.SendV(t, segs, 2, [&](absl::Status s) { results.push_back(s); });
  }
  ASSERT_EQ(results.size(), 1u);  // the burst let the first out; 1 KB/s holds the others
  EXPECT_EQ(inner->bytes, 100016u);
  ep.RecvV(9, segs, 1, [&](absl::Status s, size_t) { results.push_back(s); });
  EXPECT_EQ(inner->recv_tags, std::vector<Tag>{9});  // receives are never queued
  ep.Abort(absl::UnavailableError("peer gone"));
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[2].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(results[3].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(inner->tags, (std::vector<Tag>{1, 2, 3}));
  EXPECT_EQ(q->queued_items(), 0u);
}

}  // namespace
}  // namespace railyard::transport
