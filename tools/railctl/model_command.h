// `railctl model`: cost-model predictions without any daemon.
//   railctl model OP --size SIZE <fabric flags> [--algo A] [--json]
//   railctl model crossover --nranks N --alpha T --beta BW [--json]
//   railctl model critical-size --alpha T --beta BW [--json]
// Fabric flags: tools/railctl/fabric_flags.h. Every algorithm with a closed form is listed with
// its latency and bandwidth terms; executable ones also with the IR-based prediction (their
// schedule run through the fabric simulator) where the schedule fits the budget (--ir-budget
// transfers, default 2000000; 0 disables). "chosen" is the tuner's pick.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace railyard::railctl {

absl::Status RunModel(const std::vector<std::string>& args);

}  // namespace railyard::railctl
