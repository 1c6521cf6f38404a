// CollectiveQueue: the sequence merge of one communicator's collectives across its local ranks.
#include "daemon/comm/collective_queue.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using scheduler::OpKind;
using ::testing::HasSubstr;

std::unique_ptr<PendingRequest> Req(int rank, OpKind op, uint64_t count, uint64_t id = 0) {
  auto p = std::make_unique<PendingRequest>();
  p->request_id = id;
  p->rank = rank;
  p->req.op = op;
  p->req.count = count;
  return p;
}

TEST(CollectiveQueueTest, EachRanksKthCollectiveIsSequenceNumberK) {
  const std::vector<int> ranks = {4, 5};  // global ranks of local indices 0, 1
  CollectiveQueue q(&ranks);
  CollectiveQueue::Added a;
  // Rank 4 runs two ahead of rank 5.
  ASSERT_TRUE(q.Add(0, Req(4, OpKind::kAllReduce, 8), &a).ok());
  EXPECT_EQ(a.seq, 0u);
  EXPECT_TRUE(a.first);
  EXPECT_FALSE(a.complete);
  ASSERT_TRUE(q.Add(0, Req(4, OpKind::kBroadcast, 16), &a).ok());
  EXPECT_EQ(a.seq, 1u);
  EXPECT_EQ(q.size(), 2u);
  EXPECT_FALSE(q.front_complete());
  ASSERT_TRUE(q.Add(1, Req(5, OpKind::kAllReduce, 8), &a).ok());
  EXPECT_EQ(a.seq, 0u);
  EXPECT_FALSE(a.first);
  EXPECT_TRUE(a.complete);
  EXPECT_TRUE(q.front_complete());
  EXPECT_EQ(q.front_seq(), 0u);
  ASSERT_NE(q.front().requests[0], nullptr);
  EXPECT_EQ(q.front().requests[1]->rank, 5);
  q.PopFront();
  EXPECT_EQ(q.front_seq(), 1u);
  EXPECT_FALSE(q.front_complete());
  EXPECT_EQ(q.Find(0), nullptr);  // ran already
  EXPECT_NE(q.Find(1), nullptr);
  EXPECT_EQ(q.Find(2), nullptr);  // nobody submitted it
}

TEST(CollectiveQueueTest, ADisagreementIsRefusedNamingTheRanksAndDoesNotAdvance) {
  const std::vector<int> ranks = {0, 1};
  CollectiveQueue q(&ranks);
  CollectiveQueue::Added a;
  ASSERT_TRUE(q.Add(0, Req(0, OpKind::kAllReduce, 8), &a).ok());
  absl::Status s = q.Add(1, Req(1, OpKind::kAllGather, 8), &a);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rank 1"));
  EXPECT_EQ(a.seq, 0u);
  // The same rank's next try is still for sequence number 0.
  ASSERT_TRUE(q.Add(1, Req(1, OpKind::kAllReduce, 8), &a).ok());
  EXPECT_EQ(a.seq, 0u);
  EXPECT_TRUE(a.complete);
}

TEST(CollectiveQueueTest, DrainKeepsTheRunningEntryAndReturnsTheRestWithTheirSeqs) {
  const std::vector<int> ranks = {0, 1};
  CollectiveQueue q(&ranks);
  CollectiveQueue::Added a;
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(q.Add(0, Req(0, OpKind::kBarrier, 0, 10 + k), &a).ok());
  ASSERT_TRUE(q.Add(1, Req(1, OpKind::kBarrier, 0, 20), &a).ok());
  q.front().timer = 7;
  q.Find(1)->timer = 8;
  CollectiveQueue::Drained d = q.DrainFrom(1);
  EXPECT_EQ(d.entries, 2u);
  ASSERT_EQ(d.requests.size(), 2u);
  EXPECT_EQ(d.requests[0].first, 1u);
  EXPECT_EQ(d.requests[0].second->request_id, 11u);
  EXPECT_EQ(d.requests[1].first, 2u);
  EXPECT_EQ(d.timers, std::vector<DeadlineTimer::Id>({8, 0}));
  EXPECT_EQ(q.size(), 1u);
  EXPECT_TRUE(q.front_complete());
  d = q.DrainFrom(0);
  EXPECT_EQ(d.requests.size(), 2u);  // both ranks' seq 0
  EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace railyard
