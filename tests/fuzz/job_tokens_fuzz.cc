// Fuzz target: the --job_tokens file and job ids (daemon/session/job_tokens.h); job ids also
// arrive from every client in Connect. Properties: ValidJobId agrees with an independent reading
// of [A-Za-z0-9._-]{1,128}; a file ParseJobTokens accepts maps valid job ids to tokens that are
// non-empty and hold no blank (space, tab, ...), newline or '#', has at most one entry per line,
// and written back one "job token" per line parses to the same map; a file it rejects is
// INVALID_ARGUMENT naming the line, in a bounded message.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "daemon/session/job_tokens.h"
#include "tests/fuzz/fuzz_check.h"

namespace railyard {
namespace {

bool ReferenceValidJobId(absl::string_view job) {
  if (job.empty() || job.size() > 128) return false;
  for (char c : job) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

void CheckTokens(absl::string_view content) {
  absl::StatusOr<std::map<std::string, std::string>> tokens = ParseJobTokens(content);
  if (!tokens.ok()) {
    // "job tokens line N: ..." with at most a (valid, <= 128 bytes) job id quoted.
    FUZZ_CHECK_ERROR(tokens.status(), absl::StatusCode::kInvalidArgument, 250);
    FUZZ_CHECK(absl::StartsWith(tokens.status().message(), "job tokens line "),
               std::string(tokens.status().message()));
    return;
  }
  const size_t lines = static_cast<size_t>(std::count(content.begin(), content.end(), '\n')) + 1;
  FUZZ_CHECK(tokens->size() <= lines,
             absl::StrCat(tokens->size(), " entries from ", lines, " lines"));
  std::string written;
  for (const auto& [job, token] : *tokens) {
    FUZZ_CHECK(ValidJobId(job), absl::StrCat("invalid job id '", job.substr(0, 64), "' accepted"));
    FUZZ_CHECK(!token.empty(), absl::StrCat("empty token for job ", job));
    FUZZ_CHECK(token.find_first_of(" \t\n\v\f\r#") == std::string::npos,
               absl::StrCat("token of job ", job, " holds a blank, newline or '#'"));
    absl::StrAppend(&written, job, " ", token, "\n");
  }
  absl::StatusOr<std::map<std::string, std::string>> again = ParseJobTokens(written);
  FUZZ_CHECK(again.ok(), absl::StrCat("the written-back file fails: ", again.status().message()));
  FUZZ_CHECK(*again == *tokens, "the written-back file parses to another map");
}

}  // namespace
}  // namespace railyard

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  FUZZ_CHECK(railyard::ValidJobId(text) == railyard::ReferenceValidJobId(text),
             absl::StrCat("ValidJobId disagrees on '", text.substr(0, 64), "'"));
  railyard::CheckTokens(text);
  return 0;
}
