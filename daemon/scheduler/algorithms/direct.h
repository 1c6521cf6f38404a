// Direct algorithms (every rank talks to every rank) and the direct primitives hier.cc reuses for
// its intra-node phases.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "daemon/scheduler/algorithms/builder.h"

namespace railyard::scheduler::algorithms {

// acc <- inputs[0], then acc <- acc (op) inputs[i] for i >= 1 (a chain of reductions into one
// owner). finalize on the last one.
void DirectReduce(ScheduleBuilder& b, const std::vector<RankRef>& inputs, const RankRef& acc,
                  uint64_t elems, bool finalize);
// src copied into each of outs.
void DirectBroadcast(ScheduleBuilder& b, const RankRef& src, const std::vector<RankRef>& outs,
                     uint64_t elems);

// AllToAll(v) geometry from OpShape (elements): count i -> j, where i's block for j starts in its
// send region, and where j's block from i starts in its recv region.
uint64_t A2ACount(const OpShape& s, int n, int i, int j);
uint64_t A2ASendDispl(const OpShape& s, int n, int i, int j);
uint64_t A2ARecvDispl(const OpShape& s, int n, int j, int i);

// Elements of scratch rank `group[y]` needs for PairwiseExchange(group).
uint64_t PairwiseStagingElems(const OpShape& s, int n, const std::vector<int>& group, int y);
// AllToAll(v) among `group` (global ranks): every i sends its block for j straight to j. In place
// the two blocks of a pair occupy each other's place, so for every pair i < j the block i -> j is
// staged in j's scratch (at scratch_base) and moved into place after j has sent its block to i.
void PairwiseExchange(ScheduleBuilder& b, const std::vector<int>& group, uint64_t scratch_base);

absl::Status GenerateDirect(ScheduleBuilder& b);

}  // namespace railyard::scheduler::algorithms
