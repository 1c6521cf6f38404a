// Hierarchical rail-aligned algorithms (uniform layouts: G ranks on each of K nodes).
#pragma once

#include "absl/status/status.h"
#include "daemon/scheduler/algorithms/builder.h"

namespace railyard::scheduler::algorithms {

// INVALID_ARGUMENT when the nodes hold different numbers of ranks.
absl::Status GenerateHier(ScheduleBuilder& b);

}  // namespace railyard::scheduler::algorithms
