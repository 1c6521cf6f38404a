// Ring threads shared by the sessions of a job (daemon/session/ring_poller.h), over real rings
// (tests/unit/ring_pair.h): which sessions share a thread, that each still gets exactly its own
// completions, that one session's flood waits at most a pass for another's entry, that a thread
// sleeps on all its doorbells at once and wakes for any, and that stopping sessions ends it.
#include "daemon/session/ring_poller.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/ring_pair.h"

namespace railyard {
namespace {

namespace rp = ringproto;
using ring_testing::Eventually;
using ring_testing::FakeSubmit;
using ring_testing::RingPair;

bool Asleep(RingPair& r) {
  return __atomic_load_n(&r.Word32(rp::kOffDaemonSleeping), __ATOMIC_ACQUIRE) == 1;
}

class RingPollerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RingPoller::CanWaitOnMany()) GTEST_SKIP() << "no futex_waitv here (Linux < 5.16)";
  }
};

TEST_F(RingPollerTest, TheSessionsOfOneJobShareAThreadAndEachGetsExactlyItsCompletions) {
  RingPollers pollers(RingPollers::Mode::kPerJob);
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  std::vector<std::unique_ptr<RingPair>> a, b;
  for (int i = 0; i < 3; ++i) a.push_back(std::make_unique<RingPair>(8, 8, fake, pollers, "a"));
  b.push_back(std::make_unique<RingPair>(8, 8, fake, pollers, "b"));
  EXPECT_EQ(pollers.threads(), 2u);
  // Each session's ids are its own: 1000 * (session + 1) + i. Four submitters at once, each
  // past several laps of its rings.
  std::vector<RingPair*> all = {a[0].get(), a[1].get(), a[2].get(), b[0].get()};
  std::vector<std::thread> submitters;
  for (size_t s = 0; s < all.size(); ++s) {
    submitters.emplace_back([&, s] {
      for (uint64_t i = 1; i <= 50; ++i) {
        const uint64_t id = 1000 * (s + 1) + i;
        ASSERT_TRUE(all[s]->Submit(id).ok());
        ASSERT_TRUE(all[s]->WaitFor(id));
      }
    });
  }
  for (auto& t : submitters) t.join();
  for (size_t s = 0; s < all.size(); ++s) {
    EXPECT_EQ(all[s]->CompletionCount(), 50u);
    for (uint64_t i = 1; i <= 50; ++i) {
      const auto o = all[s]->Get(1000 * (s + 1) + i);
      EXPECT_EQ(o.times, 1);
      EXPECT_TRUE(o.status.ok()) << o.status;
    }
  }
  EXPECT_EQ(fake->seen(), 200u);
}

TEST_F(RingPollerTest, AnotherSessionsEntryWaitsAtMostAPassBehindAFlood) {
  RingPollers pollers(RingPollers::Mode::kPerJob);
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  RingPair flood(512, 512, fake, pollers, "j");
  RingPair other(8, 8, fake, pollers, "j");
  ASSERT_EQ(pollers.threads(), 1u);
  // The thread is held inside the flood's first entry while the flood publishes 300 more and
  // the other session one.
  fake->Close();
  ASSERT_TRUE(flood.Submit(1).ok());
  ASSERT_TRUE(Eventually([&] { return fake->entered() == 1; }));
  for (uint64_t id = 2; id <= 301; ++id) ASSERT_TRUE(flood.Submit(id).ok());
  ASSERT_TRUE(other.Submit(900000).ok());
  fake->Open();
  ASSERT_TRUE(other.WaitFor(900000));
  ASSERT_TRUE(Eventually([&] { return fake->seen() == 302; }));
  size_t at = 0;
  while (at < 302 && fake->seen_at(at).request.request_id() != 900000) ++at;
  // The flood's first pass ends after kPerPass entries; the other session's comes next.
  EXPECT_LE(at, RingPoller::kPerPass);
  EXPECT_GT(at, 0u);
  ASSERT_TRUE(flood.WaitFor(301));
  EXPECT_EQ(flood.CompletionCount(), 301u);
}

TEST_F(RingPollerTest, ASharedThreadSleepsOnAllItsDoorbellsAndWakesForAnyOfThem) {
  RingPollers pollers(RingPollers::Mode::kPerJob);
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  RingPair x(8, 8, fake, pollers, "j"), y(8, 8, fake, pollers, "j");
  ASSERT_TRUE(x.Submit(1).ok());
  ASSERT_TRUE(x.WaitFor(1));
  ASSERT_TRUE(Eventually([&] { return Asleep(x) && Asleep(y); }, std::chrono::seconds(2)));
  const uint64_t wakeups = y.daemon_->stats().wakeups;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LE(y.daemon_->stats().wakeups, wakeups + 1);  // asleep: a 1 s backstop at most
  // Either doorbell wakes it, promptly.
  for (uint64_t id = 2; id <= 5; ++id) {
    RingPair& r = id % 2 == 0 ? y : x;
    ASSERT_TRUE(Eventually([&] { return Asleep(x) && Asleep(y); }, std::chrono::seconds(2)));
    const auto start = ring_testing::Clock::now();
    ASSERT_TRUE(r.Submit(id).ok());
    ASSERT_TRUE(r.WaitFor(id, std::chrono::milliseconds(500)));
    EXPECT_LT(ring_testing::Clock::now() - start, std::chrono::milliseconds(500));
  }
  EXPECT_GT(y.daemon_->stats().wakeups, wakeups);
}

TEST_F(RingPollerTest, StoppingOneSessionLeavesTheOthersServedAndTheLastEndsTheThread) {
  RingPollers pollers(RingPollers::Mode::kPerJob);
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kHold);
  auto x = std::make_unique<RingPair>(8, 8, fake, pollers, "j");
  auto y = std::make_unique<RingPair>(8, 8, fake, pollers, "j");
  ASSERT_TRUE(x->Submit(1).ok());
  ASSERT_TRUE(Eventually([&] { return fake->seen() == 1; }));
  x->daemon_->Stop();  // with an operation in flight
  ASSERT_TRUE(x->Submit(2).ok());
  ASSERT_TRUE(y->Submit(3).ok());
  ASSERT_TRUE(Eventually([&] { return fake->seen() == 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(fake->seen(), 2u);  // y's; nothing more of x's
  EXPECT_EQ(fake->seen_at(1).request.request_id(), 3u);
  fake->CompleteHeld();
  ASSERT_TRUE(y->WaitFor(3));
  EXPECT_FALSE(x->Has(1));  // completed after its session stopped: dropped
  EXPECT_EQ(pollers.threads(), 1u);
  y->daemon_->Stop();
  EXPECT_TRUE(Eventually([&] { return pollers.threads() == 0; }, std::chrono::seconds(2)));
  // A new session of the job gets a new thread.
  RingPair z(8, 8, std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow), pollers, "j");
  EXPECT_EQ(pollers.threads(), 1u);
  ASSERT_TRUE(z.Submit(4).ok());
  ASSERT_TRUE(z.WaitFor(4));
}

TEST_F(RingPollerTest, AJobWithMoreSessionsThanAThreadServesGetsAnotherThread) {
  RingPollers pollers(RingPollers::Mode::kPerJob);
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  std::vector<std::unique_ptr<RingPair>> pairs;
  for (size_t i = 0; i <= RingPoller::kMaxRings; ++i) {
    pairs.push_back(std::make_unique<RingPair>(8, 8, fake, pollers, "big"));
  }
  EXPECT_EQ(pollers.threads(), 2u);
  for (size_t i = 0; i < pairs.size(); ++i) ASSERT_TRUE(pairs[i]->Submit(i + 1).ok());
  for (size_t i = 0; i < pairs.size(); ++i) ASSERT_TRUE(pairs[i]->WaitFor(i + 1));
  EXPECT_EQ(fake->seen(), pairs.size());
}

// A daemon sees job after job; a thread whose sessions have all gone is joined and forgotten
// when the next session opens, whichever job it belonged to.
TEST_F(RingPollerTest, TheThreadsOfJobsThatHaveGoneAreNotKept) {
  for (const auto mode : {RingPollers::Mode::kPerJob, RingPollers::Mode::kPerSession}) {
    RingPollers pollers(mode);
    auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
    for (int j = 0; j < 50; ++j) {
      RingPair r(8, 8, fake, pollers, "job-" + std::to_string(j));
      ASSERT_TRUE(r.Submit(j + 1).ok());
      ASSERT_TRUE(r.WaitFor(j + 1));
      // The threads of the last few jobs may not have noticed yet that their sessions went.
      EXPECT_LE(pollers.held(), 10u) << "job " << j;
    }
    ASSERT_TRUE(Eventually([&] { return pollers.threads() == 0; }, std::chrono::seconds(2)));
    RingPair last(8, 8, fake, pollers, "last");
    EXPECT_EQ(pollers.held(), 1u);
    EXPECT_EQ(pollers.threads(), 1u);
  }
}

TEST_F(RingPollerTest, PerSessionModeGivesEverySessionAThreadOfItsOwn) {
  RingPollers pollers(RingPollers::Mode::kPerSession);
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  RingPair x(8, 8, fake, pollers, "j"), y(8, 8, fake, pollers, "j");
  EXPECT_EQ(pollers.threads(), 2u);
  ASSERT_TRUE(x.Submit(1).ok());
  ASSERT_TRUE(y.Submit(2).ok());
  ASSERT_TRUE(x.WaitFor(1));
  ASSERT_TRUE(y.WaitFor(2));
  x.daemon_->Stop();  // joins its own thread
  EXPECT_EQ(pollers.threads(), 1u);
}

TEST_F(RingPollerTest, StopAllEndsEveryThreadAndTheSessionsStopAfterwards) {
  auto pollers = std::make_unique<RingPollers>(RingPollers::Mode::kPerJob);
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  RingPair x(8, 8, fake, *pollers, "a"), y(8, 8, fake, *pollers, "b");
  ASSERT_TRUE(x.Submit(1).ok());
  ASSERT_TRUE(x.WaitFor(1));
  const auto start = ring_testing::Clock::now();
  pollers->StopAll();
  EXPECT_LT(ring_testing::Clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(pollers->threads(), 0u);
  pollers.reset();
  ASSERT_TRUE(y.Submit(2).ok());  // published, never taken: no thread serves it
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(fake->seen(), 1u);
}

// A session that closes while its rings are being opened (SessionPlane::Close beside
// OpenRings) stops them before they start: they are never served, and no thread starts for them.
TEST_F(RingPollerTest, RingsStoppedBeforeTheyStartAreNeverServedAndStartNoThread) {
  for (auto mode : {RingPollers::Mode::kPerJob, RingPollers::Mode::kPerSession}) {
    for (bool quiesce : {false, true}) {
      SCOPED_TRACE(testing::Message() << "per-session " << (mode == RingPollers::Mode::kPerSession)
                                      << ", quiesce " << quiesce);
      RingPollers pollers(mode);
      auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
      RingPair r(8, 8, fake, RingPair::NotStarted{});
      if (quiesce) {
        r.daemon_->Quiesce();
      } else {
        r.daemon_->Stop();
      }
      r.daemon_->Start(ring_testing::SubmitTo(fake), pollers, "j", nullptr);
      EXPECT_EQ(pollers.held(), 0u);
      EXPECT_EQ(pollers.threads(), 0u);
      ASSERT_TRUE(r.Submit(1).ok());  // published, never taken
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_EQ(fake->seen(), 0u);
      EXPECT_EQ(r.CompletionCount(), 0u);
    }
  }
}

// The same two calls racing: whichever wins, the rings end up unserved, Stop() returns, and no
// thread is left behind. (Run under ThreadSanitizer this is the check that poller_ is not read
// and written at once.)
TEST_F(RingPollerTest, StartRacingStopNeverLeavesAThreadServingStoppedRings) {
  for (auto mode : {RingPollers::Mode::kPerJob, RingPollers::Mode::kPerSession}) {
    SCOPED_TRACE(testing::Message() << "per-session " << (mode == RingPollers::Mode::kPerSession));
    RingPollers pollers(mode);
    auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
    for (int i = 0; i < 100; ++i) {
      RingPair r(8, 8, fake, RingPair::NotStarted{});
      std::atomic<bool> go{false};
      std::thread starter([&] {
        while (!go.load()) {
        }
        r.daemon_->Start(ring_testing::SubmitTo(fake), pollers, "j", nullptr);
      });
      std::thread stopper([&] {
        while (!go.load()) {
        }
        r.daemon_->Stop();
      });
      go = true;
      starter.join();
      stopper.join();
      ASSERT_TRUE(r.Submit(1).ok());
    }
    EXPECT_TRUE(Eventually([&] { return pollers.threads() == 0; }, std::chrono::seconds(2)));
    EXPECT_EQ(fake->seen(), 0u);  // entries published after Stop() are never taken
  }
}

// Sessions of one job come and go from several threads at once while others run: each gets
// exactly its completions, whichever thread (new, shared, or one that just ended for want of
// sessions) ends up serving it, and no thread outlives the last session.
TEST_F(RingPollerTest, SessionsComingAndGoingConcurrentlyAreEachServedExactly) {
  RingPollers pollers(RingPollers::Mode::kPerJob);
  auto fake = std::make_shared<FakeSubmit>(FakeSubmit::Mode::kCompleteNow);
  constexpr int kThreads = 6, kSessions = 40, kOps = 20;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int s = 0; s < kSessions; ++s) {
        RingPair r(8, 8, fake, pollers, t % 2 == 0 ? "even" : "odd");
        for (uint64_t i = 1; i <= kOps; ++i) {
          if (!r.Submit(i).ok() || !r.WaitFor(i, std::chrono::seconds(5))) ++failures;
        }
        if (r.CompletionCount() != kOps) ++failures;
        for (uint64_t i = 1; i <= kOps; ++i) {
          if (r.Get(i).times != 1 || !r.Get(i).status.ok()) ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(fake->seen(), static_cast<size_t>(kThreads * kSessions * kOps));
  EXPECT_TRUE(Eventually([&] { return pollers.threads() == 0; }, std::chrono::seconds(2)));
}

}  // namespace
}  // namespace railyard
