// FindStalledRail: a transfer older than the timeout whose rail delivered nothing from its peer
// for as long is a suspect (the peer's view decides, rail_check_test); a rail that delivered
// within the timeout, or a transfer younger than it, is not.
#include "daemon/scheduler/rail_stall.h"

#include <gtest/gtest.h>

namespace railyard::scheduler {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

RunProgress::Transfer Pending(uint32_t step, bool send, int peer, int rail, Clock::time_point at) {
  RunProgress::Transfer t;
  t.step = step;
  t.send = send;
  t.peer = peer;
  t.rail = rail;
  t.issued = at;
  return t;
}

class RailStallTest : public ::testing::Test {
 protected:
  const Clock::time_point t0_ = Clock::now();
  const Clock::time_point now_ = t0_ + seconds(12);
};

TEST_F(RailStallTest, ARailSilentWhileAnotherFromTheSamePeerDeliversIsStalled) {
  RunProgress p;
  p.transfers = {Pending(7, false, 1, 1, t0_)};
  p.received = {{1, 0, t0_ + milliseconds(3)}};
  const auto s = FindStalledRail(p, now_, seconds(10));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->peer, 1);
  EXPECT_EQ(s->rail, 1);
  EXPECT_EQ(s->step, 7u);
  EXPECT_FALSE(s->send);
  EXPECT_EQ(s->waited, seconds(12));
  EXPECT_EQ(s->other_rail, 0);
  EXPECT_EQ(s->other_ago, seconds(12) - milliseconds(3));
}

TEST_F(RailStallTest, NothingBeforeTheTimeoutOrWithATimeoutOfZero) {
  RunProgress p;
  p.transfers = {Pending(7, false, 1, 1, t0_)};
  p.received = {{1, 0, t0_ + milliseconds(3)}};
  EXPECT_FALSE(FindStalledRail(p, t0_ + seconds(9), seconds(10)).has_value());
  EXPECT_TRUE(FindStalledRail(p, t0_ + seconds(10), seconds(10)).has_value());
  EXPECT_FALSE(FindStalledRail(p, now_, Clock::duration::zero()).has_value());
  EXPECT_FALSE(FindStalledRail(p, now_, -seconds(1)).has_value());
}

TEST_F(RailStallTest, APeerSilentOnEveryRailIsASuspectWithoutEvidence) {
  RunProgress p;
  p.transfers = {Pending(1, false, 1, 0, t0_), Pending(2, false, 1, 1, t0_ + milliseconds(1))};
  // What arrived from the peer arrived before these were posted: it has been silent since.
  p.received = {{1, 0, t0_ - milliseconds(1)}, {1, 1, t0_ - milliseconds(2)}};
  auto s = FindStalledRail(p, now_, seconds(10));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rail, 0);  // the older
  EXPECT_EQ(s->other_rail, -1);
  p.received.clear();
  EXPECT_TRUE(FindStalledRail(p, now_, seconds(10)).has_value());
}

TEST_F(RailStallTest, ARailThatDeliveredWithinTheTimeoutIsNotStalled) {
  RunProgress p;
  p.transfers = {Pending(7, false, 1, 1, t0_)};
  p.received = {{1, 0, t0_ + seconds(11)}, {1, 1, t0_ + seconds(3)}};
  EXPECT_FALSE(FindStalledRail(p, now_, seconds(10)).has_value());  // 9 s ago
  // Delivered after the transfer was posted, then nothing for 11 s: the link went down
  // half-way through the operation.
  p.received[1].last = t0_ + seconds(1);
  const auto s = FindStalledRail(p, now_, seconds(10));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->rail, 1);
  EXPECT_EQ(s->other_rail, 0);
  EXPECT_EQ(s->other_ago, seconds(1));
}

TEST_F(RailStallTest, OnlyTheSamePeersRailsCount) {
  RunProgress p;
  p.transfers = {Pending(7, true, 1, 1, t0_)};
  p.received = {{2, 0, t0_ + seconds(1)}, {2, 1, t0_ + seconds(1)}};
  EXPECT_EQ(FindStalledRail(p, now_, seconds(10))->other_rail, -1);
  p.received.push_back({1, 2, t0_ + seconds(2)});
  const auto s = FindStalledRail(p, now_, seconds(10));
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->send);
  EXPECT_EQ(s->other_rail, 2);
  EXPECT_EQ(s->other_ago, seconds(10));
}

// UCX reports a message only once all of it arrived: large messages in flight on a rail get
// their bytes' time at kRailStallMinBytesPerSecond (1 MiB/s) on top of the timeout.
TEST_F(RailStallTest, PendingBytesOnTheRailExtendTheTimeout) {
  RunProgress p;
  p.transfers = {Pending(7, false, 1, 1, t0_), Pending(8, false, 1, 1, t0_)};
  p.transfers[0].bytes = 2 << 20;  // 2 s at 1 MiB/s
  p.transfers[1].bytes = 1 << 20;  // 1 s
  p.received = {{1, 0, t0_ + seconds(1)}};
  EXPECT_FALSE(FindStalledRail(p, t0_ + milliseconds(12900), seconds(10)).has_value());
  EXPECT_TRUE(FindStalledRail(p, t0_ + seconds(13), seconds(10)).has_value());
  // Bytes pending to another peer or on another rail do not count.
  p.transfers[1].rail = 0;
  EXPECT_TRUE(FindStalledRail(p, t0_ + seconds(12), seconds(10)).has_value());
}

TEST_F(RailStallTest, TheOldestStalledTransferIsNamed) {
  RunProgress p;
  p.transfers = {Pending(3, false, 2, 1, t0_ + seconds(1)), Pending(9, false, 1, 0, t0_),
                 Pending(4, false, 2, 0, t0_ + milliseconds(500))};
  // Rail 1 to node 2 and rail 0 to node 1 are stalled (rail 0 to node 2 delivered 9 s ago):
  // the one waiting longer is named.
  p.received = {
      {1, 1, t0_ + seconds(1)}, {2, 0, t0_ + seconds(3)}, {2, 1, t0_ + milliseconds(500)}};
  const auto s = FindStalledRail(p, now_, seconds(10));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->peer, 1);
  EXPECT_EQ(s->rail, 0);
  EXPECT_EQ(s->step, 9u);
  EXPECT_EQ(s->other_rail, 1);
}

}  // namespace
}  // namespace railyard::scheduler
