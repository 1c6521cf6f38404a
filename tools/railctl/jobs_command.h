// `railctl jobs [--json]`: every job on the daemon with its fair-share weight and what it sent on
// each paced rail (Admin.ListJobs); `railctl jobs set-weight JOB W`: sets a job's weight until
// the next --job_weights reload (Admin.SetJobWeight).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "railyard/v1/admin.pb.h"

namespace railyard::railctl {

absl::Status RunJobs(const std::vector<std::string>& args);

// The human rendering: the rails and their pacing, then one row per job and paced rail.
std::string FormatJobs(const v1::ListJobsResponse& jobs);

}  // namespace railyard::railctl
