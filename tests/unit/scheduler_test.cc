// Merge, validation and local plans: plans executed over real per-rank memory must produce the
// collective's definition for every op, 1..7 ranks, odd counts, in place and out of place.
#include <numeric>

#include "absl/synchronization/notification.h"
#include "daemon/scheduler/executor.h"
#include "daemon/scheduler/local_plan.h"
#include "daemon/scheduler/merge.h"
#include "daemon/scheduler/op.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard::scheduler {
namespace {

using kernels::DataType;
using kernels::RedOp;
using ::testing::HasSubstr;

int32_t In(int rank, uint64_t k) { return static_cast<int32_t>(rank * 1000 + k % 997); }

struct Rank {
  std::vector<int32_t> mem;  // send region at 0, recv region at `half`
  RankRequest req;
};

// Builds requests for op over n ranks with count c (int32 sum), runs the plan with chunk_bytes,
// and returns the ranks for checking.
std::vector<Rank> RunOp(OpKind op, int n, uint64_t c, bool in_place, int root, size_t chunk_bytes,
                        Executor* exec = nullptr) {
  std::vector<Rank> ranks(n);
  const uint64_t half = static_cast<uint64_t>(n) * (c + 8) + 16;
  for (int r = 0; r < n; ++r) {
    Rank& rk = ranks[r];
    rk.mem.assign(2 * half, -7);
    RankRequest& q = rk.req;
    q.op = op;
    q.dtype = DataType::kInt32;
    q.red_op = RedOp::kSum;
    q.count = c;
    q.root = root;
    auto* base = reinterpret_cast<std::byte*>(rk.mem.data());
    q.send = base;
    q.recv = base + half * 4;
    uint64_t send_elems = c;
    if (op == OpKind::kReduceScatter || op == OpKind::kAllToAll) send_elems = n * c;
    if (op == OpKind::kAllToAllv) {
      uint64_t pos = 0;
      for (int j = 0; j < n; ++j) {
        const uint64_t cnt = (r + j + c) % 3 + c / 4;  // symmetric in (r, j)
        q.send_counts.push_back(cnt);
        q.send_displs.push_back(pos);
        pos += cnt + 1;
      }
      q.recv_counts = q.send_counts;
      q.recv_displs = q.send_displs;
      send_elems = pos;
    }
    if (in_place) {
      if (op == OpKind::kReduceScatter) {
        q.recv = q.send + r * c * 4;
      } else if (op == OpKind::kAllGather) {
        q.send = q.recv + r * c * 4;
      } else {
        q.send = q.recv;
      }
    }
    auto* s = reinterpret_cast<int32_t*>(q.send);
    for (uint64_t k = 0; k < send_elems; ++k) s[k] = In(r, k);
  }
  std::vector<const RankRequest*> reqs;
  for (auto& rk : ranks) reqs.push_back(&rk.req);
  LocalPlan plan;
  BuildLocalPlan(reqs, chunk_bytes, &plan);
  if (exec == nullptr) {
    for (size_t i = 0; i < plan.steps.size(); ++i) RunStep(plan, i);
  } else {
    Execution e;
    e.plan = plan;
    absl::Notification done;
    e.on_done = [&] { done.Notify(); };
    exec->Run(&e);
    done.WaitForNotification();
  }
  return ranks;
}

const int32_t* Recv(const Rank& r) { return reinterpret_cast<const int32_t*>(r.req.recv); }

class PlanTest : public ::testing::TestWithParam<std::tuple<int, uint64_t, bool>> {};

TEST_P(PlanTest, EveryOpMatchesItsDefinition) {
  const auto [n, c, in_place] = GetParam();
  const size_t chunk = 64;  // tiny chunks: many steps, boundaries everywhere
  const int root = n - 1;
  {
    auto ranks = RunOp(OpKind::kAllReduce, n, c, in_place, 0, chunk);
    for (int r = 0; r < n; ++r) {
      for (uint64_t k = 0; k < c; ++k) {
        int32_t want = 0;
        for (int j = 0; j < n; ++j) want += In(j, k);
        ASSERT_EQ(Recv(ranks[r])[k], want) << "allreduce rank " << r << " k " << k;
      }
    }
  }
  {
    auto ranks = RunOp(OpKind::kReduce, n, c, in_place, root, chunk);
    for (uint64_t k = 0; k < c; ++k) {
      int32_t want = 0;
      for (int j = 0; j < n; ++j) want += In(j, k);
      ASSERT_EQ(Recv(ranks[root])[k], want) << "reduce k " << k;
    }
  }
  {
    auto ranks = RunOp(OpKind::kReduceScatter, n, c, in_place, 0, chunk);
    for (int r = 0; r < n; ++r) {
      for (uint64_t k = 0; k < c; ++k) {
        int32_t want = 0;
        for (int j = 0; j < n; ++j) want += In(j, r * c + k);
        ASSERT_EQ(Recv(ranks[r])[k], want) << "reducescatter rank " << r << " k " << k;
      }
    }
  }
  {
    auto ranks = RunOp(OpKind::kAllGather, n, c, in_place, 0, chunk);
    for (int r = 0; r < n; ++r) {
      for (int j = 0; j < n; ++j) {
        for (uint64_t k = 0; k < c; ++k) {
          ASSERT_EQ(Recv(ranks[r])[j * c + k], In(j, k)) << "allgather " << r << "," << j;
        }
      }
    }
  }
  {
    auto ranks = RunOp(OpKind::kBroadcast, n, c, in_place, root, chunk);
    for (int r = 0; r < n; ++r) {
      for (uint64_t k = 0; k < c; ++k) ASSERT_EQ(Recv(ranks[r])[k], In(root, k));
    }
  }
  {
    auto ranks = RunOp(OpKind::kAllToAll, n, c, in_place, 0, chunk);
    for (int r = 0; r < n; ++r) {
      for (int j = 0; j < n; ++j) {
        for (uint64_t k = 0; k < c; ++k) {
          ASSERT_EQ(Recv(ranks[r])[j * c + k], In(j, r * c + k)) << "alltoall " << r << "," << j;
        }
      }
    }
  }
  {
    auto ranks = RunOp(OpKind::kAllToAllv, n, c, in_place, 0, chunk);
    for (int r = 0; r < n; ++r) {
      const RankRequest& q = ranks[r].req;
      for (int j = 0; j < n; ++j) {
        const RankRequest& pj = ranks[j].req;
        for (uint64_t k = 0; k < q.recv_counts[j]; ++k) {
          ASSERT_EQ(Recv(ranks[r])[q.recv_displs[j] + k], In(j, pj.send_displs[r] + k))
              << "alltoallv " << r << "<-" << j;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PlanTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 7),
                                            ::testing::Values(0, 1, 5, 33, 1001),
                                            ::testing::Bool()));

TEST(PlanTest, MixedInPlaceAllToAllReadsBeforeItWrites) {
  // Rank 0 in place, rank 1 not: rank 0's outgoing block must be read before its incoming one
  // overwrites it.
  const uint64_t c = 37;
  std::vector<int32_t> m0(2 * c), s1(2 * c), r1(2 * c, -1);
  for (uint64_t k = 0; k < 2 * c; ++k) {
    m0[k] = In(0, k);
    s1[k] = In(1, k);
  }
  RankRequest a, b;
  for (RankRequest* q : {&a, &b}) {
    q->op = OpKind::kAllToAll;
    q->dtype = DataType::kInt32;
    q->count = c;
  }
  a.send = a.recv = reinterpret_cast<std::byte*>(m0.data());
  b.send = reinterpret_cast<std::byte*>(s1.data());
  b.recv = reinterpret_cast<std::byte*>(r1.data());
  LocalPlan plan;
  BuildLocalPlan({&a, &b}, 16, &plan);
  for (size_t i = 0; i < plan.steps.size(); ++i) RunStep(plan, i);
  for (uint64_t k = 0; k < c; ++k) {
    EXPECT_EQ(m0[k], In(0, k));
    EXPECT_EQ(m0[c + k], In(1, k));
    EXPECT_EQ(r1[k], In(0, c + k));
    EXPECT_EQ(r1[c + k], In(1, c + k));
  }
}

TEST(PlanTest, PlansAreReusedWithoutGrowing) {
  LocalPlan plan;
  std::vector<int32_t> a(4096), b(4096);
  RankRequest q;
  q.op = OpKind::kAllReduce;
  q.dtype = DataType::kInt32;
  q.count = 4096;
  q.send = reinterpret_cast<std::byte*>(a.data());
  q.recv = reinterpret_cast<std::byte*>(b.data());
  BuildLocalPlan({&q}, 1024, &plan);
  const size_t steps_cap = plan.steps.capacity();
  const size_t ptrs_cap = plan.ptrs.capacity();
  EXPECT_EQ(plan.steps.size(), 16u);
  EXPECT_EQ(plan.bytes_moved, 4096u * 4);
  for (int i = 0; i < 10; ++i) BuildLocalPlan({&q}, 1024, &plan);
  EXPECT_EQ(plan.steps.capacity(), steps_cap);
  EXPECT_EQ(plan.ptrs.capacity(), ptrs_cap);
}

TEST(ExecutorTest, RunsLargePlansOnAllWorkers) {
  Executor exec(3);
  auto ranks = RunOp(OpKind::kAllReduce, 4, 100001, false, 0, 4096, &exec);
  for (uint64_t k = 0; k < 100001; k += 997) {
    int32_t want = 0;
    for (int j = 0; j < 4; ++j) want += In(j, k);
    ASSERT_EQ(Recv(ranks[2])[k], want);
  }
  // An empty plan completes inline.
  Execution e;
  bool done = false;
  e.on_done = [&] { done = true; };
  exec.Run(&e);
  EXPECT_TRUE(done);
}

RankRequest Req(OpKind op, uint64_t count = 8) {
  RankRequest r;
  r.op = op;
  r.count = count;
  return r;
}

TEST(MergeTest, AgreementIsCheckedFieldByField) {
  OpMerge m(3);
  RankRequest a = Req(OpKind::kAllReduce);
  RankRequest b = Req(OpKind::kAllReduce, 9);
  ASSERT_TRUE(m.Add(1, &a).ok());
  absl::Status s = m.Add(2, &b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("disagree on count: rank 1 submitted 8, rank 2 submitted 9"));
  EXPECT_EQ(m.arrived(), 1);
  EXPECT_EQ(m.MissingRanks(), (std::vector<int>{0, 2}));
  EXPECT_EQ(m.Add(1, &a).code(), absl::StatusCode::kFailedPrecondition);
  RankRequest c = a;
  c.algo = "ring";
  EXPECT_THAT(std::string(m.Add(0, &c).message()), HasSubstr("algo"));
  RankRequest d = a;
  d.red_op = RedOp::kMax;
  EXPECT_THAT(std::string(m.Add(0, &d).message()), HasSubstr("red_op"));
  ASSERT_TRUE(m.Add(0, &a).ok());
  ASSERT_TRUE(m.Add(2, &a).ok());
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(m.CheckComplete().ok());
  // Barriers agree on nothing but the op.
  OpMerge bar(2);
  RankRequest b1 = Req(OpKind::kBarrier, 1), b2 = Req(OpKind::kBarrier, 2);
  ASSERT_TRUE(bar.Add(0, &b1).ok());
  ASSERT_TRUE(bar.Add(1, &b2).ok());
}

TEST(MergeTest, AllToAllvCountsMustBeSymmetricAcrossRanks) {
  OpMerge m(2);
  RankRequest a = Req(OpKind::kAllToAllv), b = Req(OpKind::kAllToAllv);
  a.send_counts = {1, 2};
  a.recv_counts = {1, 3};
  b.send_counts = {4, 5};  // rank 1 sends 4 to rank 0, which expects 3
  b.recv_counts = {2, 5};
  ASSERT_TRUE(m.Add(0, &a).ok());
  ASSERT_TRUE(m.Add(1, &b).ok());
  absl::Status s = m.CheckComplete();
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("rank 1 sends 4 elements to rank 0, which expects 3"));
}

TEST(ExtentsTest, RegionsFollowNcclCounts) {
  RankRequest r = Req(OpKind::kReduceScatter, 10);
  auto e = ComputeExtents(r, 1, 4);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->send_bytes, 160u);
  EXPECT_EQ(e->recv_bytes, 40u);
  r = Req(OpKind::kAllGather, 10);
  e = ComputeExtents(r, 1, 4);
  EXPECT_EQ(e->send_bytes, 40u);
  EXPECT_EQ(e->recv_bytes, 160u);
  r = Req(OpKind::kBroadcast, 10);
  r.root = 2;
  e = ComputeExtents(r, 1, 4);
  EXPECT_FALSE(e->needs_send);
  EXPECT_TRUE(e->needs_recv);
  r = Req(OpKind::kReduce, 10);
  r.root = 2;
  e = ComputeExtents(r, 1, 4);
  EXPECT_TRUE(e->needs_send);
  EXPECT_FALSE(e->needs_recv);
  r = Req(OpKind::kAllToAllv);
  r.send_counts = {1, 2};
  r.send_displs = {10, 0};
  r.recv_counts = {0, 0};
  r.recv_displs = {0, 0};
  e = ComputeExtents(r, 0, 2);
  EXPECT_EQ(e->send_bytes, 44u);
  EXPECT_EQ(e->recv_bytes, 0u);
  r = Req(OpKind::kBroadcast);
  r.root = 5;
  EXPECT_THAT(std::string(ComputeExtents(r, 0, 4).status().message()),
              HasSubstr("root 5 not in [0, 4)"));
  r = Req(OpKind::kAllReduce, uint64_t{1} << 50);
  EXPECT_EQ(ComputeExtents(r, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  r = Req(OpKind::kAllToAll, uint64_t{1} << 40);
  EXPECT_EQ(ComputeExtents(r, 0, 1024).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ExtentsTest, SizesThatOverflow64BitsNameTheFieldAndTheExcess) {
  auto message = [](const RankRequest& r, int rank, int nranks) {
    absl::StatusOr<Extents> e = ComputeExtents(r, rank, nranks);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(e.status().message());
  };
  EXPECT_THAT(message(Req(OpKind::kAllReduce, uint64_t{1} << 62), 0, 1),
              HasSubstr("count 4611686018427387904 x 4-byte elements overflows 64 bits"));
  RankRequest send = Req(OpKind::kSend, ~uint64_t{0});  // -1 as a count
  send.root = 1;
  EXPECT_THAT(message(send, 0, 2),
              HasSubstr("count 18446744073709551615 x 4-byte elements overflows 64 bits"));
  EXPECT_THAT(message(Req(OpKind::kReduceScatter, uint64_t{1} << 62), 0, 4),
              HasSubstr("count 4611686018427387904 x 4 ranks x 4-byte elements overflows 64 bits"));
  EXPECT_THAT(message(Req(OpKind::kAllToAll, uint64_t{1} << 40), 0, 1024),
              HasSubstr("count 1099511627776 x 1024 ranks x 4-byte elements = 4503599627370496 "
                        "bytes exceeds the 2^48-byte limit of one operation by 4222124650659840 "
                        "bytes"));
  // Exactly 2^48 bytes is allowed.
  EXPECT_TRUE(ComputeExtents(Req(OpKind::kAllReduce, uint64_t{1} << 46), 0, 1).ok());

  RankRequest v = Req(OpKind::kAllToAllv);
  v.send_counts = {4, 4};
  v.send_displs = {0, ~uint64_t{0} - 2};
  v.recv_counts = {0, 0};
  v.recv_displs = {0, 0};
  EXPECT_THAT(message(v, 0, 2),
              HasSubstr("send block for rank 1: send_displs[1] 18446744073709551613 + "
                        "send_counts[1] 4 elements of 4 bytes overflows 64 bits"));
  v.send_displs = {0, (uint64_t{1} << 46) - 2};  // ends 8 bytes past 2^48
  EXPECT_THAT(message(v, 0, 2),
              HasSubstr("send block for rank 1: send_displs[1] 70368744177662 + send_counts[1] 4 "
                        "elements of 4 bytes ends at byte 281474976710664, past the 2^48-byte "
                        "limit of one operation by 8 bytes"));
  // Blocks that fit one by one but whose sum does not.
  v.send_counts = {uint64_t{1} << 45, (uint64_t{1} << 45) + 1};
  v.send_displs = {0, 0};  // send blocks may overlap (the same elements to two peers)
  EXPECT_THAT(message(v, 0, 2),
              HasSubstr("send_counts[0..1] sum to more than the 2^48-byte limit of one operation"));
  v.send_counts = {4, 4};
  ASSERT_TRUE(ComputeExtents(v, 0, 2).ok());
  EXPECT_EQ(ComputeExtents(v, 0, 2)->send_bytes, 16u);
  // Receive blocks must not overlap; empty ones are not blocks.
  v.recv_counts = {4, 0, 4};
  v.recv_displs = {0, 1, 2};
  v.send_counts = {0, 0, 0};
  v.send_displs = {0, 0, 0};
  EXPECT_THAT(message(v, 0, 3),
              HasSubstr("recv blocks overlap: the block for rank 0 (recv_displs[0] 0, 4 elements) "
                        "and the block for rank 2 (recv_displs[2] 2, 4 elements) share 2 "
                        "elements"));
  v.recv_displs = {0, 1, 4};
  ASSERT_TRUE(ComputeExtents(v, 0, 3).ok());
  EXPECT_EQ(ComputeExtents(v, 0, 3)->recv_bytes, 32u);
}

TEST(ExtentsTest, OverlapMustBeTheInPlaceLayout) {
  std::vector<int32_t> mem(64);
  auto* base = reinterpret_cast<std::byte*>(mem.data());
  RankRequest r = Req(OpKind::kReduceScatter, 4);
  r.dtype = DataType::kInt32;
  r.send = base;
  r.recv = base + 2 * 16;  // rank 2's slot: in place for rank 2 only
  auto e = ComputeExtents(r, 2, 4);
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(IsInPlace(r, 2));
  EXPECT_TRUE(CheckInPlaceLayout(r, 2, *e).ok());
  EXPECT_FALSE(IsInPlace(r, 1));
  EXPECT_EQ(CheckInPlaceLayout(r, 1, *e).code(), absl::StatusCode::kInvalidArgument);
  r.recv = base + 128;  // disjoint: fine
  EXPECT_TRUE(CheckInPlaceLayout(r, 1, *e).ok());
}

}  // namespace
}  // namespace railyard::scheduler
