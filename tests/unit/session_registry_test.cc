// SessionRegistry on its own: who may connect as which job (fixed tokens, a verifier for signed
// tokens, the peer uid/gid policy, the insecure first-session rule, nothing configured), session
// limits, and the per-session / per-job quota counters its sessions share.
#include "daemon/session/session_registry.h"

#include <map>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

PeerCred Cred(uint32_t uid, uint32_t gid = 100, int64_t pid = 42) {
  return PeerCred{pid, uid, gid};
}

SessionAuth Insecure() {
  SessionAuth a;
  a.first_session_sets_token = true;
  return a;
}

class SessionRegistryTest : public ::testing::Test {
 protected:
  QuotaLimits limits_ = QuotaLimits::Defaults();
};

TEST_F(SessionRegistryTest, TheFirstSessionOfAJobSetsItsTokenUntilItsLastSessionEnds) {
  SessionRegistry reg(Insecure(), &limits_);
  auto a = reg.Open("job1", "secret", Cred(1000), "test");
  ASSERT_TRUE(a.ok()) << a.status();
  auto wrong = reg.Open("job1", "guess", Cred(1000), "test");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(wrong.status().message(), HasSubstr("first session set"));
  auto b = reg.Open("job1", "secret", Cred(1000), "test");
  ASSERT_TRUE(b.ok());
  EXPECT_NE((*a)->id(), (*b)->id());
  EXPECT_EQ(reg.jobs(), 1u);
  EXPECT_TRUE(reg.Remove(*a));
  EXPECT_FALSE(reg.Remove(*a));  // idempotent
  EXPECT_EQ(reg.Open("job1", "other", Cred(1000), "t").status().code(),
            absl::StatusCode::kPermissionDenied);  // b still holds the token
  EXPECT_TRUE(reg.Remove(*b));
  EXPECT_EQ(reg.jobs(), 0u);
  EXPECT_TRUE(reg.Open("job1", "other", Cred(1000), "t").ok());  // a new job of that name
}

TEST_F(SessionRegistryTest, WithNoAuthenticationConfiguredEveryConnectIsRefusedSayingWhatToSet) {
  SessionRegistry reg(SessionAuth{}, &limits_);
  EXPECT_FALSE(reg.accepts_anyone());
  auto s = reg.Open("job1", "anything", Cred(0), "t");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.status().message(), HasSubstr("--token_key_file"));
  EXPECT_THAT(s.status().message(), HasSubstr("--insecure_first_session_token"));
  EXPECT_EQ(reg.jobs(), 0u);  // a refused connect squats nothing
}

TEST_F(SessionRegistryTest, FixedTokensAdmitOnlyListedJobsAndNeverFallBackToTheFirstSessionRule) {
  SessionAuth auth;
  auth.fixed_tokens = {{"train", "t0k3n"}};
  SessionRegistry reg(auth, &limits_);
  EXPECT_TRUE(reg.Open("train", "t0k3n", Cred(1), "c").ok());
  auto wrong = reg.Open("train", "t0k3", Cred(1), "c");  // a prefix of the token
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(wrong.status().message(), HasSubstr("wrong token for job train"));
  auto unlisted = reg.Open("other", "t0k3n", Cred(1), "c");
  EXPECT_EQ(unlisted.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(unlisted.status().message(), HasSubstr("not listed"));
}

TEST_F(SessionRegistryTest, SignedTokensGoToTheVerifierAndItsReasonComesBack) {
  SessionAuth auth;
  auth.is_signed = [](const std::string& t) { return t.rfind("ryt1.", 0) == 0; };
  auth.verify_signed = [](const std::string& token, const std::string& job) {
    if (token == "ryt1.good." + job) return absl::OkStatus();
    return absl::PermissionDeniedError("token expired at 2026-01-01T00:00:00Z");
  };
  auth.fixed_tokens = {{"static", "s3cret"}};
  SessionRegistry reg(auth, &limits_);
  EXPECT_TRUE(reg.Open("jobA", "ryt1.good.jobA", Cred(1), "c").ok());
  auto foreign = reg.Open("jobB", "ryt1.good.jobA", Cred(1), "c");
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(foreign.status().message(), HasSubstr("expired"));
  auto unsigned_token = reg.Open("jobA", "plain", Cred(1), "c");
  EXPECT_EQ(unsigned_token.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(unsigned_token.status().message(), HasSubstr("needs a signed token"));
  auto none = reg.Open("jobA", "", Cred(1), "c");
  EXPECT_THAT(none.status().message(), HasSubstr("none was given"));
  EXPECT_TRUE(reg.Open("static", "s3cret", Cred(1), "c").ok());  // the static file still works
}

TEST_F(SessionRegistryTest, ThePeerPolicyAdmitsOnlyItsUidsAndGidsAndTheStarRuleCoversTheRest) {
  auto policy = JobPolicy::Parse("# tenants\njobA uids=1000,1001\n* gids=500\n");
  ASSERT_TRUE(policy.ok()) << policy.status();
  SessionAuth auth = Insecure();
  auth.policy = *policy;
  SessionRegistry reg(auth, &limits_);
  EXPECT_TRUE(reg.Open("jobA", "t", Cred(1001, 7), "c").ok());
  auto denied = reg.Open("jobA", "t", Cred(2000, 500), "c");  // gid 500 is only for other jobs
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(denied.status().message(), HasSubstr("uid 2000 gid 500 may not connect as job jobA"));
  EXPECT_TRUE(reg.Open("jobB", "t", Cred(2000, 500), "c").ok());
  auto other = reg.Open("jobB", "t", Cred(2001, 501), "c");
  EXPECT_THAT(other.status().message(), HasSubstr("for jobs without a rule"));
}

TEST_F(SessionRegistryTest, PolicyFilesWithBadLinesAreRefusedNamingTheLine) {
  EXPECT_THAT(JobPolicy::Parse("jobA uids=10\njobA uids=11\n").status().message(),
              HasSubstr("line 2: jobA has a rule already"));
  EXPECT_THAT(JobPolicy::Parse("jobA\n").status().message(), HasSubstr("line 1"));
  EXPECT_THAT(JobPolicy::Parse("jobA uids=1,x\n").status().message(), HasSubstr("decimal"));
  EXPECT_THAT(JobPolicy::Parse("jobA uids=99999999999\n").status().message(), HasSubstr("decimal"));
  EXPECT_THAT(JobPolicy::Parse("bad/job uids=1\n").status().message(), HasSubstr("line 1"));
  EXPECT_THAT(JobPolicy::Parse("j pids=1\n").status().message(), HasSubstr("unknown field"));
}

TEST_F(SessionRegistryTest, SessionLimitsPerDaemonAndPerJobAreResourceExhaustedNamingTheFlag) {
  limits_.max_sessions = 3;
  limits_.max_sessions_per_job = 2;
  SessionRegistry reg(Insecure(), &limits_);
  auto a1 = reg.Open("a", "t", Cred(1), "c");
  auto a2 = reg.Open("a", "t", Cred(1), "c");
  ASSERT_TRUE(a1.ok() && a2.ok());
  auto a3 = reg.Open("a", "t", Cred(1), "c");
  EXPECT_EQ(a3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(a3.status().message(), HasSubstr("--max_sessions_per_job"));
  ASSERT_TRUE(reg.Open("b", "t", Cred(1), "c").ok());
  auto c = reg.Open("c", "t", Cred(1), "c");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("--max_sessions)"));
  EXPECT_TRUE(reg.Remove(*a1));
  EXPECT_TRUE(reg.Open("c", "t", Cred(1), "c").ok());  // a freed place is usable again
}

TEST_F(SessionRegistryTest, SessionsOfAJobShareItsCountersAndOtherJobsDoNot) {
  limits_.per_session[static_cast<int>(Resource::kBuffers)] = 3;
  limits_.per_job[static_cast<int>(Resource::kBuffers)] = 4;
  SessionRegistry reg(Insecure(), &limits_);
  auto a1 = *reg.Open("a", "t", Cred(1), "c");
  auto a2 = *reg.Open("a", "t", Cred(1), "c");
  auto b = *reg.Open("b", "t", Cred(1), "c");
  ASSERT_TRUE(a1->quota()->Charge(Resource::kBuffers, 3).ok());
  absl::Status over = a1->quota()->Charge(Resource::kBuffers, 1);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("--max_buffers_per_session"));
  ASSERT_TRUE(a2->quota()->Charge(Resource::kBuffers, 1).ok());
  over = a2->quota()->Charge(Resource::kBuffers, 1);
  EXPECT_THAT(over.message(), HasSubstr("limit of this job (4) reached: it holds 4"));
  EXPECT_THAT(over.message(), HasSubstr("--max_buffers_per_job"));
  EXPECT_EQ(a2->quota()->used(Resource::kBuffers), 1u);         // the refused charge took nothing
  EXPECT_TRUE(b->quota()->Charge(Resource::kBuffers, 3).ok());  // job b is untouched by a
  a1->quota()->Release(Resource::kBuffers, 2);
  EXPECT_TRUE(a2->quota()->Charge(Resource::kBuffers, 2).ok());
  EXPECT_EQ(a1->quota()->job().used(Resource::kBuffers), 4u);
}

TEST_F(SessionRegistryTest, QuotaChargesAreReleasedWhenTheirHolderGoesAndHugeAsksDoNotWrap) {
  limits_.per_session[static_cast<int>(Resource::kQueuedOps)] = 2;
  limits_.per_job[static_cast<int>(Resource::kQueuedOps)] = 0;  // unlimited per job
  SessionRegistry reg(Insecure(), &limits_);
  auto s = *reg.Open("a", "t", Cred(1), "c");
  {
    QuotaCharge one, two, three;
    ASSERT_TRUE(QuotaCharge::Take(s->quota(), Resource::kQueuedOps, 1, &one).ok());
    ASSERT_TRUE(QuotaCharge::Take(s->quota(), Resource::kQueuedOps, 1, &two).ok());
    EXPECT_EQ(QuotaCharge::Take(s->quota(), Resource::kQueuedOps, 1, &three).code(),
              absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(three.amount(), 0u);
    QuotaCharge moved = std::move(one);
    EXPECT_EQ(s->quota()->used(Resource::kQueuedOps), 2u);
    EXPECT_EQ(s->quota()->CheckBelow(Resource::kQueuedOps).code(),
              absl::StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(s->quota()->used(Resource::kQueuedOps), 0u);
  EXPECT_EQ(s->quota()->Charge(Resource::kQueuedOps, UINT64_MAX).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(s->quota()->Charge(Resource::kComms, 0).ok());
}

TEST_F(SessionRegistryTest, BadJobIdsUnknownSessionsAndShutdown) {
  SessionRegistry reg(Insecure(), &limits_);
  EXPECT_EQ(reg.Open("bad job!", "", Cred(1), "c").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Open(std::string(200, 'x'), "", Cred(1), "c").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Find("nope").status().code(), absl::StatusCode::kNotFound);
  auto s = reg.Open("j", "", Cred(1, 2, 77), "c");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->cred().uid, 1u);
  EXPECT_EQ((*s)->pid(), 77);
  auto found = reg.Find((*s)->id());
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, *s);
  EXPECT_EQ(reg.Close().size(), 1u);
  EXPECT_EQ(reg.Open("j", "", Cred(1), "c").status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace railyard
