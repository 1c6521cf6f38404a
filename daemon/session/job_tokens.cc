#include "daemon/session/job_tokens.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "daemon/util/config_lines.h"

namespace railyard {

absl::StatusOr<std::map<std::string, std::string>> ParseJobTokens(absl::string_view content) {
  std::map<std::string, std::string> tokens;
  absl::Status parsed = ForEachConfigLine(content, [&](int lineno, absl::string_view line) {
    // Any run of blanks separates the two: a tab after the job id is not part of the token.
    std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::ByAnyChar(" \t\v\f\r"), absl::SkipEmpty());
    if (parts.size() != 2 || !ValidJobId(parts[0])) {
      return absl::InvalidArgumentError(
          absl::StrCat("job tokens line ", lineno, ": expected '<job_id> <token>'"));
    }
    if (!tokens.emplace(std::string(parts[0]), std::string(parts[1])).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("job tokens line ", lineno, ": job ", parts[0], " listed twice"));
    }
    return absl::OkStatus();
  });
  if (!parsed.ok()) return parsed;
  return tokens;
}

absl::StatusOr<std::map<std::string, std::string>> LoadJobTokens(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job tokens file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto parsed = ParseJobTokens(ss.str());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", parsed.status().message()));
  }
  return parsed;
}

}  // namespace railyard
