#include "daemon/auth/signed_token.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/auth/job_id.h"
#include "daemon/util/config_lines.h"

namespace railyard::auth {
namespace {

constexpr size_t kMacBytes = 32;
constexpr size_t kMacHexDigits = 2 * kMacBytes;
constexpr size_t kMaxExpiryDigits = 19;  // int64 seconds
// A key file is a few lines; anything this large is not one.
constexpr size_t kMaxKeyFileBytes = 1 << 20;
constexpr absl::string_view kFormat = "expected ryt1.<expiry>.<job>.<64 hex digits>";

// strerror without its shared buffer.
std::string ErrnoText(int err) {
  char buffer[256];
  return strerror_r(err, buffer, sizeof(buffer));  // the GNU variant returns the text
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string ToLowerHex(const unsigned char* bytes, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0xf];
  }
  return out;
}

// HMAC-SHA256(key, "railyard-token-v1" '\0' job '\0' expiry); false only when OpenSSL fails.
bool ComputeMac(absl::string_view key, absl::string_view job, absl::string_view expiry,
                unsigned char out[kMacBytes]) {
  std::string input = "railyard-token-v1";
  input.push_back('\0');
  input.append(job.data(), job.size());
  input.push_back('\0');
  input.append(expiry.data(), expiry.size());
  // OpenSSL treats a null key pointer as "reuse the previous key"; an empty key is never null.
  static const unsigned char kNoKey = 0;
  const void* key_data = key.empty() ? &kNoKey : static_cast<const void*>(key.data());
  unsigned int len = 0;
  return HMAC(EVP_sha256(), key_data, static_cast<int>(key.size()),
              reinterpret_cast<const unsigned char*>(input.data()), input.size(), out,
              &len) != nullptr &&
         len == kMacBytes;
}

absl::Status Malformed(absl::string_view why) {
  return absl::PermissionDeniedError(absl::StrCat("job token is malformed: ", why));
}

// The token's parts as written, checked for shape; mac decoded to bytes.
struct Parts {
  absl::string_view expiry_text;
  absl::string_view job;
  int64_t expiry_s = 0;
  unsigned char mac[kMacBytes] = {};
};

absl::StatusOr<Parts> Split(absl::string_view token) {
  if (token.empty()) return Malformed(absl::StrCat("empty (", kFormat, ")"));
  if (token.size() > kMaxTokenLength) {
    return Malformed(
        absl::StrCat(token.size(), " characters, longer than any token (", kMaxTokenLength, ")"));
  }
  if (!IsSignedToken(token)) {
    return Malformed(absl::StrCat("does not start with '", kTokenPrefix, "' (", kFormat, ")"));
  }
  const absl::string_view rest = token.substr(kTokenPrefix.size());
  const size_t first_dot = rest.find('.');
  const size_t last_dot = rest.rfind('.');
  if (first_dot == absl::string_view::npos || first_dot == last_dot) {
    return Malformed(absl::StrCat("missing parts (", kFormat, ")"));
  }
  Parts parts;
  parts.expiry_text = rest.substr(0, first_dot);
  parts.job = rest.substr(first_dot + 1, last_dot - first_dot - 1);
  const absl::string_view mac_hex = rest.substr(last_dot + 1);

  if (parts.expiry_text.empty()) return Malformed("the expiry is empty");
  if (parts.expiry_text.size() > kMaxExpiryDigits) {
    return Malformed(absl::StrCat("the expiry has ", parts.expiry_text.size(), " digits; at most ",
                                  kMaxExpiryDigits, " (Unix seconds)"));
  }
  for (char c : parts.expiry_text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return Malformed("the expiry is not a decimal number of Unix seconds");
    }
  }
  if (parts.expiry_text.size() > 1 && parts.expiry_text[0] == '0') {
    return Malformed("the expiry has a leading zero");
  }
  if (!absl::SimpleAtoi(parts.expiry_text, &parts.expiry_s)) {
    return Malformed("the expiry is out of range");
  }
  if (!ValidJobId(parts.job)) {
    return Malformed(parts.job.empty()
                         ? absl::string_view("the job id is empty")
                         : absl::string_view("the job id is not [A-Za-z0-9._-]{1,128}"));
  }
  if (mac_hex.size() != kMacHexDigits) {
    return Malformed(absl::StrCat("the signature is ", mac_hex.size(), " characters, not ",
                                  kMacHexDigits, " hex digits"));
  }
  for (size_t i = 0; i < kMacBytes; ++i) {
    const char hi = mac_hex[2 * i];
    const char lo = mac_hex[2 * i + 1];
    // Lowercase only: one spelling per token.
    if ((hi >= 'A' && hi <= 'F') || (lo >= 'A' && lo <= 'F') || HexValue(hi) < 0 ||
        HexValue(lo) < 0) {
      return Malformed("the signature is not lowercase hex");
    }
    parts.mac[i] = static_cast<unsigned char>(HexValue(hi) << 4 | HexValue(lo));
  }
  return parts;
}

absl::StatusOr<std::vector<std::string>> ParseKeys(absl::string_view content,
                                                   absl::string_view where) {
  std::vector<std::string> keys;
  absl::Status parsed = ForEachConfigLine(content, [&](int lineno, absl::string_view line) {
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(where, " line ", lineno, ": ", why));
    };
    for (size_t i = 0; i < line.size(); ++i) {
      if (HexValue(line[i]) < 0) {
        return bad(absl::StrCat("character ", i + 1,
                                " is not a hex digit (a key is one run of hex digits)"));
      }
    }
    if (line.size() % 2 != 0) {
      return bad(absl::StrCat("odd number of hex digits (", line.size(), ")"));
    }
    if (line.size() / 2 < kMinKeyBytes) {
      return bad(absl::StrCat("key is ", line.size() / 2, " bytes; keys are at least ",
                              kMinKeyBytes, " bytes (", 2 * kMinKeyBytes, " hex digits)"));
    }
    std::string key(line.size() / 2, '\0');
    for (size_t i = 0; i < key.size(); ++i) {
      key[i] = static_cast<char>(HexValue(line[2 * i]) << 4 | HexValue(line[2 * i + 1]));
    }
    keys.push_back(std::move(key));
    return absl::OkStatus();
  });
  if (!parsed.ok()) return parsed;
  if (keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no key (one hex key of at least ",
                                                   2 * kMinKeyBytes, " digits per line)"));
  }
  return keys;
}

}  // namespace

std::string FormatTokenTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

bool IsSignedToken(absl::string_view token) {
  return token.substr(0, kTokenPrefix.size()) == kTokenPrefix;
}

absl::StatusOr<std::vector<std::string>> ParseTokenKeys(absl::string_view content) {
  return ParseKeys(content, "token keys");
}

absl::StatusOr<std::vector<std::string>> LoadTokenKeys(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string why = absl::StrCat("cannot open token key file ", path, ": ", ErrnoText(err));
    return err == ENOENT ? absl::NotFoundError(why) : absl::PermissionDeniedError(why);
  }
  std::string content;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read token key file ", path, ": ", ErrnoText(err)));
    }
    if (n == 0) break;
    content.append(buf, static_cast<size_t>(n));
    if (content.size() > kMaxKeyFileBytes) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat("token key file ", path, " is over ",
                                                     kMaxKeyFileBytes, " bytes: not a key file"));
    }
  }
  ::close(fd);
  absl::StatusOr<std::vector<std::string>> keys =
      ParseKeys(content, absl::StrCat("token key file ", path));
  // The buffers held key material.
  OPENSSL_cleanse(buf, sizeof(buf));
  OPENSSL_cleanse(content.data(), content.size());
  return keys;
}

std::string IssueToken(absl::string_view key, absl::string_view job, absl::Time expiry) {
  const std::string expiry_text = absl::StrCat(absl::ToUnixSeconds(expiry));
  unsigned char mac[kMacBytes];
  if (!ComputeMac(key, job, expiry_text, mac)) return "";
  return absl::StrCat(kTokenPrefix, expiry_text, ".", job, ".", ToLowerHex(mac, kMacBytes));
}

absl::StatusOr<TokenFields> ParseToken(absl::string_view token) {
  absl::StatusOr<Parts> parts = Split(token);
  if (!parts.ok()) return parts.status();
  return TokenFields{std::string(parts->job), absl::FromUnixSeconds(parts->expiry_s)};
}

absl::Status VerifyToken(const std::vector<std::string>& keys, absl::string_view token,
                         absl::string_view job, absl::Time now) {
  absl::StatusOr<Parts> parts = Split(token);
  if (!parts.ok()) return parts.status();
  if (keys.empty()) {
    return absl::PermissionDeniedError(
        "job token cannot be verified: this daemon has no token key");
  }
  // Every key is tried, whichever matches: the time taken says nothing about which one did.
  int matches = 0;
  for (const std::string& key : keys) {
    unsigned char expected[kMacBytes];
    const bool computed = ComputeMac(key, parts->job, parts->expiry_text, expected);
    matches |= computed && CRYPTO_memcmp(expected, parts->mac, kMacBytes) == 0 ? 1 : 0;
    // A valid MAC for this job and expiry: as good as a token.
    OPENSSL_cleanse(expected, sizeof(expected));
  }
  if (matches == 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("job token's signature does not verify with this daemon's token key",
                     keys.size() == 1 ? "" : "s",
                     ": forged, tampered with, or minted with another cluster's key"));
  }
  if (parts->job != job) {
    return absl::PermissionDeniedError(
        ValidJobId(job)
            ? absl::StrCat("job token was issued for job ", parts->job, ", not job ", job)
            : absl::StrCat("job token was issued for job ", parts->job,
                           ", not for the job asked for (which is not a valid job id)"));
  }
  const absl::Time expiry = absl::FromUnixSeconds(parts->expiry_s);
  if (now >= expiry) {
    return absl::PermissionDeniedError(absl::StrCat("job token for job ", parts->job,
                                                    " expired at ", FormatTokenTime(expiry), " (",
                                                    absl::ToInt64Seconds(now - expiry), " s ago)"));
  }
  return absl::OkStatus();
}

}  // namespace railyard::auth
