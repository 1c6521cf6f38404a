// `railctl explain OP SIZE [--comm ID] [--dtype T] [--root R] [--socket S] [--json]`: asks a
// running daemon which algorithm (and chunk size) a multi-node communicator would run OP of SIZE
// bytes (PRIMER's M) with, every candidate's predicted time, why, and the calibration used.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "railyard/v1/cost.pb.h"

namespace railyard::railctl {

absl::Status RunExplain(const std::vector<std::string>& args);

// One paragraph on a cost model: its link classes and what a fit holds for.
std::string DescribeCostModel(const v1::CostModel& m);

}  // namespace railyard::railctl
