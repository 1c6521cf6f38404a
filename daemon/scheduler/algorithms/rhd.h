// Recursive halving-doubling AllReduce and the dissemination barrier.
#pragma once

#include "absl/status/status.h"
#include "daemon/scheduler/algorithms/builder.h"

namespace railyard::scheduler::algorithms {

// Round k: node i signals node i + 2^k after hearing round k-1; ceil(log2 nnodes) rounds over the
// node leaders (all of a node's ranks have arrived when its daemon runs the op).
void DisseminationBarrier(ScheduleBuilder& b);

absl::Status GenerateRhd(ScheduleBuilder& b);

}  // namespace railyard::scheduler::algorithms
