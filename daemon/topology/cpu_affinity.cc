#include "daemon/topology/cpu_affinity.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/topology/topology_graph.h"

namespace railyard {

absl::StatusOr<std::vector<int>> ParseCpuMask(absl::string_view text) {
  absl::StatusOr<std::vector<int>> cpus = topology::ParseCpuList(text);
  if (!cpus.ok()) return cpus.status();
  if (cpus->empty()) return absl::InvalidArgumentError("the CPU list names no CPU");
  if (cpus->back() >= kMaxCpus) {
    return absl::InvalidArgumentError(
        absl::StrCat("CPU ", cpus->back(), " is beyond the largest CPU number, ", kMaxCpus - 1));
  }
  return cpus;
}

absl::StatusOr<std::vector<int>> AllowedCpus(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(tid, sizeof(set), &set) != 0) {
    return absl::InternalError(absl::StrCat("sched_getaffinity: ", std::strerror(errno)));
  }
  std::vector<int> cpus;
  for (int cpu = 0; cpu < kMaxCpus; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

absl::Status PinProcessToCpus(const std::vector<int>& cpus) {
  if (cpus.empty()) return absl::InvalidArgumentError("no CPU to run on");
  absl::StatusOr<std::vector<int>> before = AllowedCpus();
  if (!before.ok()) return before.status();
  const auto set_of = [](const std::vector<int>& list) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : list) CPU_SET(cpu, &set);
    return set;
  };
  const cpu_set_t set = set_of(cpus);
  // The calling thread first. The kernel grants only CPUs that are online and in the process's
  // cgroup cpuset (dropping the others, or failing with EINVAL when none is left), so what it
  // granted is read back and compared.
  bool none = false;
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    if (errno != EINVAL) {
      return absl::InternalError(absl::StrCat("sched_setaffinity: ", std::strerror(errno)));
    }
    none = true;
  }
  absl::StatusOr<std::vector<int>> granted = AllowedCpus();
  if (!granted.ok()) return granted.status();
  if (none || *granted != cpus) {
    std::vector<int> refused;
    for (int cpu : cpus) {
      if (none || !std::binary_search(granted->begin(), granted->end(), cpu))
        refused.push_back(cpu);
    }
    const cpu_set_t old = set_of(*before);
    (void)sched_setaffinity(0, sizeof(old), &old);
    return absl::FailedPreconditionError(absl::StrCat(
        "CPU(s) ", topology::FormatCpuList(refused),
        " are not among those this process may run on (offline, or outside its cgroup's cpuset); "
        "it runs on ",
        topology::FormatCpuList(*before)));
  }
  // Every other thread that exists now (none, at start-up); the ones started later inherit the
  // set from their creator.
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    pid_t tid = 0;
    if (!absl::SimpleAtoi(task.path().filename().string(), &tid)) continue;
    if (sched_setaffinity(tid, sizeof(set), &set) != 0 && errno != ESRCH) {
      return absl::InternalError(
          absl::StrCat("sched_setaffinity(thread ", tid, "): ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace railyard
