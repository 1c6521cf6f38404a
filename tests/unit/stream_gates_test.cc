// Stream ordering's daemon side (daemon/submit/stream_gates.h, stream_sync.h) with real shared
// memory: held submissions go in order once their ready word reaches their value, expire naming
// what the word holds, go with their session; the done word is stored on every way a request ends.
#include "daemon/submit/stream_gates.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/comm/stream_sync.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

// A registered-buffer-like host segment of 4096 bytes.
std::shared_ptr<MappedSegment> Words() {
  UniqueFd fd(::memfd_create("railyard.gates", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_EQ(::fallocate(fd.get(), 0, 0, 4096), 0);
  EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  absl::StatusOr<std::shared_ptr<MappedSegment>> seg = MappedSegment::MapMemfd(std::move(fd), 4096);
  EXPECT_TRUE(seg.ok()) << seg.status();
  return *seg;
}

uint32_t* At(const std::shared_ptr<MappedSegment>& seg, uint64_t offset) {
  return reinterpret_cast<uint32_t*>(seg->data() + offset);
}

StreamSync Gate(const std::shared_ptr<MappedSegment>& seg, uint64_t offset, uint32_t value) {
  StreamSync s;
  s.words = seg;
  s.buffer_id = 7;
  s.offset = offset;
  s.value = value;
  return s;
}

// What the callbacks saw, in order.
struct Log {
  std::mutex mu;
  std::vector<std::string> events;
  void Add(std::string e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(std::move(e));
  }
  std::vector<std::string> Get() {
    std::lock_guard<std::mutex> lock(mu);
    return events;
  }
  bool WaitForSize(size_t n) {
    for (int i = 0; i < 2000; ++i) {
      if (Get().size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
};

StreamGates::Item MakeItem(Log* log, std::string name, std::optional<StreamSync> gate,
                           absl::Duration timeout = absl::Seconds(30)) {
  StreamGates::Item it;
  it.gate = std::move(gate);
  it.deadline = absl::Now() + timeout;
  it.release = [log, name](std::function<void()> done) {
    log->Add(name + " released");
    done();
  };
  it.fail = [log, name](const absl::Status& s) {
    log->Add(name + " failed: " + std::string(absl::StatusCodeToString(s.code())) + ": " +
             std::string(s.message()));
  };
  return it;
}

const int kOwnerA = 0, kOwnerB = 0;

TEST(StreamGatesTest, HeldItemsGoInOrderOnceTheReadyWordReachesTheValue) {
  auto seg = Words();
  StreamGates gates(absl::Microseconds(10));
  Log log;
  const StreamGates::Key k{&kOwnerA, 1}, other{&kOwnerB, 1};
  EXPECT_TRUE(gates.MustHold(k, Gate(seg, 0, 1)));  // the word holds 0
  EXPECT_FALSE(gates.MustHold(k, std::nullopt));
  ASSERT_TRUE(gates.Hold(k, "job", MakeItem(&log, "a", Gate(seg, 0, 1))).ok());
  // Behind a held item, even one with no gate (or an open one) waits.
  EXPECT_TRUE(gates.MustHold(k, std::nullopt));
  ASSERT_TRUE(gates.Hold(k, "job", MakeItem(&log, "b", std::nullopt)).ok());
  // Another queue is not held up by it.
  ASSERT_TRUE(gates.Hold(other, "job", MakeItem(&log, "c", std::nullopt)).ok());
  ASSERT_TRUE(log.WaitForSize(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(log.Get(), std::vector<std::string>({"c released"}));
  EXPECT_EQ(gates.held(), 2u);
  __atomic_store_n(At(seg, 0), 1u, __ATOMIC_RELEASE);
  ASSERT_TRUE(log.WaitForSize(3));
  EXPECT_EQ(log.Get(), std::vector<std::string>({"c released", "a released", "b released"}));
  EXPECT_EQ(gates.held(), 0u);
  EXPECT_FALSE(gates.MustHold(k, std::nullopt));
}

// A release may finish on another thread (a staging copy on the device's thread): nothing behind
// it on its queue goes until it calls done; other queues go meanwhile.
TEST(StreamGatesTest, AReleaseFinishedElsewhereHoldsItsQueueUntilDone) {
  StreamGates gates(absl::Microseconds(10));
  Log log;
  const StreamGates::Key k{&kOwnerA, 7}, other{&kOwnerB, 7};
  std::mutex mu;
  std::function<void()> later;  // the first release's done, called by the test
  StreamGates::Item first = MakeItem(&log, "a", std::nullopt);
  first.release = [&](std::function<void()> done) {
    log.Add("a released");
    std::lock_guard<std::mutex> lock(mu);
    later = std::move(done);
  };
  ASSERT_TRUE(gates.Hold(k, "job", std::move(first)).ok());
  ASSERT_TRUE(gates.Hold(k, "job", MakeItem(&log, "b", std::nullopt)).ok());
  ASSERT_TRUE(log.WaitForSize(1));
  ASSERT_TRUE(gates.Hold(other, "job", MakeItem(&log, "c", std::nullopt)).ok());
  ASSERT_TRUE(log.WaitForSize(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(log.Get(), std::vector<std::string>({"a released", "c released"}));
  EXPECT_TRUE(gates.MustHold(k, std::nullopt));
  std::thread elsewhere([&] {
    std::lock_guard<std::mutex> lock(mu);
    later();
    later();  // a second call changes nothing
  });
  elsewhere.join();
  ASSERT_TRUE(log.WaitForSize(3));
  EXPECT_EQ(log.Get().back(), "b released");
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(log.Get().size(), 3u);
  EXPECT_EQ(gates.held(), 0u);
}

TEST(StreamGatesTest, TheReadyWordIsComparedAsACounterThatWraps) {
  auto seg = Words();
  *At(seg, 8) = 0xffffffffu;
  EXPECT_FALSE(Gate(seg, 8, 1).ready());           // 1 comes after 0xffffffff
  EXPECT_TRUE(Gate(seg, 8, 0xfffffff0u).ready());  // passed
  *At(seg, 8) = 2;
  EXPECT_TRUE(Gate(seg, 8, 1).ready());  // wrapped past it
  EXPECT_FALSE(Gate(seg, 8, 3).ready());
}

TEST(StreamGatesTest, AnItemWhoseStreamNeverComesExpiresSayingWhatTheWordHolds) {
  auto seg = Words();
  *At(seg, 16) = 3;
  StreamGates gates(absl::Microseconds(10));
  Log log;
  const StreamGates::Key k{&kOwnerA, 2};
  ASSERT_TRUE(
      gates.Hold(k, "job", MakeItem(&log, "a", Gate(seg, 16, 5), absl::Milliseconds(50))).ok());
  ASSERT_TRUE(gates.Hold(k, "job", MakeItem(&log, "b", std::nullopt)).ok());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(log.WaitForSize(2));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(45));
  const std::vector<std::string> got = log.Get();
  EXPECT_THAT(got[0], HasSubstr("a failed: DEADLINE_EXCEEDED"));
  EXPECT_THAT(got[0], HasSubstr("ready word (buffer 7 offset 16) holds 3, the operation waits "
                                "for 5"));
  EXPECT_EQ(got[1], "b released");
}

TEST(StreamGatesTest, DroppingAnOwnerFailsItsItemsInOrderAndNoOneElses) {
  auto seg = Words();
  StreamGates gates(absl::Microseconds(10));
  Log log;
  int a = 0, b = 0;
  ASSERT_TRUE(gates.Hold({&a, 1}, "job", MakeItem(&log, "a1", Gate(seg, 0, 1))).ok());
  ASSERT_TRUE(gates.Hold({&a, 1}, "job", MakeItem(&log, "a2", std::nullopt)).ok());
  ASSERT_TRUE(gates.Hold({&a, 9}, "job", MakeItem(&log, "a3", Gate(seg, 0, 1))).ok());
  ASSERT_TRUE(gates.Hold({&b, 1}, "job", MakeItem(&log, "b1", Gate(seg, 8, 1))).ok());
  gates.Drop(&a, absl::CancelledError("the session has ended"));
  EXPECT_EQ(log.Get(), std::vector<std::string>({"a1 failed: CANCELLED: the session has ended",
                                                 "a2 failed: CANCELLED: the session has ended",
                                                 "a3 failed: CANCELLED: the session has ended"}));
  EXPECT_EQ(gates.held(), 1u);
  *At(seg, 8) = 1;
  ASSERT_TRUE(log.WaitForSize(4));
  EXPECT_EQ(log.Get().back(), "b1 released");
}

TEST(StreamGatesTest, AQueueHoldsABoundedNumberAndTheRestIsRefused) {
  auto seg = Words();
  StreamGates::Limits limits;
  limits.per_queue = 2;
  StreamGates gates(absl::Microseconds(10), absl::Microseconds(100), limits);
  Log log;
  const StreamGates::Key k{&kOwnerA, 3};
  ASSERT_TRUE(gates.Hold(k, "job", MakeItem(&log, "a", Gate(seg, 0, 1))).ok());
  ASSERT_TRUE(gates.Hold(k, "job", MakeItem(&log, "b", std::nullopt)).ok());
  absl::Status s = gates.Hold(k, "job", MakeItem(&log, "c", std::nullopt));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("2 operations of this rank on this communicator already wait"));
  EXPECT_EQ(gates.held(), 2u);
}

// One session's (or job's) held operations stop at its limit, whatever communicators they are
// spread over; other sessions and jobs still hold theirs (issue 55: 196,605 held operations, 157
// MiB of the daemon's heap).
TEST(StreamGatesTest, SessionsAndJobsHoldBoundedNumbersAndOthersAreServed) {
  auto seg = Words();
  Log log;  // outlives the gates: items left at shutdown fail into it
  StreamGates::Limits limits;
  limits.per_session = 3;
  limits.per_job = 5;
  StreamGates gates(absl::Microseconds(10), absl::Microseconds(100), limits);
  const int s1 = 0, s2 = 0, s3 = 0;
  for (uint64_t comm = 0; comm < 3; ++comm) {
    ASSERT_TRUE(gates.Hold({&s1, comm}, "hog", MakeItem(&log, "x", Gate(seg, 0, 1))).ok());
  }
  absl::Status s = gates.Hold({&s1, 9}, "hog", MakeItem(&log, "x", Gate(seg, 0, 1)));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("(--max_held_ops_per_session)"));
  ASSERT_TRUE(gates.Hold({&s2, 1}, "hog", MakeItem(&log, "y", Gate(seg, 0, 1))).ok());
  ASSERT_TRUE(gates.Hold({&s2, 2}, "hog", MakeItem(&log, "y", Gate(seg, 0, 1))).ok());
  s = gates.Hold({&s2, 3}, "hog", MakeItem(&log, "y", Gate(seg, 0, 1)));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("of job hog already wait"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("(--max_held_ops_per_job)"));
  ASSERT_TRUE(gates.Hold({&s3, 1}, "other", MakeItem(&log, "z", std::nullopt)).ok());
  ASSERT_TRUE(log.WaitForSize(1));  // the other job's item went at once
  // Dropping a session gives its share (and its job's) back.
  gates.Drop(&s1, absl::CancelledError("gone"));
  EXPECT_TRUE(gates.Hold({&s2, 3}, "hog", MakeItem(&log, "y", Gate(seg, 0, 1))).ok());
  EXPECT_EQ(gates.held(), 3u);
}

// A gate that never opens costs a poll every few milliseconds once it has waited a while, not a
// poll every 100 us (issue 55: the stream-gate thread at 41-69 % of a core).
TEST(StreamGatesTest, AGateThatStaysClosedIsPolledLessAndLessOften) {
  auto seg = Words();
  Log log;  // outlives the gates: items left at shutdown fail into it
  StreamGates gates(absl::ZeroDuration(), absl::Microseconds(100));
  ASSERT_TRUE(gates.Hold({&kOwnerA, 1}, "job", MakeItem(&log, "a", Gate(seg, 0, 1))).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  const uint64_t before = gates.polls();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const uint64_t polls = gates.polls() - before;
  // At 100 us it would be ~5000; at >= 700/64 ms (~11 ms, capped at 10 ms) about 50.
  EXPECT_LT(polls, 200u);
  EXPECT_GT(polls, 10u);
  *At(seg, 0) = 1;  // and it still opens
  ASSERT_TRUE(log.WaitForSize(1));
  EXPECT_EQ(log.Get()[0], "a released");
}

TEST(StreamGatesTest, WithNothingHeldThePollerSleeps) {
  StreamGates gates(absl::Microseconds(10));
  Log log;
  ASSERT_TRUE(gates.Hold({&kOwnerA, 4}, "job", MakeItem(&log, "a", std::nullopt)).ok());
  ASSERT_TRUE(log.WaitForSize(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const uint64_t polls = gates.polls();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(gates.polls(), polls);
}

TEST(StreamGatesTest, ItemsLeftAtShutdownFail) {
  auto seg = Words();
  Log log;
  {
    StreamGates gates(absl::Microseconds(10));
    ASSERT_TRUE(gates.Hold({&kOwnerA, 5}, "job", MakeItem(&log, "a", Gate(seg, 0, 1))).ok());
  }
  EXPECT_EQ(log.Get(),
            std::vector<std::string>({"a failed: UNAVAILABLE: railyardd is shutting down"}));
}

// The done word: stored before the completion goes on, and by the sink's end when no completion
// ever came (a refused or dropped request), so a stream waiting on it never waits forever.
class RecordingSink : public CompletionSink {
 public:
  explicit RecordingSink(uint32_t* done) : done_(done) {}
  void PostCompletion(uint64_t id, const absl::Status& status, uint64_t seq) override {
    done_seen = __atomic_load_n(done_, __ATOMIC_ACQUIRE);
    code = status.code();
    ++calls;
  }
  uint32_t done_seen = 0;
  absl::StatusCode code = absl::StatusCode::kUnknown;
  int calls = 0;

 private:
  uint32_t* done_;
};

TEST(StreamSyncSinkTest, DoneIsStoredBeforeTheCompletionAndWhenNoneComes) {
  auto seg = Words();
  auto inner = std::make_shared<RecordingSink>(At(seg, 44));
  {
    StreamSyncSink sink(inner, Gate(seg, 40, 9));
    sink.PostCompletion(1, absl::AbortedError("x"), 0);
  }
  EXPECT_EQ(inner->calls, 1);
  EXPECT_EQ(inner->done_seen, 9u);
  EXPECT_EQ(inner->code, absl::StatusCode::kAborted);
  { StreamSyncSink dropped(inner, Gate(seg, 48, 12)); }
  EXPECT_EQ(*At(seg, 52), 12u);
  EXPECT_EQ(inner->calls, 1);
}

}  // namespace
}  // namespace railyard
