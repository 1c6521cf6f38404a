// ScheduleBuilder's fences (builder.h): a range with many writers read again (hier's
// copy-to-all of a shard assembled from K ring pieces) gets one zero-byte fence. The schedule must
// be the one without fences plus the fences, with the same happens-before, and still correct in
// place and out of place (the symbolic executor checks races, deadlocks and results).
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "daemon/kernels/types.h"
#include "daemon/scheduler/algorithms/builder.h"
#include "daemon/scheduler/algorithms/hier.h"
#include "daemon/scheduler/op.h"
#include "daemon/scheduler/schedule.h"
#include "daemon/scheduler/symbolic_executor.h"
#include "gtest/gtest.h"

namespace railyard::scheduler {
namespace {

using algorithms::ScheduleBuilder;

RankSchedule Hier(const OpShape& s, const CommLayout& l, size_t chunk, uint32_t fence_min) {
  ScheduleBuilder b(s, l, chunk, fence_min);
  EXPECT_TRUE(algorithms::GenerateHier(b).ok());
  return std::move(b).Finish(kAlgoHier);
}

bool IsFence(const Transfer& t) { return t.bytes == 0 && t.src == t.dst; }

// 40 nodes: each hier shard is assembled from 40 ring pieces (>= the default 32 writers).
constexpr int kNodes = 40;
constexpr int kRanksPerNode = 3;  // copy-to-all reads each shard twice

OpShape AllReduceShape(uint64_t count) {
  OpShape s;
  s.op = OpKind::kAllReduce;
  s.dtype = kernels::DataType::kInt32;
  s.red_op = kernels::RedOp::kSum;
  s.count = count;
  return s;
}

TEST(BuilderFence, SameTransfersAndHappensBeforeAsWithout) {
  const CommLayout l = CommLayout::Uniform(kNodes, kRanksPerNode, 1);
  const OpShape s = AllReduceShape(kNodes * kRanksPerNode * 3);
  const RankSchedule plain = Hier(s, l, 0, 0);
  const RankSchedule fenced = Hier(s, l, 0, ScheduleBuilder::kDefaultFenceMinWriters);
  // Index of each fenced transfer in `plain` (-1 for fences).
  std::vector<int64_t> map;
  size_t fences = 0, next = 0;
  for (const Transfer& t : fenced.transfers) {
    if (IsFence(t)) {
      map.push_back(-1);
      ++fences;
      EXPECT_GE(t.deps.size(), ScheduleBuilder::kDefaultFenceMinWriters);
      continue;
    }
    ASSERT_LT(next, plain.transfers.size());
    const Transfer& p = plain.transfers[next];
    EXPECT_TRUE(p.kind == t.kind && p.bytes == t.bytes && p.finalize == t.finalize &&
                p.src == t.src && p.dst == t.dst)
        << "transfer " << next;
    map.push_back(static_cast<int64_t>(next++));
  }
  EXPECT_EQ(next, plain.transfers.size());
  // One fence per (node, shard): its G - 1 local copies share it.
  EXPECT_EQ(fences, static_cast<size_t>(kNodes * kRanksPerNode));
  // Deps through a fence are the fence's deps: exactly the plain schedule's deps.
  uint64_t plain_deps = 0, fenced_deps = 0;
  for (size_t i = 0; i < fenced.transfers.size(); ++i) {
    fenced_deps += fenced.transfers[i].deps.size();
    if (map[i] < 0) continue;
    std::set<int64_t> got;
    for (uint32_t d : fenced.transfers[i].deps) {
      if (map[d] >= 0) {
        got.insert(map[d]);
        continue;
      }
      for (uint32_t f : fenced.transfers[d].deps) got.insert(map[f]);
    }
    const auto& want_deps = plain.transfers[map[i]].deps;
    plain_deps += want_deps.size();
    EXPECT_EQ(got, std::set<int64_t>(want_deps.begin(), want_deps.end())) << "transfer " << i;
  }
  // Each fence adds one dep here (2 copies of each shard); from the third copy on it saves
  // writers - 1 per copy (hier at 8 ranks per node: 7 copies).
  EXPECT_EQ(fenced_deps, plain_deps + fences);
}

TEST(BuilderFence, HierAllReduceIsRightInAndOutOfPlace) {
  const CommLayout l = CommLayout::Uniform(kNodes, kRanksPerNode, 1);
  const OpShape s = AllReduceShape(kNodes * kRanksPerNode * 2 + 1);
  for (size_t chunk : {size_t{0}, size_t{12}}) {
    const RankSchedule sched = Hier(s, l, chunk, ScheduleBuilder::kDefaultFenceMinWriters);
    size_t fences = 0;
    for (const Transfer& t : sched.transfers) fences += IsFence(t) ? 1 : 0;
    if (chunk == 0) {
      EXPECT_GT(fences, 0u);
    }
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(testing::Message() << "chunk " << chunk << " in_place " << in_place);
      SimMemory mem = SimMemory::ForOp(s, l.nranks, in_place, std::byte{0x5A});
      for (int r = 0; r < l.nranks; ++r) {
        for (uint64_t e = 0; e < s.count; ++e) {
          const auto v = static_cast<int32_t>(r * 1000 + e);
          std::memcpy(mem.send(r) + e * 4, &v, 4);
        }
      }
      SimOptions opts;
      opts.max_race_steps = 60000;
      auto stats = RunSymbolic(sched, l, s, &mem, opts);
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_TRUE(stats->races_checked);
      const int64_t n = l.nranks;
      for (int r = 0; r < l.nranks; ++r) {
        for (uint64_t e = 0; e < s.count; ++e) {
          int32_t got = 0;
          std::memcpy(&got, mem.recv(r) + e * 4, 4);
          const int64_t want = 1000 * n * (n - 1) / 2 + n * static_cast<int64_t>(e);
          ASSERT_EQ(got, want) << "rank " << r << " element " << e;
        }
      }
    }
  }
}

}  // namespace
}  // namespace railyard::scheduler
