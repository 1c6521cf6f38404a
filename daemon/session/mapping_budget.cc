#include "daemon/session/mapping_budget.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace railyard {

size_t MappingBudget::KernelLimit() {
  FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r");
  unsigned long n = 0;
  const bool read = f != nullptr && std::fscanf(f, "%lu", &n) == 1;
  if (f != nullptr) std::fclose(f);
  return read && n > 0 ? static_cast<size_t>(n) : 65530;
}

MappingBudget::MappingBudget(size_t total, size_t per_job)
    : total_(total != 0 ? total : KernelLimit() / 4 * 3),
      per_job_(per_job != 0 ? per_job : std::max<size_t>(1, total_ / 4)),
      shares_(total_, per_job_) {}

absl::StatusOr<std::shared_ptr<void>> MappingBudget::Take(const std::string& job) {
  absl::MutexLock lock(&mu_);
  switch (shares_.Take(job)) {
    case CallerShares<std::string>::Refusal::kNone:
      break;
    case CallerShares<std::string>::Refusal::kCallerShare:
      return absl::ResourceExhaustedError(absl::StrCat(
          "job ", job, " holds ", shares_.of(job),
          " of the daemon's memory mappings, its share (--max_mappings_per_job): each registered "
          "buffer is one; allocate fewer, larger buffers (the clients pool small allocations)"));
    case CallerShares<std::string>::Refusal::kPool:
      return absl::ResourceExhaustedError(absl::StrCat(
          "the daemon holds ", shares_.total(),
          " memory mappings for its clients, its limit (--max_mappings, below the kernel's "
          "vm.max_map_count)"));
  }
  // The token's deleter gives the mapping back; it holds no memory of its own.
  return std::shared_ptr<void>(this, [this, job](MappingBudget*) { Give(job); });
}

void MappingBudget::Give(const std::string& job) {
  absl::MutexLock lock(&mu_);
  shares_.Give(job);
}

size_t MappingBudget::held() const {
  absl::MutexLock lock(&mu_);
  return shares_.total();
}

size_t MappingBudget::held_by(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  return shares_.of(job);
}

}  // namespace railyard
