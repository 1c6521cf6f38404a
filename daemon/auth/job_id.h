// The job id rule, once: what a session's job, a job token's job, a policy or weights line and a
// peer's JoinComm may name. Header-only, in auth/ (which needs nothing of the daemon) so that
// railctl's token commands and the daemon share it.
#pragma once

#include <cstddef>

#include "absl/strings/string_view.h"

namespace railyard {

inline constexpr size_t kMaxJobIdLength = 128;

// Job ids are [A-Za-z0-9._-]{1,128}.
inline bool ValidJobId(absl::string_view job) {
  if (job.empty() || job.size() > kMaxJobIdLength) return false;
  for (char c : job) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace railyard
