// `railctl diagnose [COMM_ID | --job J] [--json]`: which rank, node or link a communicator waits
// for (Admin.Diagnose: the daemon asked gathers every member daemon's view over the peer plane).
// Verdicts first, then the evidence; exit 0 when every communicator is healthy, 1 otherwise.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "railyard/v1/diagnose.pb.h"

namespace railyard::railctl {

absl::Status RunDiagnose(const std::vector<std::string>& args);

// The human rendering of one communicator's diagnosis: verdicts, then per node its ranks, the
// pending operation and its transfers in flight.
std::string FormatDiagnosis(const v1::CommDiagnosis& d);

}  // namespace railyard::railctl
