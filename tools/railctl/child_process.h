// Runs a program to completion and returns what it wrote on stdout (railctl calibrate runs
// railyard-perf). Bounded: the child (and its process group) is killed at the deadline.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace railyard::railctl {

// argv[0] is the program path. extra_env is added to this process's environment. Errors:
// NOT_FOUND when it cannot be started, DEADLINE_EXCEEDED after timeout, INTERNAL for a non-zero
// exit (the message carries the last line of its stderr).
absl::StatusOr<std::string> RunToCompletion(const std::vector<std::string>& argv,
                                            const std::map<std::string, std::string>& extra_env,
                                            std::chrono::seconds timeout);

// The railyard-perf next to this railctl binary (same directory), else "railyard-perf" on PATH.
std::string SiblingProgram(const std::string& name);

}  // namespace railyard::railctl
