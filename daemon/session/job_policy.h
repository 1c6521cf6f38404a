// The --job_policy file: which local users may connect as which job, by the uid/gid the kernel
// reports for the connecting process (SO_PEERCRED). One rule per line, '#' starts a comment:
//   <job id | *> [uids=U1,U2,...] [gids=G1,...]
// A process may connect as a job when its uid is in the job's uids or its gid in its gids. A job
// without a line of its own follows the "*" line; without either, any uid may connect (tokens
// still apply).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace railyard {

struct PeerCred;

class JobPolicy {
 public:
  struct Rule {
    std::set<uint32_t> uids;
    std::set<uint32_t> gids;
  };

  // INVALID_ARGUMENT naming the line for malformed content.
  static absl::StatusOr<JobPolicy> Parse(absl::string_view content);
  // NOT_FOUND when the file cannot be read; Parse's errors prefixed with the path.
  static absl::StatusOr<JobPolicy> Load(const std::string& path);

  // OK, or PERMISSION_DENIED naming the uid/gid and the job.
  absl::Status Check(const std::string& job, const PeerCred& cred) const;
  bool empty() const { return rules_.empty(); }

 private:
  std::map<std::string, Rule> rules_;  // "*" is the default rule
};

}  // namespace railyard
