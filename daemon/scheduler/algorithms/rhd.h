// Recursive halving-doubling AllReduce, recursive doubling AllReduce and the dissemination
// barrier.
#pragma once

#include "absl/status/status.h"
#include "daemon/scheduler/algorithms/builder.h"

namespace railyard::scheduler::algorithms {

// Round k: node i signals node i + 2^k after hearing round k-1; ceil(log2 nnodes) rounds over the
// node leaders (all of a node's ranks have arrived when its daemon runs the op).
void DisseminationBarrier(ScheduleBuilder& b);

absl::Status GenerateRhd(ScheduleBuilder& b);
// Recursive doubling (short messages): after the same fold as rhd, in round k a core rank and
// its partner (index XOR 2^k) swap their whole partial sums and both reduce; after log2(p) rounds
// every core rank holds the result. log2(p) dependent message steps instead of rhd's 2 log2(p),
// for log2(p) M bytes sent instead of 2 (p-1)/p M: the latency-bound choice. Partners compute
// a (op) b and b (op) a, the same bits for the commutative reductions, so every rank ends with
// the same result.
absl::Status GenerateRd(ScheduleBuilder& b);

}  // namespace railyard::scheduler::algorithms
