// The daemon's memory mappings. The kernel bounds a process's mappings (vm.max_map_count,
// 65530 by default), and each registered host buffer and each session's rings is one: four jobs
// within their buffer quotas once took them all (issue 55), and a fifth job's rings then failed
// with an mmap error. So the daemon keeps a budget below the kernel's limit (room for its own
// threads, libraries and transports) and gives each job a share of it: a job at its share gets
// RESOURCE_EXHAUSTED naming --max_mappings_per_job, everyone else is served.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/util/caller_shares.h"

namespace railyard {

class MappingBudget {
 public:
  // total 0: 3/4 of vm.max_map_count; per_job 0: a quarter of the total.
  MappingBudget(size_t total, size_t per_job);

  // vm.max_map_count, or 65530 when it cannot be read.
  static size_t KernelLimit();

  // One mapping for `job`, held until the returned object goes (after the munmap: keep it in
  // the MappedSegment; it may outlive the budget). RESOURCE_EXHAUSTED naming the share or the
  // budget and its flag.
  absl::StatusOr<std::shared_ptr<void>> Take(const std::string& job);

  size_t total() const { return total_; }
  size_t per_job() const { return per_job_; }
  size_t held() const;
  size_t held_by(const std::string& job) const;

 private:
  struct State {
    State(size_t total, size_t per_job) : shares(total, per_job) {}
    mutable absl::Mutex mu;
    CallerShares<std::string> shares ABSL_GUARDED_BY(mu);
  };

  const size_t total_;
  const size_t per_job_;
  const std::shared_ptr<State> state_;
};

}  // namespace railyard
