// `railctl simulate`: runs the schedule IR of one job (or of several concurrent jobs, --jobs)
// through the fabric simulator (daemon/scheduler/sim) and prints the predicted time, the bytes
// each tier carried and the busiest link.
//   railctl simulate (--topology FILE | <fabric flags of railctl model>)
//                    [--nodes-per-rack P --oversubscription R]
//                    --op OP --size SIZE [--algo A] [--chunk SIZE] [--jobs FILE] [--links] [--json]
// Without --algo the tuner picks (as the daemons would, closed forms where the schedule is too
// large to evaluate). --json: {"time_s", "algorithm", "tiers": [...], "busiest_link": {...},
// "jobs": [...], ...}.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace railyard::railctl {

absl::Status RunSimulate(const std::vector<std::string>& args);

}  // namespace railyard::railctl
