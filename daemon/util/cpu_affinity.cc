#include "daemon/util/cpu_affinity.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace railyard {
namespace {

absl::StatusOr<int> ParseCpu(absl::string_view item, absl::string_view number) {
  int cpu = -1;
  // SimpleAtoi takes a sign and surrounding spaces; a CPU number is digits only.
  if (number.empty() || number.size() > 9 ||
      !std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      !absl::SimpleAtoi(number, &cpu)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CPU list item \"", item, "\" is not a CPU number or a range N-M"));
  }
  if (cpu >= kMaxCpus) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CPU ", cpu, " in \"", item, "\" is beyond the largest CPU number, ", kMaxCpus - 1));
  }
  return cpu;
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view text) {
  if (text.empty()) return absl::InvalidArgumentError("the CPU list is empty");
  std::vector<int> cpus;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    if (item.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CPU list \"", text, "\" has an empty item (two commas, or one at an end)"));
    }
    const size_t dash = item.find('-');
    absl::StatusOr<int> first = ParseCpu(item, item.substr(0, dash));
    if (!first.ok()) return first.status();
    int last = *first;
    if (dash != absl::string_view::npos) {
      absl::StatusOr<int> end = ParseCpu(item, item.substr(dash + 1));
      if (!end.ok()) return end.status();
      if (*end < *first) {
        return absl::InvalidArgumentError(
            absl::StrCat("CPU range \"", item, "\" ends below where it starts"));
      }
      last = *end;
    }
    for (int cpu = *first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    absl::StrAppend(&out, out.empty() ? "" : ",", cpus[i]);
    if (j > i) absl::StrAppend(&out, "-", cpus[j]);
    i = j + 1;
  }
  return out;
}

absl::StatusOr<std::vector<int>> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
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
        "CPU(s) ", FormatCpuList(refused),
        " are not among those this process may run on (offline, or outside its cgroup's cpuset); "
        "it runs on ",
        FormatCpuList(*before)));
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
