// Which CPUs railyardd runs on (--cpus): a CPU list as taskset(1) and cpuset(7) write it, and
// pinning the whole process to it before any thread starts, so that every thread it starts later
// inherits the set.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace railyard {

// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11} (sorted, without repeats). INVALID_ARGUMENT, naming
// the bad item, for an empty list or item, a non-number, a range whose end is below its start, or
// a CPU at or above kMaxCpus.
inline constexpr int kMaxCpus = 1024;  // CPU_SETSIZE
absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view text);

// {0, 1, 2, 3, 8} -> "0-3,8".
std::string FormatCpuList(const std::vector<int>& cpus);

// The CPUs the calling thread may run on now (sched_getaffinity).
absl::StatusOr<std::vector<int>> AllowedCpus();

// Pins every thread of this process (/proc/self/task) to `cpus`. FAILED_PRECONDITION, leaving
// the affinity as it was, when the kernel does not grant all of them (a CPU offline, or outside
// the process's cgroup cpuset): the message names those CPUs and the ones the process runs on.
// Widening an inherited affinity (taskset) within the cpuset is allowed, as sched_setaffinity
// allows it.
absl::Status PinProcessToCpus(const std::vector<int>& cpus);

}  // namespace railyard
