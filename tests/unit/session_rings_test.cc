// The session rings end to end in one process: the client's end (client/cpp/client_rings.h) and
// the daemon's (daemon/session/session_rings.h) over one real sealed memfd, with a fake in place
// of SubmitPath::Submit. Wrap-around, back-pressure of a full completion ring, garbage a client
// can write (entries, tails, extension slots), concurrent submitters, sleeping when idle, and
// stopping with operations in flight.
#include "daemon/session/session_rings.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "client/cpp/client_rings.h"
#include "daemon/session/ring_entry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/railyard/v1/ring.h"
#include "tests/unit/ring_pair.h"

namespace railyard {
namespace {

namespace rp = ringproto;
using ring_testing::batches_mu;
using ring_testing::batches_seen;
using ring_testing::Clock;
using ring_testing::Eventually;
using ring_testing::FakeSubmit;
using ring_testing::Outcome;
using ring_testing::RingPair;
using ::testing::HasSubstr;

TEST(SessionRingsTest, EntriesWrapAroundBothRingsInOrderWithTheirSequenceNumbers) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  RingPair rings(8, 8, fake);
  for (uint64_t id = 1; id <= 100; ++id) {  // 12 laps of each ring
    ASSERT_TRUE(rings.Submit(id).ok());
    ASSERT_TRUE(rings.WaitFor(id)) << id;
    const Outcome o = rings.Get(id);
    EXPECT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.seq, id - 1);
    EXPECT_EQ(o.times, 1);
  }
  ASSERT_EQ(fake->seen(), 100u);
  for (size_t i = 0; i < 100; ++i) {
    const v1::SubmitRequest& r = fake->seen_at(i).request;
    EXPECT_EQ(r.request_id(), i + 1);
    EXPECT_EQ(r.count(), i + 1);
    EXPECT_EQ(r.comm_handle(), 7u);
    EXPECT_EQ(r.op(), v1::COLLECTIVE_OP_ALL_REDUCE);
    EXPECT_EQ(r.dtype(), v1::DATA_TYPE_FLOAT32);
  }
  const RingStats st = rings.daemon_->stats();
  EXPECT_EQ(st.submitted, 100u);
  EXPECT_EQ(st.completed, 100u);
  EXPECT_EQ(st.refused, 0u);
}

TEST(SessionRingsTest, AFullCompletionRingStopsTheDaemonTakingEntriesUntilTheClientReads) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kHold);
  RingPair rings(8, 8, fake);
  for (uint64_t id = 1; id <= 8; ++id) ASSERT_TRUE(rings.Submit(id).ok());
  ASSERT_TRUE(Eventually([&] { return fake->seen() == 8; }));
  // Eight accepted requests hold every completion slot: these eight wait in the submission ring.
  for (uint64_t id = 9; id <= 16; ++id) ASSERT_TRUE(rings.Submit(id).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(fake->seen(), 8u);
  EXPECT_EQ(__atomic_load_n(&rings.Word64(rp::kOffSqHead), __ATOMIC_ACQUIRE), 8u);
  // Completed but unread, they still hold the slots.
  fake->CompleteHeld();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(fake->seen(), 8u);
  // Reading them frees the slots and wakes the daemon.
  EXPECT_EQ(rings.client_->Drain(), 8u);
  ASSERT_TRUE(Eventually([&] { return fake->seen() == 16; }));
  fake->CompleteHeld();
  ASSERT_TRUE(rings.WaitFor(16));
  EXPECT_EQ(rings.CompletionCount(), 16u);
}

TEST(SessionRingsTest, GarbageEntriesGetOneErrorCompletionEachAndNothingElse) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kRefuse);
  RingPair rings(64, 64, fake);
  std::mt19937_64 rng(1234);
  constexpr int kEntries = 500;
  int published = 0;
  std::map<uint64_t, int> expected;
  while (published < kEntries) {
    std::vector<std::byte> slot(rp::kSqEntryBytes);
    for (auto& b : slot) b = static_cast<std::byte>(rng());
    uint64_t id = 1000000 + published;
    std::memcpy(slot.data() + rp::kSqRequestId, &id, 8);
    // Small extension counts some of the time, so that both paths are taken.
    uint32_t ext = static_cast<uint32_t>(rng() % 3 == 0 ? rng() % 4 : rng());
    std::memcpy(slot.data() + rp::kSqExtSlots, &ext, 4);
    ext = 0;  // publish one slot: any extension it claims is missing or another entry's
    ++expected[id];
    while (__atomic_load_n(&rings.Word64(rp::kOffSqTail), __ATOMIC_ACQUIRE) -
               __atomic_load_n(&rings.Word64(rp::kOffSqHead), __ATOMIC_ACQUIRE) >=
           64) {
      rings.client_->Drain();
      std::this_thread::yield();
    }
    rings.PublishRaw(slot, 64);
    ++published;
    rings.client_->Drain();
  }
  // Every entry taken produced exactly one completion, every one an error; none crashed the
  // daemon. An entry that claimed extension slots swallowed the entries after it (as many as
  // published), so there may be fewer completions than entries, never more.
  ASSERT_TRUE(Eventually([&] {
    rings.client_->Drain();
    return __atomic_load_n(&rings.Word64(rp::kOffSqHead), __ATOMIC_ACQUIRE) ==
           __atomic_load_n(&rings.Word64(rp::kOffSqTail), __ATOMIC_ACQUIRE);
  }));
  rings.client_->Drain();
  const size_t n = rings.CompletionCount();
  EXPECT_GT(n, 100u);
  EXPECT_LE(n, static_cast<size_t>(kEntries));
  for (const auto& [id, count] : expected) {
    if (!rings.Has(id)) continue;
    const Outcome o = rings.Get(id);
    EXPECT_EQ(o.times, 1);
    EXPECT_EQ(o.status.code(), absl::StatusCode::kInvalidArgument) << o.status;
  }
  EXPECT_EQ(rings.daemon_->stats().refused, n);
}

TEST(SessionRingsTest, ATailBeyondTheRingIsReportedOnceAndNothingIsTakenUntilItIsSane) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  RingPair rings(8, 8, fake);
  __atomic_store_n(&rings.Word64(rp::kOffSqTail), 1000, __ATOMIC_RELEASE);
  rings.PublishRaw({}, 8);
  ASSERT_TRUE(rings.WaitFor(0));
  const Outcome o = rings.Get(0);
  EXPECT_EQ(o.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(o.status.message()), HasSubstr("1000 slots ahead of head 0"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  rings.client_->Drain();
  EXPECT_EQ(fake->seen(), 0u);
  EXPECT_EQ(rings.Get(0).times, 1);  // reported once, not once per look
  // The client puts its tail back: the ring works again.
  __atomic_store_n(&rings.Word64(rp::kOffSqTail), 0, __ATOMIC_RELEASE);
  ASSERT_TRUE(rings.Submit(5).ok());
  ASSERT_TRUE(rings.WaitFor(5));
  EXPECT_TRUE(rings.Get(5).status.ok());
  EXPECT_EQ(fake->seen(), 1u);
}

// A client whose process wrote entries into its ring behind the library's back: the daemon
// takes them, its head passes the tail the library published, and the library's next
// submission fails at once saying so (it used to wait for room that never came).
TEST(SessionRingsTest, ARingWrittenBehindTheLibraryFailsItsNextSubmissionNamingWhy) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  RingPair rings(8, 8, fake);
  ASSERT_TRUE(rings.Submit(1).ok());
  ASSERT_TRUE(rings.WaitFor(1));
  std::vector<std::byte> slots;
  for (uint64_t id = 100; id < 103; ++id) {
    ASSERT_TRUE(RingPair::EncodeAllReduce(id, false, &slots).ok());
  }
  ASSERT_EQ(slots.size(), 3 * rp::kSqEntryBytes);
  rings.PublishRaw(slots, 8);
  ASSERT_TRUE(Eventually([&] {
    rings.client_->Drain();
    return rings.Has(102);
  }));
  EXPECT_EQ(fake->seen(), 4u);  // the daemon took and ran them: they were well formed
  const auto start = Clock::now();
  const absl::Status s = rings.Submit(2);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("the daemon's head is at 4"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("this client published up to 1"));
  EXPECT_EQ(fake->seen(), 4u);  // nothing of the refused submission reached the daemon
}

TEST(SessionRingsTest, ExtensionSlotsThatWereNeverPublishedAreRefusedNamingThem) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  RingPair rings(16, 16, fake);
  std::vector<std::byte> slot(rp::kSqEntryBytes);
  const uint64_t id = 42;
  const uint32_t op = v1::COLLECTIVE_OP_ALL_TO_ALL_V, ext = 5, vec_len = 20;
  std::memcpy(slot.data() + rp::kSqRequestId, &id, 8);
  std::memcpy(slot.data() + rp::kSqOp, &op, 4);
  std::memcpy(slot.data() + rp::kSqExtSlots, &ext, 4);
  std::memcpy(slot.data() + rp::kSqVecLen, &vec_len, 4);
  rings.PublishRaw(slot, 16);
  ASSERT_TRUE(rings.WaitFor(42));
  const Outcome o = rings.Get(42);
  EXPECT_EQ(o.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(o.status.message()),
              HasSubstr("says 5 extension slots follow, but only 0 are published"));
  EXPECT_EQ(fake->seen(), 0u);
}

TEST(SessionRingsTest, AllToAllvVectorsTravelInExtensionSlotsAcrossTheWrap) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  RingPair rings(16, 16, fake);
  // Move the tail near the end of the ring first, so that the vectors wrap.
  for (uint64_t id = 1; id <= 13; ++id) {
    ASSERT_TRUE(rings.Submit(id).ok());
    ASSERT_TRUE(rings.WaitFor(id));
  }
  v1::SubmitRequest r;
  r.set_request_id(99);
  r.set_comm_handle(3);
  r.set_op(v1::COLLECTIVE_OP_ALL_TO_ALL_V);
  r.set_dtype(v1::DATA_TYPE_INT32);
  r.set_algo("direct");
  constexpr int kRanks = 9;  // 9 * 32 bytes: 3 extension slots
  for (int i = 0; i < kRanks; ++i) {
    r.add_send_counts(i);
    r.add_send_displs(100 + i);
    r.add_recv_counts(200 + i);
    r.add_recv_displs(300 + i);
  }
  std::vector<std::byte> bytes;
  ASSERT_TRUE(internal::ClientRings::Encode(r, false, &bytes).ok());
  EXPECT_EQ(bytes.size(), 4 * rp::kSqEntryBytes);
  ASSERT_TRUE(rings.client_->Publish(bytes).ok());
  ASSERT_TRUE(rings.WaitFor(99));
  EXPECT_TRUE(rings.Get(99).status.ok());
  const v1::SubmitRequest got = fake->seen_at(13).request;
  EXPECT_EQ(got.algo(), "direct");
  ASSERT_EQ(got.send_counts_size(), kRanks);
  for (int i = 0; i < kRanks; ++i) {
    EXPECT_EQ(got.send_counts(i), static_cast<uint64_t>(i));
    EXPECT_EQ(got.send_displs(i), static_cast<uint64_t>(100 + i));
    EXPECT_EQ(got.recv_counts(i), static_cast<uint64_t>(200 + i));
    EXPECT_EQ(got.recv_displs(i), static_cast<uint64_t>(300 + i));
  }
}

// Compression (ring protocol v2): the codec name and the error-feedback key travel in the entry;
// a key without the feedback flag, or a name that fills its field, is refused naming the field.
TEST(RingEntryTest, CompressionAndItsKeyTravelAndMalformedOnesAreRefused) {
  v1::SubmitRequest r;
  r.set_request_id(5);
  r.set_op(v1::COLLECTIVE_OP_ALL_REDUCE);
  r.set_algo("ring");
  r.set_compression("topk:0.01");
  r.set_error_feedback(true);
  r.set_compression_key(0xfeedfacecafe);
  std::vector<std::byte> bytes;
  ASSERT_TRUE(internal::ClientRings::Encode(r, false, &bytes).ok());
  absl::StatusOr<RingSubmission> got = DecodeRingEntry(bytes, {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->request.algo(), "ring");
  EXPECT_EQ(got->request.compression(), "topk:0.01");
  EXPECT_TRUE(got->request.error_feedback());
  EXPECT_EQ(got->request.compression_key(), 0xfeedfacecafeu);

  std::vector<std::byte> no_flag = bytes;
  uint32_t flags = 0;
  std::memcpy(no_flag.data() + rp::kSqFlags, &flags, 4);
  got = DecodeRingEntry(no_flag, {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()), ::testing::HasSubstr("compression_key"));

  std::vector<std::byte> unterminated = bytes;
  std::memset(unterminated.data() + rp::kSqCompression, 'x', rp::kCompressionBytes);
  got = DecodeRingEntry(unterminated, {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()),
              ::testing::HasSubstr("compression is not NUL-terminated within 16 bytes"));

  r.set_compression("topk:0.0000001234");  // 17 characters
  bytes.clear();
  absl::Status s = internal::ClientRings::Encode(r, false, &bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("longer than 15 characters"));
}

// Stream ordering: SubmitRequest.stream_sync travels in the last extension slot, after an
// AllToAllv's vectors when there are some; the flag without a slot to hold it is refused.
TEST(RingEntryTest, StreamSyncTravelsInTheLastExtensionSlot) {
  for (const bool vectors : {false, true}) {
    v1::SubmitRequest r;
    r.set_request_id(8);
    r.set_op(vectors ? v1::COLLECTIVE_OP_ALL_TO_ALL_V : v1::COLLECTIVE_OP_ALL_REDUCE);
    if (vectors) {
      for (int i = 0; i < 5; ++i) {
        r.add_send_counts(i);
        r.add_send_displs(10 + i);
        r.add_recv_counts(20 + i);
        r.add_recv_displs(30 + i);
      }
    }
    r.mutable_stream_sync()->mutable_words()->set_buffer_id(77);
    r.mutable_stream_sync()->mutable_words()->set_offset(4088);
    r.mutable_stream_sync()->set_value(0xfffffffe);
    std::vector<std::byte> bytes;
    ASSERT_TRUE(internal::ClientRings::Encode(r, false, &bytes).ok());
    const size_t vec_slots = vectors ? rp::ExtSlotsFor(5) : 0;
    ASSERT_EQ(bytes.size(), (2 + vec_slots) * rp::kSqEntryBytes);
    absl::Span<const std::byte> all(bytes);
    absl::StatusOr<RingSubmission> got =
        DecodeRingEntry(all.first(rp::kSqEntryBytes), all.subspan(rp::kSqEntryBytes));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->request.has_stream_sync());
    EXPECT_EQ(got->request.stream_sync().words().buffer_id(), 77u);
    EXPECT_EQ(got->request.stream_sync().words().offset(), 4088u);
    EXPECT_EQ(got->request.stream_sync().value(), 0xfffffffeu);
    if (vectors) {
      ASSERT_EQ(got->request.recv_displs_size(), 5);
      EXPECT_EQ(got->request.recv_displs(4), 34u);
    }
  }
  // The flag on an entry with no extension slot.
  v1::SubmitRequest r;
  r.set_op(v1::COLLECTIVE_OP_ALL_REDUCE);
  std::vector<std::byte> bytes;
  ASSERT_TRUE(internal::ClientRings::Encode(r, false, &bytes).ok());
  const uint32_t flags = rp::kFlagStreamSync;
  std::memcpy(bytes.data() + rp::kSqFlags, &flags, 4);
  absl::StatusOr<RingSubmission> got = DecodeRingEntry(bytes, {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(got.status().message()),
              ::testing::HasSubstr("stream-sync flag but no extension slot"));
}

TEST(SessionRingsTest, AGroupPublishedAtOnceIsHandedOverAsOneBatch) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  RingPair rings(16, 16, fake);
  {
    std::lock_guard<std::mutex> lock(batches_mu);
    batches_seen.clear();
  }
  std::vector<std::byte> bytes;
  for (uint64_t id = 1; id <= 3; ++id) {
    v1::SubmitRequest r;
    r.set_request_id(id);
    r.set_op(v1::COLLECTIVE_OP_BARRIER);
    ASSERT_TRUE(internal::ClientRings::Encode(r, /*group_next=*/id < 3, &bytes).ok());
  }
  ASSERT_TRUE(rings.client_->Publish(bytes).ok());
  ASSERT_TRUE(rings.WaitFor(3));
  ASSERT_TRUE(rings.WaitFor(1));
  EXPECT_TRUE(fake->seen_at(0).group_next);
  EXPECT_TRUE(fake->seen_at(1).group_next);
  EXPECT_FALSE(fake->seen_at(2).group_next);
  rings.daemon_->Stop();
  std::lock_guard<std::mutex> lock(batches_mu);
  EXPECT_EQ(batches_seen, std::vector<size_t>({3}));
}

TEST(SessionRingsTest, ConcurrentSubmittersInOneProcessEachGetTheirCompletionsOnce) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  RingPair rings(64, 64, fake);
  constexpr int kThreads = 4, kPerThread = 3000;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const uint64_t id = static_cast<uint64_t>(t) * 1000000 + i + 1;
        if (!rings.Submit(id).ok() || !rings.WaitFor(id)) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(rings.CompletionCount(), static_cast<size_t>(kThreads * kPerThread));
  EXPECT_EQ(fake->seen(), static_cast<size_t>(kThreads * kPerThread));
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      const Outcome o = rings.Get(static_cast<uint64_t>(t) * 1000000 + i + 1);
      ASSERT_EQ(o.times, 1);
      ASSERT_TRUE(o.status.ok());
    }
  }
}

TEST(SessionRingsTest, AnIdleRingThreadSleepsOnItsDoorbellAndWakesForTheNextEntry) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  RingPair rings(8, 8, fake);
  ASSERT_TRUE(rings.Submit(1).ok());
  ASSERT_TRUE(rings.WaitFor(1));
  ASSERT_TRUE(Eventually(
      [&] { return __atomic_load_n(&rings.Word32(rp::kOffDaemonSleeping), __ATOMIC_ACQUIRE) == 1; },
      std::chrono::seconds(2)));
  const uint64_t wakeups = rings.daemon_->stats().wakeups;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Asleep: no polling in between (a 1 s backstop timeout at most).
  EXPECT_LE(rings.daemon_->stats().wakeups, wakeups + 1);
  ASSERT_TRUE(rings.Submit(2).ok());
  ASSERT_TRUE(rings.WaitFor(2, std::chrono::milliseconds(500)));
  EXPECT_TRUE(rings.Get(2).status.ok());
}

// Stands in for the UCX transport's polling side: counts the calls, and its Poll completes what
// the fake Submit holds once `complete_after` polls have passed (as a transfer's completion
// callback would, on the polling thread).
class FakePoller : public transport::Transport {
 public:
  explicit FakePoller(std::shared_ptr<FakeSubmit> fake, int complete_after)
      : fake_(std::move(fake)), complete_after_(complete_after) {}
  int num_rails() const override { return 0; }
  absl::StatusOr<std::string> LocalAddress(int) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<std::shared_ptr<transport::Endpoint>> Connect(const std::string&, int) override {
    return absl::UnimplementedError("fake");
  }
  void Shutdown() override {}
  void BeginPolling() override { ++begins; }
  void EndPolling() override { ++ends; }
  bool Poll() override {
    const int n = ++polls;
    poller_thread = std::this_thread::get_id();
    if (complete_after_ < 0 || n < complete_after_) return false;
    fake_->CompleteHeld();
    return true;
  }
  std::atomic<int> begins{0}, ends{0}, polls{0};
  std::atomic<std::thread::id> poller_thread{};

 private:
  const std::shared_ptr<FakeSubmit> fake_;
  const int complete_after_;  // -1: never
};

TEST(SessionRingsTest, WithOperationsInFlightTheRingThreadPollsTheTransportUntilTheyComplete) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kHold);
  FakePoller poller(fake, /*complete_after=*/20);
  RingPair rings(8, 8, fake, std::chrono::microseconds(10), &poller, absl::Seconds(5));
  ASSERT_TRUE(rings.Submit(1).ok());
  ASSERT_TRUE(rings.WaitFor(1));
  EXPECT_TRUE(rings.Get(1).status.ok());
  EXPECT_GE(poller.polls.load(), 20);
  EXPECT_NE(poller.poller_thread.load(), std::this_thread::get_id());
  // Nothing in flight: the thread stops polling within its spin, hands progress back (every
  // BeginPolling has its EndPolling) and sleeps on the doorbell.
  ASSERT_TRUE(Eventually(
      [&] { return __atomic_load_n(&rings.Word32(rp::kOffDaemonSleeping), __ATOMIC_ACQUIRE) == 1; },
      std::chrono::seconds(2)));
  EXPECT_EQ(poller.begins.load(), poller.ends.load());
  const int polls = poller.polls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(poller.polls.load(), polls) << "an idle ring thread polled the transport";
}

TEST(SessionRingsTest, AnOperationOutlastingThePollWindowIsLeftToTheTransportsOwnThreads) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kHold);
  FakePoller poller(fake, /*complete_after=*/-1);
  RingPair rings(8, 8, fake, std::chrono::microseconds(10), &poller, absl::Milliseconds(5));
  ASSERT_TRUE(rings.Submit(1).ok());
  // In flight and polled for 5 ms, then the thread sleeps although the operation goes on. The
  // thread was asleep before the submission too (the flag still says so until it wakes, which
  // took long enough under CI's load for a check of the flag alone to pass before any poll), so
  // first see it poll.
  ASSERT_TRUE(Eventually([&] { return poller.polls.load() > 0; }, std::chrono::seconds(2)));
  ASSERT_TRUE(Eventually(
      [&] { return __atomic_load_n(&rings.Word32(rp::kOffDaemonSleeping), __ATOMIC_ACQUIRE) == 1; },
      std::chrono::seconds(2)));
  EXPECT_EQ(poller.begins.load(), poller.ends.load());
  const int polls = poller.polls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(poller.polls.load(), polls);
  EXPECT_FALSE(rings.Has(1));
  fake->CompleteHeld();  // the transport's own thread completes it later
  ASSERT_TRUE(rings.WaitFor(1));
  EXPECT_TRUE(rings.Get(1).status.ok());
}

// A client that submits again a little while after each completion (a Python loop: tens of
// microseconds) teaches the ring thread to stay awake that long (up to the poll window), instead
// of sleeping after `spin` and being woken by a system call for every operation.
TEST(SessionRingsTest, TheIdleSpinAdaptsToHowSoonTheClientSubmitsAgain) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  RingPair rings(8, 8, fake, std::chrono::microseconds(10), nullptr, absl::Milliseconds(20));
  constexpr int kOps = 200;
  uint64_t wakeups_at_half = 0;
  for (int i = 1; i <= kOps; ++i) {
    ASSERT_TRUE(rings.Submit(i).ok());
    ASSERT_TRUE(rings.WaitFor(i));
    if (i == kOps / 2) wakeups_at_half = rings.daemon_->stats().wakeups;
    const auto until = Clock::now() + std::chrono::microseconds(300);  // longer than `spin`
    while (Clock::now() < until) {
    }
  }
  // Learnt after a few operations: the second half finds the thread awake (nearly) every time.
  const uint64_t late = rings.daemon_->stats().wakeups - wakeups_at_half;
  EXPECT_LT(late, kOps / 4u) << late << " wake-ups in the last " << kOps / 2 << " operations";
  // Idle for good: it still goes to sleep, within the 20 ms cap.
  EXPECT_TRUE(Eventually(
      [&] { return __atomic_load_n(&rings.Word32(rp::kOffDaemonSleeping), __ATOMIC_ACQUIRE) == 1; },
      std::chrono::seconds(2)));
}

TEST(SessionRingsTest, StoppingWithOperationsInFlightIsPromptAndLaterCompletionsAreDropped) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kHold);
  RingPair rings(8, 8, fake);
  for (uint64_t id = 1; id <= 5; ++id) ASSERT_TRUE(rings.Submit(id).ok());
  ASSERT_TRUE(Eventually([&] { return fake->seen() == 5; }));
  const auto start = Clock::now();
  rings.daemon_->Stop();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  fake->CompleteHeld();  // the operations end after the session did: nothing is written
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(rings.client_->Drain(), 0u);
  EXPECT_EQ(rings.daemon_->stats().completed, 0u);
}

// How a daemon shuts down: entries the client published before are taken (and complete) even
// when the ring thread had not reached them; what completes after Stop() is dropped.
TEST(SessionRingsTest, QuiescingTakesEveryPublishedEntryAndStillWritesTheirCompletions) {
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kHold);
  RingPair rings(8, 8, fake);
  fake->Close();
  ASSERT_TRUE(rings.Submit(1).ok());
  ASSERT_TRUE(Eventually([&] { return fake->entered() == 1; }));  // the ring thread is held
  for (uint64_t id = 2; id <= 5; ++id) ASSERT_TRUE(rings.Submit(id).ok());
  std::thread quiesce([&] { rings.daemon_->Quiesce(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  fake->Open();
  quiesce.join();
  ASSERT_EQ(fake->seen(), 5u) << "entries published before Quiesce() were left in the ring";
  EXPECT_EQ(__atomic_load_n(&rings.Word64(rp::kOffSqHead), __ATOMIC_ACQUIRE), 5u);
  // Nothing is taken after it, and completions are still written.
  ASSERT_TRUE(rings.Submit(6).ok());
  fake->CompleteHeld();
  for (uint64_t id = 1; id <= 5; ++id) {
    ASSERT_TRUE(rings.WaitFor(id)) << id;
    EXPECT_TRUE(rings.Get(id).status.ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(fake->seen(), 5u);
  EXPECT_FALSE(rings.Has(6));
  rings.daemon_->Quiesce();  // a second one does nothing
  rings.daemon_->Stop();
  EXPECT_EQ(fake->seen(), 5u);
  EXPECT_EQ(rings.daemon_->stats().completed, 5u);
}

TEST(SessionRingsTest, RingsWhoseHeaderOrSizeDisagreeWithTheRequestAreRefused) {
  int fd = -1;
  auto client = internal::ClientRings::Create("unit", 8, 8, std::chrono::microseconds(0), &fd);
  ASSERT_TRUE(client.ok());
  auto seg = MappedSegment::MapMemfd(UniqueFd(fd), rp::RingBytes(8, 8));
  ASSERT_TRUE(seg.ok());
  auto wrong_geometry = SessionRings::Create(*seg, 16, 8, absl::ZeroDuration());
  EXPECT_EQ(wrong_geometry.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong_geometry.status().message()), HasSubstr("take"));
  auto not_power = SessionRings::Create(*seg, 12, 8, absl::ZeroDuration());
  EXPECT_EQ(not_power.status().code(), absl::StatusCode::kInvalidArgument);
  std::memset((*seg)->data(), 0xab, 4);  // the magic
  auto bad_magic = SessionRings::Create(*seg, 8, 8, absl::ZeroDuration());
  EXPECT_EQ(bad_magic.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_magic.status().message()), HasSubstr("magic"));
}

}  // namespace
}  // namespace railyard
