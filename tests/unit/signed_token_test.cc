// Signed job tokens (daemon/auth/signed_token.h): a known-answer vector from the openssl CLI,
// round trips, every field tampered with, wrong and rotated keys, expiry, malformed tokens and
// key files.
#include "daemon/auth/signed_token.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard::auth {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// 00 01 02 ... 1f.
constexpr absl::string_view kKeyHex =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
constexpr absl::string_view kOtherKeyHex =
    "f0e1d2c3b4a5968778695a4b3c2d1e0f00112233445566778899aabbccddeeff";

std::string Key(absl::string_view hex) { return absl::HexStringToBytes(hex); }

absl::Time At(int64_t unix_s) { return absl::FromUnixSeconds(unix_s); }

MATCHER_P(DeniedWith, text, "") {
  if (arg.code() != absl::StatusCode::kPermissionDenied) {
    *result_listener << "code " << absl::StatusCodeToString(arg.code()) << ": " << arg.message();
    return false;
  }
  if (!absl::StrContains(arg.message(), text)) {
    *result_listener << "message: " << arg.message();
    return false;
  }
  return true;
}

MATCHER_P(InvalidWith, text, "") {
  if (arg.status().code() != absl::StatusCode::kInvalidArgument) {
    *result_listener << "status " << arg.status().ToString();
    return false;
  }
  if (!absl::StrContains(arg.status().message(), text)) {
    *result_listener << "message: " << arg.status().message();
    return false;
  }
  return true;
}

// The MAC is HMAC-SHA256(key, "railyard-token-v1" NUL job NUL expiry); the expected values are
// the openssl CLI's:
//   printf '%s\0%s\0%s' railyard-token-v1 job 123 |
//     openssl dgst -sha256 -mac HMAC -macopt hexkey:000102...1f
TEST(SignedToken, KnownAnswerFromOpensslCli) {
  EXPECT_EQ(IssueToken(Key(kKeyHex), "job", At(123)),
            "ryt1.123.job.2fdafc61924c08b6449b22baa244c8839d72bae498dbb12d0b02f11f134ae6fd");
  EXPECT_EQ(IssueToken(Key(kKeyHex), "train-42.a", At(1767225600)),
            "ryt1.1767225600.train-42.a."
            "07549d36955652e1eff21e4274bf51decaa29121e872086eb976381995f59804");
  // Expiry is whole seconds, rounded down.
  EXPECT_EQ(IssueToken(Key(kKeyHex), "job", At(123) + absl::Milliseconds(999)),
            IssueToken(Key(kKeyHex), "job", At(123)));
  const std::vector<std::string> keys = {Key(kKeyHex)};
  EXPECT_TRUE(
      VerifyToken(keys,
                  "ryt1.123.job.2fdafc61924c08b6449b22baa244c8839d72bae498dbb12d0b02f11f134ae6fd",
                  "job", At(122))
          .ok());
}

TEST(SignedToken, RoundTrip) {
  const std::vector<std::string> keys = {Key(kOtherKeyHex)};
  const std::string token = IssueToken(keys[0], "llama-70b_run-7", At(2000000000));
  EXPECT_TRUE(IsSignedToken(token));
  EXPECT_EQ(token.size(), 5 + 10 + 1 + 15 + 1 + 64);
  EXPECT_TRUE(VerifyToken(keys, token, "llama-70b_run-7", At(1999999999)).ok());
  absl::StatusOr<TokenFields> fields = ParseToken(token);
  ASSERT_TRUE(fields.ok()) << fields.status();
  EXPECT_EQ(fields->job, "llama-70b_run-7");
  EXPECT_EQ(fields->expiry, At(2000000000));
}

TEST(SignedToken, JobWithDots) {
  const std::vector<std::string> keys = {Key(kKeyHex)};
  for (const char* job : {"a.b", "ns.team.run-3.v1", ".", "..", "x.", ".y"}) {
    const std::string token = IssueToken(keys[0], job, At(5000));
    EXPECT_TRUE(VerifyToken(keys, token, job, At(4000)).ok()) << job;
    absl::StatusOr<TokenFields> fields = ParseToken(token);
    ASSERT_TRUE(fields.ok()) << job << ": " << fields.status();
    EXPECT_EQ(fields->job, job);
    EXPECT_EQ(fields->expiry, At(5000));
  }
  // A dotted job is not confused with a shorter one plus another expiry.
  const std::string token = IssueToken(keys[0], "a.b", At(5000));
  EXPECT_THAT(VerifyToken(keys, token, "b", At(4000)), DeniedWith("issued for job a.b, not job b"));
}

TEST(SignedToken, EveryTamperedFieldFailsTheSignature) {
  const std::vector<std::string> keys = {Key(kKeyHex)};
  const std::string token = IssueToken(keys[0], "job-1", At(1767225600));
  constexpr absl::string_view kForged = "signature does not verify with this daemon's token key:";
  // A later expiry, an earlier one, another job: each a well-formed token with the old MAC.
  const std::string mac = token.substr(token.rfind('.') + 1);
  EXPECT_THAT(VerifyToken(keys, absl::StrCat("ryt1.1767225601.job-1.", mac), "job-1", At(0)),
              DeniedWith(kForged));
  EXPECT_THAT(VerifyToken(keys, absl::StrCat("ryt1.9767225600.job-1.", mac), "job-1", At(0)),
              DeniedWith(kForged));
  EXPECT_THAT(VerifyToken(keys, absl::StrCat("ryt1.1767225600.job-2.", mac), "job-2", At(0)),
              DeniedWith(kForged));
  // Every hex digit of the MAC changed in turn.
  for (size_t i = token.size() - 64; i < token.size(); ++i) {
    std::string bad = token;
    bad[i] = bad[i] == '0' ? '1' : '0';
    EXPECT_THAT(VerifyToken(keys, bad, "job-1", At(0)), DeniedWith(kForged)) << "digit " << i;
  }
  // The untouched token still verifies (the loop above is not failing for another reason).
  EXPECT_TRUE(VerifyToken(keys, token, "job-1", At(0)).ok());
}

TEST(SignedToken, WrongKeySaysSoWithoutKeyOrMac) {
  const std::string token = IssueToken(Key(kOtherKeyHex), "job", At(1767225600));
  const absl::Status status = VerifyToken({Key(kKeyHex)}, token, "job", At(0));
  EXPECT_THAT(status,
              DeniedWith("job token's signature does not verify with this daemon's token "
                         "key: forged, tampered with, or minted with another cluster's key"));
  const std::string message(status.message());
  EXPECT_THAT(message, AllOf(Not(HasSubstr(token.substr(token.rfind('.') + 1))),
                             Not(HasSubstr(std::string(kKeyHex))),
                             Not(HasSubstr(std::string(kOtherKeyHex)))));
  // No key at all never verifies.
  EXPECT_THAT(VerifyToken({}, token, "job", At(0)), DeniedWith("this daemon has no token key"));
}

TEST(SignedToken, RotationAnyKeyVerifies) {
  const std::string k1 = Key(kKeyHex);
  const std::string k2 = Key(kOtherKeyHex);
  const std::string from_k1 = IssueToken(k1, "job", At(1767225600));
  const std::string from_k2 = IssueToken(k2, "job", At(1767225600));
  EXPECT_NE(from_k1, from_k2);
  EXPECT_TRUE(VerifyToken({k1, k2}, from_k2, "job", At(0)).ok());
  EXPECT_TRUE(VerifyToken({k1, k2}, from_k1, "job", At(0)).ok());
  EXPECT_TRUE(VerifyToken({k2, k1}, from_k1, "job", At(0)).ok());
  EXPECT_THAT(VerifyToken({k1}, from_k2, "job", At(0)), DeniedWith("does not verify"));
  // After the old key is retired, its tokens stop verifying; the message says "keys" for several.
  const std::string k3 = Key("11" + std::string(kKeyHex.substr(2)));
  EXPECT_THAT(VerifyToken({k2, k3}, from_k1, "job", At(0)),
              DeniedWith("does not verify with this daemon's token keys:"));
}

TEST(SignedToken, IssuedForAnotherJobOnlyOnceTheSignatureVerifies) {
  const std::vector<std::string> keys = {Key(kKeyHex)};
  const std::string token = IssueToken(keys[0], "job-a", At(1767225600));
  EXPECT_THAT(VerifyToken(keys, token, "job-b", At(0)),
              DeniedWith("job token was issued for job job-a, not job job-b"));
  EXPECT_THAT(VerifyToken(keys, token, "bad job\n", At(0)),
              DeniedWith("issued for job job-a, not for the job asked for (which is not a valid "
                         "job id)"));
  // Forged for another job: the signature fails first, so the job it names is not believed.
  const std::string forged = IssueToken(Key(kOtherKeyHex), "job-a", At(1767225600));
  const absl::Status status = VerifyToken(keys, forged, "job-b", At(0));
  EXPECT_THAT(status, DeniedWith("does not verify"));
  EXPECT_THAT(std::string(status.message()), Not(HasSubstr("job-a")));
  // The job is checked before the expiry.
  EXPECT_THAT(VerifyToken(keys, token, "job-b", At(1767225700)),
              DeniedWith("issued for job job-a"));
}

TEST(SignedToken, Expired) {
  const std::vector<std::string> keys = {Key(kKeyHex)};
  const std::string token = IssueToken(keys[0], "job", At(1767225600));
  EXPECT_TRUE(VerifyToken(keys, token, "job", At(1767225599)).ok());
  EXPECT_TRUE(VerifyToken(keys, token, "job", At(1767225600) - absl::Nanoseconds(1)).ok());
  EXPECT_THAT(VerifyToken(keys, token, "job", At(1767225600)),
              DeniedWith("job token for job job expired at 2026-01-01T00:00:00Z (0 s ago)"));
  EXPECT_THAT(VerifyToken(keys, token, "job", At(1767225600 + 90) + absl::Milliseconds(500)),
              DeniedWith("expired at 2026-01-01T00:00:00Z (90 s ago)"));
  EXPECT_THAT(VerifyToken(keys, IssueToken(keys[0], "job", At(0)), "job", At(86400)),
              DeniedWith("expired at 1970-01-01T00:00:00Z (86400 s ago)"));
}

TEST(SignedToken, MalformedTokensSayWhichPart) {
  const std::vector<std::string> keys = {Key(kKeyHex)};
  const std::string mac(64, 'a');
  const struct {
    std::string token;
    std::string why;
  } cases[] = {
      {"", "job token is malformed: empty"},
      {"ryt1.", "missing parts"},
      {"ryt1", "does not start with 'ryt1.'"},
      {"s3cret", "does not start with 'ryt1.'"},
      {"RYT1.123.job." + mac, "does not start with 'ryt1.'"},
      {"ryt2.123.job." + mac, "does not start with 'ryt1.'"},
      {"ryt1.123", "missing parts"},
      {"ryt1.123." + mac, "missing parts"},
      {"ryt1.123.job", "missing parts"},
      {"ryt1.123.job.abc", "the signature is 3 characters, not 64 hex digits"},
      {"ryt1..job." + mac, "the expiry is empty"},
      {"ryt1.123.." + mac, "the job id is empty"},
      {"ryt1.123.job.", "the signature is 0 characters, not 64 hex digits"},
      {"ryt1.123.job." + mac.substr(1), "the signature is 63 characters, not 64 hex digits"},
      {"ryt1.123.job." + mac + "a", "the signature is 65 characters, not 64 hex digits"},
      {"ryt1.123.job." + mac.substr(2) + "g0", "the signature is not lowercase hex"},
      {"ryt1.123.job." + mac.substr(2) + "A0", "the signature is not lowercase hex"},
      {"ryt1.12a.job." + mac, "the expiry is not a decimal number of Unix seconds"},
      {"ryt1.-12.job." + mac, "the expiry is not a decimal number of Unix seconds"},
      {"ryt1.+12.job." + mac, "the expiry is not a decimal number of Unix seconds"},
      {"ryt1. 12.job." + mac, "the expiry is not a decimal number of Unix seconds"},
      {"ryt1.0123.job." + mac, "the expiry has a leading zero"},
      {"ryt1." + std::string(40, '9') + ".job." + mac,
       "the expiry has 40 digits; at most 19 (Unix seconds)"},
      {"ryt1.9999999999999999999.job." + mac, "the expiry is out of range"},
      {"ryt1.123.jo/b." + mac, "the job id is not [A-Za-z0-9._-]{1,128}"},
      {"ryt1.123.jo b." + mac, "the job id is not [A-Za-z0-9._-]{1,128}"},
      {std::string("ryt1.123.jo\0b.", 14) + mac, "the job id is not [A-Za-z0-9._-]{1,128}"},
      {"ryt1.123." + std::string(129, 'j') + "." + mac, "the job id is not [A-Za-z0-9._-]{1,128}"},
      {"ryt1.123." + std::string(300, 'j') + "." + mac, "longer than any token (218)"},
  };
  for (const auto& c : cases) {
    const absl::Status status = VerifyToken(keys, c.token, "job", At(0));
    EXPECT_THAT(status, DeniedWith(c.why)) << "token '" << c.token << "'";
    EXPECT_THAT(status, DeniedWith("job token is malformed: ")) << "token '" << c.token << "'";
    EXPECT_EQ(ParseToken(c.token).status(), status) << "token '" << c.token << "'";
    EXPECT_THAT(std::string(status.message()), Not(HasSubstr(mac)));
  }
  // The longest job id is fine, and so is the largest expiry that fits.
  const std::string longest = IssueToken(keys[0], std::string(128, 'j'), At(INT64_C(1) << 40));
  EXPECT_TRUE(VerifyToken(keys, longest, std::string(128, 'j'), At(0)).ok());
  const std::string max_expiry = "ryt1.9223372036854775807." + std::string(128, 'j') + "." + mac;
  EXPECT_EQ(max_expiry.size(), kMaxTokenLength);
  EXPECT_THAT(VerifyToken(keys, max_expiry, "job", At(0)), DeniedWith("does not verify"));
}

TEST(SignedToken, IsSignedToken) {
  EXPECT_TRUE(IsSignedToken("ryt1."));
  EXPECT_TRUE(IsSignedToken("ryt1.123.job.abc"));
  EXPECT_FALSE(IsSignedToken("ryt1"));
  EXPECT_FALSE(IsSignedToken(""));
  EXPECT_FALSE(IsSignedToken("hunter2"));
  EXPECT_FALSE(IsSignedToken("ryt2.123.job.abc"));
}

TEST(TokenKeys, ParsesKeysInOrderSkippingCommentsAndBlankLines) {
  const std::string upper = absl::AsciiStrToUpper(kOtherKeyHex);
  const std::string content = absl::StrCat("# cluster token keys; the first signs\n\n  ", kKeyHex,
                                           "  # current\n\t\n", upper, "\r\n#", kKeyHex, "\n");
  absl::StatusOr<std::vector<std::string>> keys = ParseTokenKeys(content);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_THAT(*keys, ElementsAre(Key(kKeyHex), Key(kOtherKeyHex)));
  // Longer keys are fine.
  keys = ParseTokenKeys(absl::StrCat(kKeyHex, kOtherKeyHex));
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ((*keys)[0].size(), 64u);
}

TEST(TokenKeys, BadContentNamesTheLine) {
  EXPECT_THAT(ParseTokenKeys(absl::StrCat("# c\n", kKeyHex, "\n", kKeyHex, "0\n")),
              InvalidWith("token keys line 3: odd number of hex digits (65)"));
  EXPECT_THAT(ParseTokenKeys(absl::StrCat("\n\n00112g", kKeyHex)),
              InvalidWith("token keys line 3: character 6 is not a hex digit"));
  EXPECT_THAT(ParseTokenKeys(absl::StrCat("0011 ", kKeyHex)),
              InvalidWith("token keys line 1: character 5 is not a hex digit"));
  EXPECT_THAT(ParseTokenKeys(absl::StrCat(kKeyHex.substr(2), "\n")),
              InvalidWith("token keys line 1: key is 31 bytes; keys are at least 32 bytes (64 hex "
                          "digits)"));
  EXPECT_THAT(ParseTokenKeys(""), InvalidWith("token keys: no key"));
  EXPECT_THAT(ParseTokenKeys("# only a comment\n\n   \n"), InvalidWith("token keys: no key"));
  // Key material is never echoed.
  const absl::StatusOr<std::vector<std::string>> short_key = ParseTokenKeys(kKeyHex.substr(2));
  EXPECT_THAT(std::string(short_key.status().message()),
              Not(HasSubstr(std::string(kKeyHex.substr(2, 16)))));
}

TEST(TokenKeys, LoadNamesThePath) {
  const std::string dir = ::testing::TempDir();
  const std::string good = dir + "/signed_token_test.good";
  std::ofstream(good) << kOtherKeyHex << "\n" << kKeyHex << "\n";
  absl::StatusOr<std::vector<std::string>> keys = LoadTokenKeys(good);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_THAT(*keys, ElementsAre(Key(kOtherKeyHex), Key(kKeyHex)));

  const std::string bad = dir + "/signed_token_test.bad";
  std::ofstream(bad) << kKeyHex << "\nnot-a-key\n";
  EXPECT_THAT(
      LoadTokenKeys(bad),
      InvalidWith(absl::StrCat("token key file ", bad, " line 2: character 1 is not a hex digit")));
  const std::string empty = dir + "/signed_token_test.empty";
  std::ofstream(empty) << "# rotated out\n";
  EXPECT_THAT(LoadTokenKeys(empty),
              InvalidWith(absl::StrCat("token key file ", empty, ": no key")));

  const std::string missing = dir + "/signed_token_test.missing";
  const absl::StatusOr<std::vector<std::string>> none = LoadTokenKeys(missing);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr(missing));
  EXPECT_THAT(LoadTokenKeys(dir), InvalidWith("cannot read token key file"));
  std::remove(good.c_str());
  std::remove(bad.c_str());
  std::remove(empty.c_str());
}

}  // namespace
}  // namespace railyard::auth
