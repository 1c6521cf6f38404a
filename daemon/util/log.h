// Structured one-line logs (logfmt): ts=... level=... comp=... msg="..." key=value ...
// One line per event, written whole with a single write(2) so lines of threads never interleave.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace railyard {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Global minimum level; set once at start-up (--log_level).
void SetLogLevel(LogLevel level);
bool ParseLogLevel(absl::string_view name, LogLevel* level);
bool LogEnabled(LogLevel level);

using LogField = std::pair<absl::string_view, std::string>;

// Formats a log line without the trailing newline (exposed for tests).
std::string FormatLogLine(LogLevel level, absl::string_view component, absl::string_view msg,
                          std::initializer_list<LogField> fields);

void Log(LogLevel level, absl::string_view component, absl::string_view msg,
         std::initializer_list<LogField> fields = {});

// Field helper: F("rank", 3) -> {"rank", "3"}.
template <typename T>
LogField F(absl::string_view key, const T& value) {
  return {key, absl::StrCat(value)};
}

}  // namespace railyard
