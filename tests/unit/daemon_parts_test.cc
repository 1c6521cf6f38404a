// The daemon's small parts: comm ids, job tokens, logs, the deadline timer.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/comm/comm_id.h"
#include "daemon/session/job_tokens.h"
#include "daemon/session/shm_segment.h"
#include "daemon/util/deadline_timer.h"
#include "daemon/util/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

TEST(CommIdTest, RoundTripsAndRejectsMalformedIds) {
  const CommId id{RandomHex128(), "10.0.0.7:7070"};
  EXPECT_EQ(id.nonce.size(), 32u);
  auto parsed = ParseCommId(FormatCommId(id));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->nonce, id.nonce);
  EXPECT_EQ(parsed->coordinator, "10.0.0.7:7070");
  EXPECT_NE(RandomHex128(), RandomHex128());
  for (const char* bad :
       {"", "ry1-", "ry2-0123456789abcdef0123456789abcdef@x",
        "ry1-0123456789ABCDEF0123456789abcdef@x", "ry1-0123456789abcdef0123456789abcde@x",
        "ry1-0123456789abcdef0123456789abcdef@", "ry1-0123456789abcdef0123456789abcdef@a b"}) {
    auto s = ParseCommId(bad);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("malformed comm id"));
  }
}

TEST(JobTokensTest, ParsesLinesAndNamesBadOnes) {
  auto t = ParseJobTokens("# comment\n\njob-a  tokA\njob.b tokB # trailing\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 2u);
  EXPECT_EQ(t->at("job-a"), "tokA");
  EXPECT_EQ(t->at("job.b"), "tokB");
  EXPECT_THAT(std::string(ParseJobTokens("a b\nonlyone\n").status().message()),
              HasSubstr("line 2"));
  EXPECT_THAT(std::string(ParseJobTokens("a b\na c\n").status().message()),
              HasSubstr("listed twice"));
  EXPECT_EQ(LoadJobTokens("/nonexistent/tokens").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(ValidJobId("train_7.x-y"));
  EXPECT_FALSE(ValidJobId(""));
  EXPECT_FALSE(ValidJobId("a/b"));
  EXPECT_FALSE(ValidJobId(std::string(129, 'a')));
}

// Any blanks separate a job id from its token: a tab is no part of the token (found by
// tests/fuzz/job_tokens_fuzz: "job \ttoken" used to map job to "\ttoken").
TEST(JobTokensTest, TabsSeparateLikeSpaces) {
  auto t = ParseJobTokens("job-a\ttokA\njob-b \t tokB\r\njob-c\f\vtokC\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->at("job-a"), "tokA");
  EXPECT_EQ(t->at("job-b"), "tokB");
  EXPECT_EQ(t->at("job-c"), "tokC");
  EXPECT_THAT(std::string(ParseJobTokens("job-a tok\textra\n").status().message()),
              HasSubstr("line 1: expected '<job_id> <token>'"));
}

TEST(LogTest, LinesAreLogfmtAndQuoteWhatNeedsIt) {
  const std::string line =
      FormatLogLine(LogLevel::kWarning, "comm", "rank left",
                    {F("rank", 3), F("reason", "said \"bye\"\nnow"), F("empty", "")});
  EXPECT_THAT(line, HasSubstr(" level=warn comp=comm msg=\"rank left\" rank=3 "));
  EXPECT_THAT(line, HasSubstr("reason=\"said \\\"bye\\\"\\nnow\""));
  EXPECT_THAT(line, HasSubstr("empty=\"\""));
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(line.substr(0, 3), "ts=");
  LogLevel l;
  EXPECT_TRUE(ParseLogLevel("debug", &l));
  EXPECT_EQ(l, LogLevel::kDebug);
  EXPECT_FALSE(ParseLogLevel("loud", &l));
}

TEST(DeadlineTimerTest, RunsInDeadlineOrderAndHonoursCancel) {
  DeadlineTimer timer;
  std::vector<int> order;
  absl::Mutex mu;
  absl::Notification done;
  const absl::Time now = absl::Now();
  timer.Schedule(now + absl::Milliseconds(60), [&] {
    absl::MutexLock l(&mu);
    order.push_back(3);
    done.Notify();
  });
  timer.Schedule(now + absl::Milliseconds(20), [&] {
    absl::MutexLock l(&mu);
    order.push_back(1);
  });
  auto cancelled = timer.Schedule(now + absl::Milliseconds(30), [&] {
    absl::MutexLock l(&mu);
    order.push_back(99);
  });
  timer.Schedule(now + absl::Milliseconds(40), [&] {
    absl::MutexLock l(&mu);
    order.push_back(2);
  });
  timer.Cancel(cancelled);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  absl::MutexLock l(&mu);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_GE(absl::Now() - now, absl::Milliseconds(60));
}

TEST(DeadlineTimerTest, AnEarlierDeadlineWakesTheSleepingThread) {
  DeadlineTimer timer;
  timer.Schedule(absl::Now() + absl::Hours(1), [] {});
  absl::Notification fired;
  const absl::Time start = absl::Now();
  timer.Schedule(start + absl::Milliseconds(10), [&] { fired.Notify(); });
  ASSERT_TRUE(fired.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// Every collective schedules its timeout and cancels it when it completes. Those pairs must not
// wake the timer thread (they used to, twice per operation: a futex wake on the submitting thread
// and a context switch each), while an earlier deadline still does.
TEST(DeadlineTimerTest, ScheduleAndCancelOfLaterDeadlinesDoNotWakeTheThread) {
  DeadlineTimer timer;
  const absl::Time start = absl::Now();
  auto first = timer.Schedule(start + absl::Hours(1), [] {});
  // Let the thread settle asleep until that deadline: its wake-up count stays put for 100 ms.
  uint64_t settled = timer.Wakeups();
  for (int i = 0; i < 50; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    const uint64_t now = timer.Wakeups();
    if (now == settled) break;
    settled = now;
  }
  timer.Cancel(first);  // the set is empty now: still no wake-up
  for (int i = 0; i < 50; ++i) {
    auto id = timer.Schedule(start + absl::Hours(2) + absl::Seconds(i), [] {});
    absl::SleepFor(absl::Milliseconds(1));
    timer.Cancel(id);
    absl::SleepFor(absl::Milliseconds(1));
  }
  absl::SleepFor(absl::Milliseconds(20));
  // The timer that woke on every Cancel that emptied the set and on the Schedule after it woke
  // ~100 times here; one is allowed for a thread that had not settled yet.
  EXPECT_LE(timer.Wakeups() - settled, 1u);
  // An earlier deadline than the one it sleeps until still wakes it, and runs on time.
  const uint64_t before = timer.Wakeups();
  absl::Notification fired;
  timer.Schedule(absl::Now() + absl::Milliseconds(10), [&] { fired.Notify(); });
  ASSERT_TRUE(fired.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_GT(timer.Wakeups(), before);
}

// The CI's ASan run caught a bootstrap's deadline running on the timer thread while the daemon
// destroyed the bootstrap: Cancel does not wait for a running callback, Stop does.
TEST(DeadlineTimerTest, StopWaitsForTheRunningCallbackAndDropsTheRest) {
  DeadlineTimer timer;
  absl::Notification running;
  std::atomic<bool> finished{false};
  std::atomic<int> dropped_ran{0};
  timer.Schedule(absl::Now(), [&] {
    running.Notify();
    absl::SleepFor(absl::Milliseconds(200));
    finished = true;
  });
  timer.Schedule(absl::Now() + absl::Milliseconds(300), [&] { ++dropped_ran; });
  ASSERT_TRUE(running.WaitForNotificationWithTimeout(absl::Seconds(5)));
  timer.Stop();
  EXPECT_TRUE(finished);  // Stop returned only after the running callback did
  timer.Schedule(absl::Now(), [&] { ++dropped_ran; });  // after Stop: dropped
  timer.Stop();                                         // idempotent
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_EQ(dropped_ran, 0);
}

}  // namespace
}  // namespace railyard
