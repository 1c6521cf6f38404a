// `railctl status [--socket S] [--json]`: what a daemon is doing (Admin.Status).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "railyard/v1/admin.pb.h"

namespace railyard::railctl {

absl::Status RunStatus(const std::vector<std::string>& args);

// The human rendering: a summary line, then jobs, communicators and sessions as tables.
std::string FormatStatus(const v1::StatusResponse& status);

}  // namespace railyard::railctl
