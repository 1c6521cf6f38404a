#include "tools/railctl/token_command.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/auth/job_id.h"
#include "daemon/auth/signed_token.h"
#include "tools/railctl/command.h"
#include "tools/railctl/flag_set.h"

namespace railyard::railctl {
namespace {

constexpr const char* kUsage =
    "usage: railctl token keygen [--out FILE]\n"
    "       railctl token issue --job J --ttl DURATION --key FILE\n"
    "       railctl token verify --job J --key FILE TOKEN|-\n"
    "Signed job tokens (docs/tokens.md): ryt1.<expiry>.<job>.<HMAC-SHA256 under the cluster's\n"
    "token key>, checked by every daemon started with --token_key_file FILE.\n"
    "  keygen  a new token key: 32 random bytes as 64 hex digits, on stdout or into FILE, which\n"
    "          it creates with mode 0600 and never overwrites.\n"
    "  issue   prints job J's token, valid for DURATION (e.g. 90m, 24h, 168h; > 0 and at most\n"
    "          366 days), signed with FILE's first key.\n"
    "  verify  exit 0 and \"valid until <time>\" when TOKEN (\"-\": the first line of stdin) is "
    "job\n"
    "          J's and verifies with one of FILE's keys; else exit 1 and why.\n"
    "Key files: one hex key per line, '#' comments; the first key signs, any key verifies.\n"
    "Exit codes: 0 done, 1 failed (the reason on stderr), 2 usage error.\n";

constexpr size_t kKeyBytes = 32;
constexpr absl::Duration kMaxTtl = absl::Hours(24 * 366);

// strerror without its shared buffer.
std::string ErrnoText(int err) {
  char buffer[256];
  return strerror_r(err, buffer, sizeof(buffer));  // the GNU variant returns the text
}

// Parses flags; every problem with them is a usage error. "help" is reported as a bool.
absl::StatusOr<ParsedFlags> Flags(const std::vector<std::string>& args,
                                  const std::set<std::string>& value_flags) {
  absl::StatusOr<ParsedFlags> f = ParseFlags(args, value_flags, {});
  if (!f.ok()) return AsUsageError(f.status());
  return f;
}

absl::StatusOr<std::string> RequiredFlag(const ParsedFlags& f, const std::string& name,
                                         absl::string_view what) {
  if (!f.Has(name)) return UsageError(absl::StrCat("--", name, " ", what, " is required"));
  if (f.Get(name).empty()) return UsageError(absl::StrCat("--", name, " is empty"));
  return f.Get(name);
}

absl::StatusOr<std::string> JobFlag(const ParsedFlags& f) {
  absl::StatusOr<std::string> job = RequiredFlag(f, "job", "J");
  if (!job.ok()) return job;
  if (!ValidJobId(*job)) {
    return UsageError(
        absl::StrCat("--job '", absl::CHexEscape(*job), "': a job id is [A-Za-z0-9._-]{1,128}"));
  }
  return job;
}

absl::Status NoPositional(const ParsedFlags& f) {
  if (f.positional.empty()) return absl::OkStatus();
  return UsageError(absl::StrCat("unexpected argument '", f.positional[0], "'"));
}

absl::StatusOr<std::string> RandomKeyHex() {
  unsigned char key[kKeyBytes];
  size_t got = 0;
  while (got < kKeyBytes) {
    const ssize_t n = ::getrandom(key + got, kKeyBytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InternalError(absl::StrCat("getrandom: ", ErrnoText(errno)));
    }
    got += static_cast<size_t>(n);
  }
  std::string hex =
      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(key), kKeyBytes));
  OPENSSL_cleanse(key, sizeof(key));
  return hex;
}

// Creates path (mode 0600, never over an existing file) holding content.
absl::Status WriteNewFile(const std::string& path, const std::string& content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat(path, " already exists; refusing to overwrite a key file"));
    }
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", path, ": ", ErrnoText(err)));
  }
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    done += static_cast<size_t>(n);
  }
  const int write_errno = errno;
  const bool ok = done == content.size() && ::fsync(fd) == 0;
  const int sync_errno = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    return absl::InternalError(absl::StrCat(
        "cannot write ", path, ": ", ErrnoText(done == content.size() ? sync_errno : write_errno)));
  }
  return absl::OkStatus();
}

absl::Status Keygen(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedFlags> f = Flags(args, {"out"});
  if (!f.ok()) return f.status();
  if (absl::Status s = NoPositional(*f); !s.ok()) return s;
  if (f->Has("out") && f->Get("out").empty()) return UsageError("--out is empty");
  absl::StatusOr<std::string> hex = RandomKeyHex();
  if (!hex.ok()) return hex.status();
  std::string line = absl::StrCat(*hex, "\n");
  OPENSSL_cleanse(hex->data(), hex->size());
  absl::Status status = absl::OkStatus();
  if (f->Has("out")) {
    status = WriteNewFile(f->Get("out"), line);
  } else {
    std::fwrite(line.data(), 1, line.size(), stdout);
    if (std::fflush(stdout) != 0) status = absl::InternalError("cannot write the key to stdout");
  }
  OPENSSL_cleanse(line.data(), line.size());
  return status;
}

absl::Status Issue(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedFlags> f = Flags(args, {"job", "ttl", "key"});
  if (!f.ok()) return f.status();
  if (absl::Status s = NoPositional(*f); !s.ok()) return s;
  absl::StatusOr<std::string> job = JobFlag(*f);
  if (!job.ok()) return job.status();
  absl::StatusOr<std::string> ttl_text = RequiredFlag(*f, "ttl", "DURATION");
  if (!ttl_text.ok()) return ttl_text.status();
  absl::StatusOr<std::string> key_file = RequiredFlag(*f, "key", "FILE");
  if (!key_file.ok()) return key_file.status();
  absl::Duration ttl;
  if (!absl::ParseDuration(*ttl_text, &ttl)) {
    return UsageError(absl::StrCat("--ttl '", absl::CHexEscape(*ttl_text),
                                   "' is not a duration (e.g. 90m, 24h, 168h)"));
  }
  if (ttl <= absl::ZeroDuration() || ttl > kMaxTtl) {
    return UsageError(absl::StrCat("--ttl ", *ttl_text, " must be > 0 and at most 366 days (",
                                   absl::FormatDuration(kMaxTtl), ")"));
  }
  absl::StatusOr<std::vector<std::string>> keys = auth::LoadTokenKeys(*key_file);
  if (!keys.ok()) return keys.status();
  // Whole seconds, rounded up: the token lasts at least the ttl.
  const absl::Time until = absl::Now() + ttl;
  absl::Time expiry = absl::FromUnixSeconds(absl::ToUnixSeconds(until));
  if (expiry < until) expiry += absl::Seconds(1);
  const std::string token = auth::IssueToken(keys->front(), *job, expiry);
  for (std::string& key : *keys) OPENSSL_cleanse(key.data(), key.size());
  if (token.empty()) return absl::InternalError("HMAC-SHA256 failed (OpenSSL)");
  std::printf("%s\n", token.c_str());
  return absl::OkStatus();
}

absl::Status Verify(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedFlags> f = Flags(args, {"job", "key"});
  if (!f.ok()) return f.status();
  if (f->positional.size() != 1) {
    return UsageError(f->positional.empty()
                          ? "missing TOKEN (or '-' to read it from stdin)"
                          : absl::StrCat("unexpected argument '", f->positional[1], "'"));
  }
  absl::StatusOr<std::string> job = JobFlag(*f);
  if (!job.ok()) return job.status();
  absl::StatusOr<std::string> key_file = RequiredFlag(*f, "key", "FILE");
  if (!key_file.ok()) return key_file.status();
  std::string token = f->positional[0];
  if (token == "-") {
    token.clear();
    std::getline(std::cin, token);
    token = std::string(absl::StripAsciiWhitespace(token));
  }
  absl::StatusOr<std::vector<std::string>> keys = auth::LoadTokenKeys(*key_file);
  if (!keys.ok()) return keys.status();
  const absl::Time now = absl::Now();
  const absl::Status verified = auth::VerifyToken(*keys, token, *job, now);
  for (std::string& key : *keys) OPENSSL_cleanse(key.data(), key.size());
  if (!verified.ok()) {
    return absl::Status(verified.code(),
                        absl::StrCat(verified.message(), " (checked with ", *key_file, ")"));
  }
  absl::StatusOr<auth::TokenFields> fields = auth::ParseToken(token);
  if (!fields.ok()) return fields.status();
  std::printf("valid until %s (in %lld s)\n", auth::FormatTokenTime(fields->expiry).c_str(),
              static_cast<long long>(absl::ToInt64Seconds(fields->expiry - now)));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunToken(const std::vector<std::string>& args) {
  if (args.empty()) return UsageError("missing subcommand: keygen, issue or verify (try --help)");
  const std::string& sub = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  const bool help = sub == "-h" || sub == "--help" ||
                    std::find(rest.begin(), rest.end(), "--help") != rest.end() ||
                    std::find(rest.begin(), rest.end(), "-h") != rest.end();
  if (help) {
    std::fputs(kUsage, stdout);
    return absl::OkStatus();
  }
  if (sub == "keygen") return Keygen(rest);
  if (sub == "issue") return Issue(rest);
  if (sub == "verify") return Verify(rest);
  return UsageError(
      absl::StrCat("unknown subcommand '", sub, "': keygen, issue or verify (try --help)"));
}

}  // namespace railyard::railctl
