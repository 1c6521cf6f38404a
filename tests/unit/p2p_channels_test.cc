// P2PChannels: FIFO pairing of sends and receives per (src, dst), and numbering of remote posts.
#include "daemon/comm/p2p_channels.h"

#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<PendingRequest> Side(uint64_t id, uint64_t count,
                                     kernels::DataType dtype = kernels::DataType::kFloat32) {
  auto p = std::make_unique<PendingRequest>();
  p->request_id = id;
  p->req.count = count;
  p->req.dtype = dtype;
  return p;
}

TEST(P2PChannelsTest, TheNthSendPairsWithTheNthReceiveOneCopyAtATime) {
  P2PChannels ch("c");
  const P2PChannels::Key k{0, 1};
  EXPECT_EQ(ch.Queue(k, /*is_send=*/true, Side(1, 10), 101), 0u);
  EXPECT_EQ(ch.Queue(k, true, Side(2, 20), 102), 1u);
  auto none = ch.Next(k);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());  // no receive yet
  EXPECT_EQ(ch.Queue(k, /*is_send=*/false, Side(11, 10), 111), 0u);
  EXPECT_EQ(ch.Queue(k, false, Side(12, 20), 112), 1u);
  EXPECT_EQ(ch.queued(), 4u);
  auto first = ch.Next(k);
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ((*first)->send->request_id, 1u);
  EXPECT_EQ((*first)->recv->request_id, 11u);
  EXPECT_EQ((*first)->seq, 0u);
  EXPECT_EQ((*first)->send_timer, 101u);
  EXPECT_EQ((*first)->recv_timer, 111u);
  EXPECT_EQ(ch.busy(), 1u);
  auto blocked = ch.Next(k);  // the channel copies one pair at a time
  ASSERT_TRUE(blocked.ok());
  EXPECT_FALSE(blocked->has_value());
  ch.Done(k);
  auto second = ch.Next(k);
  ASSERT_TRUE(second.ok() && second->has_value());
  EXPECT_EQ((*second)->send->request_id, 2u);
  EXPECT_EQ((*second)->seq, 1u);
  // Another direction is another channel.
  EXPECT_EQ(ch.Queue({1, 0}, true, Side(3, 1), 0), 0u);
}

TEST(P2PChannelsTest, AMismatchNamesBothRanksAndShapes) {
  P2PChannels ch("comm-x");
  ch.Queue({2, 3}, true, Side(1, 10), 0);
  ch.Queue({2, 3}, false, Side(2, 12, kernels::DataType::kFloat64), 0);
  auto next = ch.Next({2, 3});
  EXPECT_EQ(next.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(next.status().message(),
              HasSubstr("rank 2 sends 10 x float to rank 3, which receives 12 x double"));
  EXPECT_THAT(next.status().message(), HasSubstr("comm-x"));
  P2PChannels::Drained d = ch.DrainAll();  // the abort fails both
  EXPECT_EQ(d.requests.size(), 2u);
  EXPECT_EQ(ch.queued(), 0u);
}

TEST(P2PChannelsTest, RemotePostsAreNumberedInOrderAndBounded) {
  P2PChannels ch("c");
  const P2PChannels::Key k{0, 5};
  for (uint64_t i = 0; i < 3; ++i) {
    auto seq = ch.PostRemote(k, 3);
    ASSERT_TRUE(seq.ok());
    EXPECT_EQ(*seq, i);
  }
  auto over = ch.PostRemote(k, 3);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  ch.RemoteDone(k);
  auto again = ch.PostRemote(k, 3);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 3u);
}

TEST(P2PChannelsTest, DrainReturnsSequenceNumbersAndTimers) {
  P2PChannels ch("c");
  ch.Queue({0, 1}, true, Side(1, 1), 7);
  ch.Queue({0, 1}, true, Side(2, 1), 8);
  ch.Queue({1, 0}, false, Side(3, 1), 9);
  P2PChannels::Drained d = ch.DrainAll();
  ASSERT_EQ(d.requests.size(), 3u);
  EXPECT_EQ(d.requests[0].first, 0u);
  EXPECT_EQ(d.requests[1].first, 1u);
  EXPECT_EQ(d.timers.size(), 3u);
  EXPECT_EQ(ch.Front({0, 1}, true), nullptr);
}

}  // namespace
}  // namespace railyard
