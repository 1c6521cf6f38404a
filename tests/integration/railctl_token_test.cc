// `railctl token` as an operator's launcher runs it: keygen, issue and verify through the real
// binary, its exit codes (0 done, 1 failed, 2 usage) and what it prints, with the tokens it mints
// checked by the library the daemon verifies with (daemon/auth/signed_token.h).
#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "daemon/auth/signed_token.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/process.h"
#include "tests/integration/railctl_run.h"

namespace railyard::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::StartsWith;

class RailctlToken : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rytok-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // railctl with args (a shell line: may start with "printf ... |"), stdout and stderr apart.
  RailctlRun Railctl(const std::string& args, const std::string& stdin_text = "") {
    return testing::Railctl(dir_, args, stdin_text);
  }

  // A new key file from `railctl token keygen --out`.
  std::string Keygen(const std::string& name) {
    const std::string path = dir_ + "/" + name;
    const RailctlRun r = Railctl("token keygen --out " + path);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, "");
    return path;
  }

  // The token `railctl token issue` prints, without its newline.
  std::string Issue(const std::string& job, const std::string& ttl, const std::string& key) {
    const RailctlRun r = Railctl("token issue --job " + job + " --ttl " + ttl + " --key " + key);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_FALSE(r.out.empty());
    EXPECT_EQ(r.out.back(), '\n');
    return r.out.empty() ? "" : r.out.substr(0, r.out.size() - 1);
  }

  std::string dir_;
};

TEST_F(RailctlToken, KeygenIssueVerify) {
  const std::string key = Keygen("cluster.key");
  struct stat st {};
  ASSERT_EQ(::stat(key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  const std::string key_text = Slurp(key);
  EXPECT_THAT(key_text, MatchesRegex("[0-9a-f]{64}\n"));
  // Never over an existing key.
  RailctlRun r = Railctl("token keygen --out " + key);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr(key + " already exists; refusing to overwrite a key file"));
  EXPECT_EQ(Slurp(key), key_text);

  const absl::Time before = absl::Now();
  const std::string token = Issue("team.train-7", "24h", key);
  const absl::Time after = absl::Now();
  std::smatch m;
  ASSERT_TRUE(std::regex_match(token, m, std::regex(R"(ryt1\.(\d+)\.team\.train-7\.[0-9a-f]{64})")))
      << token;
  int64_t expiry_s = 0;
  ASSERT_TRUE(absl::SimpleAtoi(m[1].str(), &expiry_s));
  EXPECT_GE(expiry_s, absl::ToUnixSeconds(before + absl::Hours(24)));
  EXPECT_LE(expiry_s, absl::ToUnixSeconds(after + absl::Hours(24)) + 1);

  // The daemon's library accepts it with the same key file.
  absl::StatusOr<std::vector<std::string>> keys = auth::LoadTokenKeys(key);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_TRUE(auth::VerifyToken(*keys, token, "team.train-7", absl::Now()).ok());

  const std::string valid_until =
      "valid until " + auth::FormatTokenTime(absl::FromUnixSeconds(expiry_s)) + " (in ";
  r = Railctl("token verify --job team.train-7 --key " + key + " " + token);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith(valid_until));
  EXPECT_EQ(r.err, "");
  // From stdin, so that the token is not in the process list.
  r = Railctl("token verify --job team.train-7 --key " + key + " -", token + "\n");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith(valid_until));
}

TEST_F(RailctlToken, VerifyFailsWithTheReason) {
  const std::string key = Keygen("cluster.key");
  const std::string token = Issue("job-a", "1h", key);

  // Another cluster's key, printed on stdout this time.
  RailctlRun r = Railctl("token keygen");
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_THAT(r.out, MatchesRegex("[0-9a-f]{64}\n"));
  EXPECT_NE(r.out, Slurp(key));
  const std::string other = dir_ + "/other.key";
  std::ofstream(other) << r.out;
  r = Railctl("token verify --job job-a --key " + other + " " + token);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED: job token's signature does not verify"));
  EXPECT_THAT(r.err, HasSubstr("minted with another cluster's key (checked with " + other + ")"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr(token.substr(token.rfind('.') + 1))));

  // Another job's token.
  r = Railctl("token verify --job job-b --key " + key + " " + token);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("job token was issued for job job-a, not job job-b"));

  // Tampered: a later expiry under the same MAC.
  std::string tampered = token;
  tampered[5] = tampered[5] == '9' ? '8' : '9';
  r = Railctl("token verify --job job-a --key " + key + " " + tampered);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("signature does not verify"));

  // Malformed.
  r = Railctl("token verify --job job-a --key " + key + " ryt1.123.job-a.abc");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("job token is malformed: the signature is 3 characters"));

  // Expired: a one-second token, two seconds later.
  const std::string short_lived = Issue("job-a", "1s", key);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  r = Railctl("token verify --job job-a --key " + key + " " + short_lived);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, MatchesRegex(".*job token for job job-a expired at "
                                  "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z \\([0-9]+ s ago\\).*\n"));
}

TEST_F(RailctlToken, RotationFirstKeySignsAnyVerifies) {
  const std::string old_key = Keygen("old.key");
  const std::string new_key = Keygen("new.key");
  // During rotation the file holds the new key first and the old one after it.
  const std::string both = dir_ + "/both.key";
  std::ofstream(both) << "# rotating: new first\n" << Slurp(new_key) << Slurp(old_key);
  const std::string from_old = Issue("job", "1h", old_key);
  const std::string from_both = Issue("job", "1h", both);
  EXPECT_EQ(Railctl("token verify --job job --key " + both + " " + from_old).code, 0);
  EXPECT_EQ(Railctl("token verify --job job --key " + new_key + " " + from_both).code, 0);
  EXPECT_EQ(Railctl("token verify --job job --key " + old_key + " " + from_both).code, 1);
}

TEST_F(RailctlToken, UsageErrorsExitTwo) {
  const std::string key = Keygen("cluster.key");
  const struct {
    std::string args;
    std::string why;
  } cases[] = {
      {"token issue --job j --ttl 0s --key " + key, "--ttl 0s must be > 0 and at most 366 days"},
      {"token issue --job j --ttl -1h --key " + key, "--ttl -1h must be > 0"},
      {"token issue --job j --ttl 8785h --key " + key, "at most 366 days (8784h)"},
      {"token issue --job j --ttl 2d --key " + key, "--ttl '2d' is not a duration"},
      {"token issue --job j --ttl soon --key " + key, "--ttl 'soon' is not a duration"},
      {"token issue --job j --key " + key, "--ttl DURATION is required"},
      {"token issue --ttl 1h --key " + key, "--job J is required"},
      {"token issue --job j --ttl 1h", "--key FILE is required"},
      {"token issue --job 'a/b' --ttl 1h --key " + key, "a job id is [A-Za-z0-9._-]{1,128}"},
      {"token issue --job j --ttl 1h --key " + key + " extra", "unexpected argument 'extra'"},
      {"token issue --job j --ttl 1h --keyfile " + key, "unknown flag '--keyfile'"},
      {"token verify --job j --key " + key, "missing TOKEN"},
      {"token verify --job j --key " + key + " a b", "unexpected argument 'b'"},
      {"token keygen --out", "--out needs a value"},
      {"token", "missing subcommand"},
      {"token mint", "unknown subcommand 'mint'"},
  };
  for (const auto& c : cases) {
    const RailctlRun r = Railctl(c.args);
    EXPECT_EQ(r.code, 2) << c.args << ": " << r.err;
    EXPECT_EQ(r.out, "") << c.args;
    EXPECT_THAT(r.err, StartsWith("railctl: token: INVALID_ARGUMENT: ")) << c.args;
    EXPECT_THAT(r.err, HasSubstr(c.why)) << c.args;
  }
  // A key file that is not one is a failure, not a usage error.
  const std::string bad = dir_ + "/bad.key";
  std::ofstream(bad) << "# none\n";
  RailctlRun r = Railctl("token issue --job j --ttl 1h --key " + bad);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("token key file " + bad + ": no key"));
  r = Railctl("token issue --job j --ttl 1h --key " + dir_ + "/missing.key");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND: cannot open token key file"));

  r = Railctl("token --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, StartsWith("usage: railctl token keygen [--out FILE]\n"));
  r = Railctl("help");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("\n  token      signed job tokens"));
}

}  // namespace
}  // namespace railyard::testing
