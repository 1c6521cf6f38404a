// The --job_tokens file: one "job_id token" pair per line, separated by blanks (spaces or tabs);
// '#' starts a comment.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/auth/job_id.h"  // ValidJobId

namespace railyard {

// INVALID_ARGUMENT naming the line for malformed content, NOT_FOUND when the file is missing.
absl::StatusOr<std::map<std::string, std::string>> ParseJobTokens(absl::string_view content);
absl::StatusOr<std::map<std::string, std::string>> LoadJobTokens(const std::string& path);

}  // namespace railyard
