#include "daemon/session/job_policy.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "daemon/session/job_tokens.h"
#include "daemon/session/peer_cred.h"
#include "daemon/util/config_lines.h"

namespace railyard {
namespace {

bool ParseIds(absl::string_view list, std::set<uint32_t>* out) {
  for (absl::string_view id : absl::StrSplit(list, ',')) {
    uint32_t v = 0;
    if (!absl::SimpleAtoi(id, &v)) return false;
    out->insert(v);
  }
  return !out->empty();
}

}  // namespace

absl::StatusOr<JobPolicy> JobPolicy::Parse(absl::string_view content) {
  JobPolicy policy;
  absl::Status parsed = ForEachConfigLine(content, [&](int lineno, absl::string_view line) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    auto bad = [lineno](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("job policy line ", lineno, ": ", why));
    };
    if (parts[0] != "*" && !ValidJobId(parts[0])) {
      return bad("expected '<job id | *> [uids=A,B] [gids=C]'");
    }
    if (parts.size() < 2) return bad("a rule needs uids= or gids=");
    Rule rule;
    for (size_t i = 1; i < parts.size(); ++i) {
      if (absl::ConsumePrefix(&parts[i], "uids=")) {
        if (!ParseIds(parts[i], &rule.uids)) return bad("uids= takes decimal ids separated by ','");
      } else if (absl::ConsumePrefix(&parts[i], "gids=")) {
        if (!ParseIds(parts[i], &rule.gids)) return bad("gids= takes decimal ids separated by ','");
      } else {
        return bad(absl::StrCat("unknown field '", parts[i].substr(0, 32), "'"));
      }
    }
    if (!policy.rules_.emplace(std::string(parts[0]), std::move(rule)).second) {
      return bad(absl::StrCat(parts[0], " has a rule already"));
    }
    return absl::OkStatus();
  });
  if (!parsed.ok()) return parsed;
  return policy;
}

absl::StatusOr<JobPolicy> JobPolicy::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job policy file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<JobPolicy> parsed = Parse(ss.str());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", parsed.status().message()));
  }
  return parsed;
}

absl::Status JobPolicy::Check(const std::string& job, const PeerCred& cred) const {
  auto it = rules_.find(job);
  if (it == rules_.end()) it = rules_.find("*");
  if (it == rules_.end()) return absl::OkStatus();
  const Rule& rule = it->second;
  if (rule.uids.count(cred.uid) > 0 || rule.gids.count(cred.gid) > 0) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "uid ", cred.uid, " gid ", cred.gid, " may not connect as job ", job,
      " (--job_policy allows uids {", absl::StrJoin(rule.uids, ","), "} gids {",
      absl::StrJoin(rule.gids, ","), "}", it->first == "*" ? " for jobs without a rule" : "", ")"));
}

}  // namespace railyard
