// The pacing of a spinning waiter's yields (proto/railyard/v1/spin_yield.h): yields that keep
// losing the core for milliseconds (busy neighbours) stop for a while; short ones, and a core
// lost now and then, never stop them.
#include "proto/railyard/v1/spin_yield.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace railyard::ringproto {
namespace {

constexpr int64_t kUs = 1000;
constexpr int64_t kMs = 1000 * kUs;

TEST(YieldPacerTest, ShortYieldsNeverStopYielding) {
  YieldPacer p;
  int64_t t = 5 * kMs;
  // A second of back-to-back yields of up to 240 us each: another rank, the daemon's ring thread.
  for (int i = 0; i < 5000; ++i) {
    ASSERT_TRUE(p.ShouldYield(t));
    const int64_t took = (i % 2 == 0) ? 240 * kUs : 3 * kUs;
    EXPECT_FALSE(p.Yielded(t, t + took));
    t += took + 10 * kUs;
  }
  EXPECT_TRUE(p.ShouldYield(t));
}

TEST(YieldPacerTest, YieldsToThreadsThatDoTheWaitersWorkNeverStopYielding) {
  YieldPacer p;
  int64_t t = 5 * kMs;
  // Two daemons and their ranks on two cores: a rank's yields go to the daemon threads that run
  // its operations, 0.25-2 ms at a time, and make up about half its wait. Sleeping instead would
  // add a futex wake per operation, so these never count (a quiet period at 250 us measured 8 B
  // AllReduces across the daemons 25 % slower).
  for (int i = 0; i < 2000; ++i) {
    ASSERT_TRUE(p.ShouldYield(t)) << "yield " << i;
    const int64_t took = 500 * kUs + (i % 4) * 450 * kUs;  // 0.5, 0.95, 1.4, 1.85 ms
    EXPECT_FALSE(p.Yielded(t, t + took));
    t += took + 5 * kUs;
  }
}

TEST(YieldPacerTest, ACoreLostNowAndThenDoesNotStopYielding) {
  YieldPacer p;
  int64_t t = 5 * kMs;
  // A 3 ms yield every 20 ms (the host taking the vCPU away): at most 9 ms of a 50 ms window.
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(p.ShouldYield(t));
    EXPECT_FALSE(p.Yielded(t, t + 3 * kMs)) << "yield " << i;
    t += 20 * kMs;
  }
}

TEST(YieldPacerTest, YieldsThatKeepLosingTheCoreStopForTheQuietTimeThenResume) {
  YieldPacer p;
  int64_t t = 5 * kMs;
  // Busy neighbours: each yield hands the core over for a 3 ms slice. 12.5 ms of a 50 ms window
  // is the limit, so the fifth one (15 ms) starts the quiet time.
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(p.ShouldYield(t));
    EXPECT_FALSE(p.Yielded(t, t + 3 * kMs));
    t += 3 * kMs;
  }
  ASSERT_TRUE(p.ShouldYield(t));
  EXPECT_TRUE(p.Yielded(t, t + 3 * kMs));
  t += 3 * kMs;
  EXPECT_EQ(p.quiet_until_ns(), t + YieldPacer::kQuietNs);
  EXPECT_FALSE(p.ShouldYield(t));
  EXPECT_FALSE(p.ShouldYield(t + YieldPacer::kQuietNs - 1));
  // Then it tries again, counting afresh: one more long yield does not stop it at once.
  t += YieldPacer::kQuietNs;
  ASSERT_TRUE(p.ShouldYield(t));
  EXPECT_FALSE(p.Yielded(t, t + 3 * kMs));
  EXPECT_TRUE(p.ShouldYield(t + 3 * kMs));
}

TEST(YieldPacerTest, LostTimeOlderThanTheWindowDoesNotCount) {
  YieldPacer p;
  int64_t t = 5 * kMs;
  for (int i = 0; i < 4; ++i) {  // 12 ms lost: just under the limit
    EXPECT_FALSE(p.Yielded(t, t + 3 * kMs));
    t += 3 * kMs;
  }
  t += YieldPacer::kWindowNs;  // a quiet spell
  EXPECT_FALSE(p.Yielded(t, t + 3 * kMs));
  EXPECT_TRUE(p.ShouldYield(t + 3 * kMs));
}

}  // namespace
}  // namespace railyard::ringproto
