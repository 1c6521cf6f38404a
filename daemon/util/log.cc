#include "daemon/util/log.h"

#include <unistd.h>

#include <atomic>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace railyard {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

absl::string_view LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

// Quotes a value when it is empty or holds spaces, quotes, '=' or control characters.
void AppendValue(std::string* out, absl::string_view v) {
  bool quote = v.empty();
  for (char c : v) {
    if (c == ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) < 0x20) {
      quote = true;
      break;
    }
  }
  if (!quote) {
    out->append(v.data(), v.size());
    return;
  }
  out->push_back('"');
  for (char c : v) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out->push_back('?');
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

bool ParseLogLevel(absl::string_view name, LogLevel* level) {
  if (name == "debug") {
    *level = LogLevel::kDebug;
  } else if (name == "info") {
    *level = LogLevel::kInfo;
  } else if (name == "warn" || name == "warning") {
    *level = LogLevel::kWarning;
  } else if (name == "error") {
    *level = LogLevel::kError;
  } else {
    return false;
  }
  return true;
}

std::string FormatLogLine(LogLevel level, absl::string_view component, absl::string_view msg,
                          std::initializer_list<LogField> fields) {
  std::string line = absl::StrCat(
      "ts=", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      " level=", LevelName(level), " comp=");
  AppendValue(&line, component);
  line.append(" msg=");
  AppendValue(&line, msg);
  for (const auto& [key, value] : fields) {
    line.push_back(' ');
    line.append(key.data(), key.size());
    line.push_back('=');
    AppendValue(&line, value);
  }
  return line;
}

void Log(LogLevel level, absl::string_view component, absl::string_view msg,
         std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  std::string line = FormatLogLine(level, component, msg, fields);
  line.push_back('\n');
  // One write per line: atomic with respect to other threads' lines.
  ssize_t rc = ::write(STDERR_FILENO, line.data(), line.size());
  (void)rc;
}

}  // namespace railyard
