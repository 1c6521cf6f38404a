// DigestSummary (daemon/comm/digest_summary.h): what a group of nodes knows of its digests, on the
// wire and merged. A summary comes from another daemon: each malformed field is refused with a
// message saying what; merging is the same on every node whatever groups it sees first.
#include "daemon/comm/digest_summary.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;
using Kind = DigestSummary::Kind;

OpDigest Count(uint64_t count) {
  scheduler::RankRequest r;
  r.op = scheduler::OpKind::kAllReduce;
  r.dtype = kernels::DataType::kFloat32;
  r.count = count;
  return OpDigest::Of(r, 3, "ring");
}

std::string Name(int n) { return "n" + std::to_string(n); }
std::vector<int> Ranks(int n) { return {2 * n, 2 * n + 1}; }

absl::StatusOr<std::pair<DigestSummary, size_t>> RoundTrip(const DigestSummary& s, int nodes = 8) {
  DigestSummary::Wire w;
  const size_t len = s.Encode(&w);
  return DigestSummary::Decode(w.data(), len, nodes);
}

TEST(DigestSummaryTest, EveryKindRoundTripsAtItsLength) {
  auto agree = RoundTrip(DigestSummary::Of(5, Count(10)));
  ASSERT_TRUE(agree.ok()) << agree.status();
  EXPECT_EQ(agree->second, DigestSummary::kAgreeBytes);
  EXPECT_EQ(agree->first.kind, Kind::kAgree);
  EXPECT_EQ(agree->first.a, 5);
  EXPECT_EQ(agree->first.da.count, 10u);

  const DigestSummary dis =
      DigestSummary::Merge(DigestSummary::Of(1, Count(10)), DigestSummary::Of(6, Count(20)));
  auto d = RoundTrip(dis);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->second, DigestSummary::kMaxBytes);
  EXPECT_EQ(d->first.kind, Kind::kDisagree);
  EXPECT_EQ(d->first.a, 1);
  EXPECT_EQ(d->first.b, 6);
  EXPECT_EQ(d->first.da.count, 10u);
  EXPECT_EQ(d->first.db.count, 20u);

  auto u =
      RoundTrip(DigestSummary::Unreadable(2, 3, std::string("bad\x01") + std::string(90, 'x')));
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->first.kind, Kind::kUnreadable);
  EXPECT_EQ(u->first.reason, "bad?" + std::string(DigestSummary::kMaxReason - 4, 'x'));

  auto m = RoundTrip(DigestSummary::Missing(4, 0, absl::UnavailableError("gone")));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->first.kind, Kind::kMissing);
  EXPECT_EQ(m->first.reason, "UNAVAILABLE: gone");
}

TEST(DigestSummaryTest, MalformedSummariesAreRefusedSayingWhat) {
  DigestSummary::Wire good;
  const size_t len = DigestSummary::Of(1, Count(10)).Encode(&good);
  struct Case {
    std::string name;
    size_t offset;
    uint8_t value;
    size_t length;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"short", 0, 1, 10, "a 10-byte operation digest, not 80"},
      {"kind", 0, 9, len, "kind 9, unknown"},
      {"kind zero", 0, 0, len, "kind 0, unknown"},
      {"padding", 2, 1, len, "nonzero padding"},
      {"padding after b", 13, 1, len, "nonzero padding"},
      {"node a", 4, 8, len, "node 8 of 8"},
      {"second node", 8, 3, len, "a second node in an agreement"},
      {"digest magic", 16, 0, len, "bad magic"},
      {"disagree too short", 0, 2, len, "a 80-byte operation digest, not 144"},
  };
  for (const Case& c : cases) {
    DigestSummary::Wire w = good;
    w[c.offset] = std::byte{c.value};
    auto got = DigestSummary::Decode(w.data(), c.length, 8);
    ASSERT_FALSE(got.ok()) << c.name;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.says)) << c.name;
  }
  // A disagreement between equal digests, a node against itself, an unprintable reason.
  DigestSummary eq;
  eq.kind = Kind::kDisagree;
  eq.a = 0;
  eq.b = 1;
  eq.da = eq.db = Count(4);
  EXPECT_THAT(std::string(RoundTrip(eq).status().message()), HasSubstr("equal digests"));
  eq.db = Count(5);
  eq.b = 0;
  EXPECT_THAT(std::string(RoundTrip(eq).status().message()), HasSubstr("node 0 against itself"));
  DigestSummary::Wire w;
  const size_t ulen = DigestSummary::Unreadable(0, 1, "why").Encode(&w);
  w[DigestSummary::kHeaderBytes + OpDigest::kBytes + 1] = std::byte{0x07};
  EXPECT_THAT(std::string(DigestSummary::Decode(w.data(), ulen, 8).status().message()),
              HasSubstr("unprintable reason"));
}

TEST(DigestSummaryTest, MergeRanksDisagreementOverMissingOverAgreementLowerFirst) {
  const DigestSummary a0 = DigestSummary::Of(0, Count(1));
  const DigestSummary a1 = DigestSummary::Of(1, Count(1));
  const DigestSummary a2 = DigestSummary::Of(2, Count(2));
  EXPECT_EQ(DigestSummary::Merge(a0, a1).kind, Kind::kAgree);
  EXPECT_EQ(DigestSummary::Merge(a0, a1).a, 0);
  const DigestSummary d02 = DigestSummary::Merge(a0, a2);
  EXPECT_EQ(d02.kind, Kind::kDisagree);
  const DigestSummary miss = DigestSummary::Missing(3, 4, absl::UnavailableError("x"));
  EXPECT_EQ(DigestSummary::Merge(miss, a1).kind, Kind::kMissing);
  EXPECT_EQ(DigestSummary::Merge(a1, miss).kind, Kind::kMissing);
  EXPECT_EQ(DigestSummary::Merge(miss, d02).kind, Kind::kDisagree);
  const DigestSummary bad = DigestSummary::Unreadable(5, 6, "junk");
  EXPECT_EQ(DigestSummary::Merge(d02, bad).kind, Kind::kDisagree);  // equals: the lower's
  EXPECT_EQ(DigestSummary::Merge(bad, d02).kind, Kind::kUnreadable);
}

TEST(DigestSummaryTest, VerdictsNameBothSidesOnEveryNode) {
  const DigestSummary d =
      DigestSummary::Merge(DigestSummary::Of(1, Count(10)), DigestSummary::Of(6, Count(20)));
  for (int me : {1, 6, 3}) {
    const absl::Status s = d.Verdict(3, me, Name, Ranks);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("nodes disagree at seq 3 on count"));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("n1 ranks 2-3 submitted allreduce float count=10"));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("n6 ranks 12-13 submitted allreduce float count=20"));
  }
  // The node's own side last, as DisagreementError words it.
  EXPECT_THAT(std::string(d.Verdict(3, 6, Name, Ranks).message()),
              HasSubstr("count=10 (40 B) sum; n6"));
  const DigestSummary u = DigestSummary::Unreadable(2, 5, "a 9-byte operation digest, not 80");
  EXPECT_EQ(u.Verdict(3, 2, Name, Ranks),
            absl::InvalidArgumentError("seq 3: n5 sent a 9-byte operation digest, not 80"));
  EXPECT_EQ(u.Verdict(3, 0, Name, Ranks),
            absl::InvalidArgumentError("seq 3: n5 sent n2 a 9-byte operation digest, not 80"));
  const DigestSummary m = DigestSummary::Missing(2, 5, absl::UnavailableError("gone"));
  EXPECT_TRUE(m.Verdict(3, 2, Name, Ranks).ok());  // its receive's own status says it
  EXPECT_EQ(m.Verdict(3, 0, Name, Ranks).code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(m.Verdict(3, 0, Name, Ranks).message()),
              HasSubstr("n2 did not receive n5's operation digest: UNAVAILABLE: gone"));
  EXPECT_TRUE(DigestSummary::Of(0, Count(1)).Verdict(3, 0, Name, Ranks).ok());
}

}  // namespace
}  // namespace railyard
