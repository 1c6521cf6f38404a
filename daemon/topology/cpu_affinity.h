// Which CPUs railyardd runs on (--cpus): a CPU list as taskset(1) and cpuset(7) write it, and
// pinning the whole process to it before any thread starts, so that every thread it starts later
// inherits the set.
#pragma once

#include <sched.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace railyard {

// --cpus's value -> sorted CPU ids: the kernel cpulist syntax of topology::ParseCpuList
// ("0-3,8,10-11", whose messages name the bad item), plus what a CPU mask needs: at least one
// CPU, and none at or above kMaxCpus. INVALID_ARGUMENT otherwise. topology::FormatCpuList writes
// a list back.
inline constexpr int kMaxCpus = CPU_SETSIZE;
absl::StatusOr<std::vector<int>> ParseCpuMask(absl::string_view text);

// The CPUs thread `tid` (0: the calling thread) may run on now (sched_getaffinity).
absl::StatusOr<std::vector<int>> AllowedCpus(pid_t tid = 0);

// Pins every thread of this process (/proc/self/task) to `cpus`. FAILED_PRECONDITION, leaving
// the affinity as it was, when the kernel does not grant all of them (a CPU offline, or outside
// the process's cgroup cpuset): the message names those CPUs and the ones the process runs on.
// Widening an inherited affinity (taskset) within the cpuset is allowed, as sched_setaffinity
// allows it.
absl::Status PinProcessToCpus(const std::vector<int>& cpus);

}  // namespace railyard
