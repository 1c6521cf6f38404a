// Invariant checks for the fuzz targets: a violated property prints what and where, then aborts,
// which libFuzzer reports as a crash and saves the input (docs/development.md, "Fuzzing").
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace railyard::fuzz {

[[noreturn]] inline void Fail(const char* file, int line, const char* cond,
                              const std::string& what) {
  std::fprintf(stderr, "%s:%d: property violated: %s: %s\n", file, line, cond, what.c_str());
  std::abort();
}

// Errors the daemon returns for bad input: the expected code and a message that says something
// but does not echo unbounded input back (at most max_len bytes).
inline std::string ErrorProblem(const absl::Status& s, absl::StatusCode code, size_t max_len) {
  if (s.code() != code) {
    return absl::StrCat("code ", absl::StatusCodeToString(s.code()), " instead of ",
                        absl::StatusCodeToString(code), ": ", s.message().substr(0, 200));
  }
  if (s.message().empty()) return "empty error message";
  if (s.message().size() > max_len) {
    return absl::StrCat("error message of ", s.message().size(), " bytes (limit ", max_len,
                        "): ", s.message().substr(0, 200), "...");
  }
  return "";
}

}  // namespace railyard::fuzz

// FUZZ_CHECK(condition, what): what is evaluated only on failure (an absl::StrCat(...) saying
// which values broke the property).
#define FUZZ_CHECK(cond, what)                                              \
  do {                                                                      \
    if (!(cond)) ::railyard::fuzz::Fail(__FILE__, __LINE__, #cond, (what)); \
  } while (0)

// The status must be an error of `code` with a message of at most max_len bytes.
#define FUZZ_CHECK_ERROR(status, code, max_len)                                              \
  do {                                                                                       \
    const std::string problem = ::railyard::fuzz::ErrorProblem((status), (code), (max_len)); \
    if (!problem.empty()) ::railyard::fuzz::Fail(__FILE__, __LINE__, #status, problem);      \
  } while (0)
