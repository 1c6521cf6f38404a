// Ring algorithms in rank order (ranks of a node are consecutive in the usual layout, so only
// node boundaries cross the network), and the ring and chain primitives hier.cc reuses.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "daemon/scheduler/algorithms/builder.h"

namespace railyard::scheduler::algorithms {

// Where member p of a ring/chain/tree reads or accumulates block b (the rank is in the RankRef).
using BlockRefFn = std::function<RankRef(int p, int b)>;
using MemberRefFn = std::function<RankRef(int p)>;

// Ring reduce-scatter over n = lens.size() members, member p sending to member p + 1: block b
// (lens[b] elements) ends reduced in acc(b, b) after n - 1 steps. in(p, b) is member p's
// contribution, acc(p, b) where it accumulates the blocks it receives (may be in(p, b) itself).
// Every member sends every block except its own once: sum(lens) - lens[p] elements.
// finalize: the last reduction of each block carries finalize.
void RingReduceScatter(ScheduleBuilder& b, const BlockRefFn& in, const BlockRefFn& acc,
                       const std::vector<uint64_t>& lens, bool finalize);
// Ring all-gather: block p starts at own(p) and ends in out(q, p) on every member q. Every member
// sends every block except the one of its successor once.
void RingAllGather(ScheduleBuilder& b, const MemberRefFn& own, const BlockRefFn& out,
                   const std::vector<uint64_t>& lens);
// Pipelined chain 0 -> 1 -> ... -> n-1: src (member 0's data) ends in out(p) on every member.
void ChainBroadcast(ScheduleBuilder& b, int n, uint64_t elems, const RankRef& src,
                    const MemberRefFn& out);
// Pipelined chain 0 -> 1 -> ... -> n-1 that reduces: every in(p) reduced into acc(n-1).
// acc(p) holds member p's partial (may be in(p) itself).
void ChainReduce(ScheduleBuilder& b, int n, uint64_t elems, const MemberRefFn& in,
                 const MemberRefFn& acc, bool finalize);

absl::Status GenerateRing(ScheduleBuilder& b);

}  // namespace railyard::scheduler::algorithms
