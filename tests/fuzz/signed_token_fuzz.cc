// Fuzz target: what a client presents as its job's token, and the key and policy files an
// operator writes (daemon/auth/signed_token.h, daemon/session/job_policy.h). The input's first
// byte picks the job (from a few, including dotted ones) and the clock; the rest is the token.
// Properties: VerifyToken accepts a token only if it is exactly what IssueToken makes for that
// job and the expiry it carries, with one of the keys, and the expiry is in the future; every
// refusal is PERMISSION_DENIED with a bounded message that never contains the token's MAC (64 hex
// digits) or a key; ParseToken never accepts what IsSignedToken rejects. The same bytes as a key
// file and as a job policy file: parsing either never crashes, and what parses has the limits it
// promises (keys of at least 32 bytes; policy rules with ids).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/auth/signed_token.h"
#include "daemon/session/job_policy.h"
#include "daemon/session/peer_cred.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace railyard;
  if (size == 0) return 0;
  static const std::vector<std::string> keys = {std::string(32, '\x01'), std::string(48, '\x7f')};
  static const char* const jobs[] = {"job", "a.b.c", "ryt1", "x-1_2.3", "other"};
  const std::string job = jobs[data[0] % 5];
  const absl::Time now = absl::FromUnixSeconds(1700000000 + (data[0] >> 3) * 1000);
  const std::string token(reinterpret_cast<const char*>(data + 1), size - 1);

  const absl::Status s = auth::VerifyToken(keys, token, job, now);
  if (s.ok()) {
    absl::StatusOr<auth::TokenFields> f = auth::ParseToken(token);
    FUZZ_CHECK(f.ok(), "a verified token does not parse");
    FUZZ_CHECK(f->job == job, "a token verified for another job");
    FUZZ_CHECK(f->expiry > now, "an expired token verified");
    FUZZ_CHECK(auth::IssueToken(keys[0], job, f->expiry) == token ||
                   auth::IssueToken(keys[1], job, f->expiry) == token,
               "a token verified that no key issues");
  } else {
    FUZZ_CHECK(s.code() == absl::StatusCode::kPermissionDenied,
               absl::StrCat("code ", absl::StatusCodeToString(s.code())));
    FUZZ_CHECK(!s.message().empty() && s.message().size() <= 512,
               absl::StrCat("message of ", s.message().size(), " bytes"));
    // A MAC is 64 hex digits. Only such a tail can be echoed secret: any other 64 bytes may be
    // the refusal's own words (a token ending ".b token is malformed: the expiry is not a
    // decimal number of Unix" is refused with a message containing them).
    const size_t dot = token.rfind('.');
    if (dot != std::string::npos && token.size() - dot - 1 == 64 &&
        token.find_first_not_of("0123456789abcdefABCDEF", dot + 1) == std::string::npos) {
      FUZZ_CHECK(!absl::StrContains(s.message(), token.substr(dot + 1)),
                 "the refusal echoes the token's MAC");
    }
  }
  if (auth::ParseToken(token).ok()) {
    FUZZ_CHECK(auth::IsSignedToken(token), "ParseToken accepted a token without the prefix");
  }

  const std::string file(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<std::string>> parsed_keys = auth::ParseTokenKeys(file);
  if (parsed_keys.ok()) {
    FUZZ_CHECK(!parsed_keys->empty(), "a key file without keys parsed");
    for (const std::string& k : *parsed_keys) {
      FUZZ_CHECK(k.size() >= 32, absl::StrCat("a key of ", k.size(), " bytes"));
    }
  }
  absl::StatusOr<JobPolicy> policy = JobPolicy::Parse(file);
  if (policy.ok()) {
    const absl::Status c = policy->Check(job, PeerCred{1, 1000, 1000});
    FUZZ_CHECK(c.ok() || c.code() == absl::StatusCode::kPermissionDenied,
               "a policy check failed with another code");
  } else {
    FUZZ_CHECK(policy.status().code() == absl::StatusCode::kInvalidArgument,
               "a policy parse error that is not INVALID_ARGUMENT");
  }
  return 0;
}
