// Signed job tokens: `ryt1.<expiry>.<job>.<mac>`, where <expiry> is Unix seconds in decimal and
// <mac> is 64 lowercase hex digits of HMAC-SHA256(key, "railyard-token-v1" '\0' job '\0' expiry).
// The operator's launcher mints one per job with the cluster's token key (`railctl token issue`);
// every daemon holding that key verifies it without a per-job table. Key files hold one hex key
// per line: the first signs, any verifies (so a key can be rotated in before the old one leaves).
// docs/tokens.md describes the format and its use.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace railyard::auth {

inline constexpr absl::string_view kTokenPrefix = "ryt1.";
// A key is at least this many bytes (64 hex digits in a key file).
inline constexpr size_t kMinKeyBytes = 32;
// The longest well-formed token: prefix, 19 expiry digits, a 128-character job, 64 hex, 2 dots.
inline constexpr size_t kMaxTokenLength = 5 + 19 + 1 + 128 + 1 + 64;

// True when the token is in the signed format (starts with "ryt1."), so it goes to VerifyToken
// rather than to a static --job_tokens table. Says nothing about whether it verifies.
bool IsSignedToken(absl::string_view token);

// Keys, decoded to raw bytes, in file order. Lines are hex keys of >= kMinKeyBytes bytes; '#'
// starts a comment; blank lines are skipped. INVALID_ARGUMENT naming the line (and, from
// LoadTokenKeys, the path) for content that is not that or that holds no key; NOT_FOUND for a
// missing file. The messages never contain key material.
absl::StatusOr<std::vector<std::string>> ParseTokenKeys(absl::string_view content);
absl::StatusOr<std::vector<std::string>> LoadTokenKeys(const std::string& path);

// The token for job, valid until expiry (whole Unix seconds, rounded down). key is raw bytes (one
// of LoadTokenKeys's); job must satisfy the job id rule ([A-Za-z0-9._-]{1,128}) for the token to
// verify. Empty only if OpenSSL's HMAC fails.
std::string IssueToken(absl::string_view key, absl::string_view job, absl::Time expiry);

// A token's fields as written; its MAC is not checked.
struct TokenFields {
  std::string job;
  absl::Time expiry;
};
// PERMISSION_DENIED saying which part is malformed; never echoes the MAC.
absl::StatusOr<TokenFields> ParseToken(absl::string_view token);

// RFC 3339 in UTC to the second, as the messages write expiries: 2026-01-01T00:00:00Z.
std::string FormatTokenTime(absl::Time t);

// OK when the token's MAC verifies under one of keys (compared in constant time), it was issued
// for job and now is before its expiry. Otherwise PERMISSION_DENIED saying why: malformed (which
// part), a signature that does not verify with these keys, issued for another job (said only once
// the signature verified), or expired at <RFC 3339 time> (N s ago). Never names the MAC or a key.
absl::Status VerifyToken(const std::vector<std::string>& keys, absl::string_view token,
                         absl::string_view job, absl::Time now);

}  // namespace railyard::auth
