// When the ring waiters spin (proto/railyard/v1/ring_futex.h, SpinPolicy): after a few spins in a
// row run out they pause, for longer while they keep running out, and spins that pay bring the
// pause back down. Driven with explicit clock values: nothing here sleeps.
#include <cstdint>

#include "gtest/gtest.h"
#include "proto/railyard/v1/ring_futex.h"

namespace railyard::ringproto {
namespace {

constexpr int64_t kMs = 1000000;

TEST(SpinPolicyTest, SpinsThatRunOutPauseSpinningForLongerEachTime) {
  SpinPolicy p;
  int64_t now = 1000 * kMs;
  for (int i = 0; i < SpinPolicy::kFailures - 1; ++i) {
    p.Report(false, now);
    EXPECT_TRUE(p.Allowed(now)) << "after " << i + 1 << " spins ran out";
  }
  p.Report(false, now);
  EXPECT_EQ(p.pauses(), 1u);
  EXPECT_FALSE(p.Allowed(now));
  EXPECT_FALSE(p.Allowed(now + 49 * kMs));
  EXPECT_TRUE(p.Allowed(now + 50 * kMs));
  // One spin decides after a pause: running out pauses again at once, twice as long.
  now += 50 * kMs;
  p.Report(false, now);
  EXPECT_EQ(p.pauses(), 2u);
  EXPECT_FALSE(p.Allowed(now + 99 * kMs));
  EXPECT_TRUE(p.Allowed(now + 100 * kMs));
  // Doubling stops at 400 ms.
  for (int i = 0; i < 10; ++i) {
    now += 2000 * kMs;
    p.Report(false, now);
  }
  EXPECT_FALSE(p.Allowed(now + 399 * kMs));
  EXPECT_TRUE(p.Allowed(now + 400 * kMs));
}

TEST(SpinPolicyTest, ASpinThatPaysStartsTheCountAfreshAndManyBringThePauseBackDown) {
  SpinPolicy p;
  int64_t now = 1000 * kMs;
  // Runs of fewer failures than kFailures, each ended by a spin that paid: never a pause.
  for (int run = 0; run < 10; ++run) {
    for (int i = 0; i < SpinPolicy::kFailures - 1; ++i) p.Report(false, now);
    p.Report(true, now);
  }
  EXPECT_EQ(p.pauses(), 0u);
  EXPECT_TRUE(p.Allowed(now));
  // Two pauses (50 ms, then 100 ms) ...
  for (int i = 0; i < SpinPolicy::kFailures; ++i) p.Report(false, now);
  now += 50 * kMs;
  p.Report(false, now);
  now += 100 * kMs;
  ASSERT_EQ(p.pauses(), 2u);
  // ... then spins pay again: after kSettled of them the next pause is 50 ms again.
  for (int i = 0; i < SpinPolicy::kSettled; ++i) p.Report(true, now);
  for (int i = 0; i < SpinPolicy::kFailures; ++i) p.Report(false, now);
  EXPECT_EQ(p.pauses(), 3u);
  EXPECT_FALSE(p.Allowed(now + 49 * kMs));
  EXPECT_TRUE(p.Allowed(now + 50 * kMs));
}

}  // namespace
}  // namespace railyard::ringproto
