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
      state_(std::make_shared<State>(total_, per_job_)) {}

absl::StatusOr<std::shared_ptr<void>> MappingBudget::Take(const std::string& job) {
  absl::MutexLock lock(&state_->mu);
  CallerShares<std::string>& shares = state_->shares;
  switch (shares.Take(job)) {
    case CallerShares<std::string>::Refusal::kNone:
      break;
    case CallerShares<std::string>::Refusal::kCallerShare:
      return absl::ResourceExhaustedError(absl::StrCat(
          "job ", job, " holds ", shares.of(job),
          " of the daemon's memory mappings, its share (--max_mappings_per_job): each registered "
          "buffer is one; allocate fewer, larger buffers (the clients pool small allocations)"));
    case CallerShares<std::string>::Refusal::kPool:
      return absl::ResourceExhaustedError(absl::StrCat(
          "the daemon holds ", shares.total(),
          " memory mappings for its clients, its limit (--max_mappings, below the kernel's "
          "vm.max_map_count)"));
  }
  // The token's deleter gives the mapping back, to the budget's state, which it keeps alive.
  return std::shared_ptr<void>(state_.get(), [state = state_, job](State*) {
    absl::MutexLock lock(&state->mu);
    state->shares.Give(job);
  });
}

size_t MappingBudget::held() const {
  absl::MutexLock lock(&state_->mu);
  return state_->shares.total();
}

size_t MappingBudget::held_by(const std::string& job) const {
  absl::MutexLock lock(&state_->mu);
  return state_->shares.of(job);
}

}  // namespace railyard
