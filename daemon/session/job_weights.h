// Each job's weight on the paced rails' fair queues (daemon/transport/fair_queue.h): from the
// --job_weights file (one "job_id weight" pair per line, blanks between, '#' comments), reloaded
// on SIGHUP, and set at run time through Admin (railctl jobs set-weight). A job not named has
// weight 1. The file is the source of truth: a reload replaces every weight, including those an
// operator set since (the daemon logs which it dropped). Thread-safe; Get is cheap (a map lookup
// under a shared lock) and is what the fair queue calls as a job starts its turn.
#pragma once

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace railyard {

class JobWeights {
 public:
  // Weights are finite, in [kMin, kMax]: a 10^5 : 1 range is plenty, and it bounds how many
  // quanta one turn can need.
  static constexpr double kMin = 0.01;
  static constexpr double kMax = 1000;
  static constexpr double kDefault = 1;

  struct Entry {
    double weight = kDefault;
    std::string source;  // "file" or "admin"
  };

  // INVALID_ARGUMENT saying why: not a finite number in [kMin, kMax].
  static absl::Status CheckWeight(double weight);
  // INVALID_ARGUMENT naming the line: not "<job_id> <weight>", a bad job id or weight, a job
  // listed twice.
  static absl::StatusOr<std::map<std::string, double>> Parse(absl::string_view content);

  // Replaces every weight with the file's. On any error (NOT_FOUND: unreadable; INVALID_ARGUMENT:
  // path and line) nothing changes. *dropped (if given) gets the jobs whose admin-set weight the
  // reload replaced.
  absl::Status Load(const std::string& path, std::vector<std::string>* dropped = nullptr);
  // An operator's weight for job (INVALID_ARGUMENT for a bad job id or weight); returns the
  // weight it had.
  absl::StatusOr<double> Set(const std::string& job, double weight);

  double Get(const std::string& job) const;
  std::map<std::string, Entry> Snapshot() const;
  // How many times a file was loaded (0: never).
  int loads() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> weights_ ABSL_GUARDED_BY(mu_);
  int loads_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace railyard
