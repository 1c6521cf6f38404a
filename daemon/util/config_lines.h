// The line format the daemon's small operator files share (--job_tokens, --token_key_file,
// --job_policy): one entry per line, '#' starts a comment, blanks around an entry and empty lines
// are ignored.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace railyard {

// Calls fn(lineno, entry) (1-based line number; comment and surrounding blanks removed) for every
// non-empty entry of content, in order; stops at, and returns, the first error fn returns.
template <typename Fn>
absl::Status ForEachConfigLine(absl::string_view content, Fn fn) {
  int lineno = 0;
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    ++lineno;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    if (absl::Status s = fn(lineno, line); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace railyard
