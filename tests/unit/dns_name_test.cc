// auth::DnsNameMatches (hostnames) and auth::CertNamesNode (node names: the daemon's start-up
// check of its own certificate and PeerIdentity::MayClaimNode).
#include "daemon/auth/dns_name.h"

#include "daemon/comm/peer_identity.h"
#include "gtest/gtest.h"

namespace railyard::auth {
namespace {

TEST(DnsNameMatchesTest, ExactNamesIgnoreCaseAndOneTrailingDot) {
  EXPECT_TRUE(DnsNameMatches("node-a", "node-a"));
  EXPECT_TRUE(DnsNameMatches("Node-A.Example.com", "node-a.example.COM"));
  EXPECT_TRUE(DnsNameMatches("node-a.example.com.", "node-a.example.com"));
  EXPECT_FALSE(DnsNameMatches("node-a", "node-b"));
  EXPECT_FALSE(DnsNameMatches("node-a", "node-a.example.com"));
  EXPECT_FALSE(DnsNameMatches("", ""));
  EXPECT_FALSE(DnsNameMatches("node-a", ""));
}

TEST(DnsNameMatchesTest, WildcardIsOneWholeLeftMostLabel) {
  EXPECT_TRUE(DnsNameMatches("*.example.com", "gpu7.example.com"));
  EXPECT_TRUE(DnsNameMatches("*.EXAMPLE.com", "gpu7.example.com"));
  EXPECT_FALSE(DnsNameMatches("*.example.com", "example.com"));         // no label for '*'
  EXPECT_FALSE(DnsNameMatches("*.example.com", ".example.com"));        // empty label
  EXPECT_FALSE(DnsNameMatches("*.example.com", "a.gpu7.example.com"));  // one label only
  EXPECT_FALSE(DnsNameMatches("*.example.com", "gpu7.example.org"));
  EXPECT_FALSE(DnsNameMatches("*.com", "example.com"));  // two labels after the wildcard
  EXPECT_FALSE(DnsNameMatches("*", "node-a"));
  EXPECT_FALSE(DnsNameMatches("gpu*.example.com", "gpu7.example.com"));  // partial: never
  EXPECT_FALSE(DnsNameMatches("*.*.example.com", "a.b.example.com"));
  EXPECT_FALSE(DnsNameMatches("a.*.example.com", "a.b.example.com"));
  EXPECT_FALSE(DnsNameMatches("*.example.com", "*.example.com"));  // a claim is no pattern
}

TEST(DnsNameMatchesTest, NodeNamesAreExactStringsCaseAndDotIncluded) {
  // Found by peer_join_fuzz: a certificate for "a" let its holder join as "A". Node names are
  // compared as exact strings in layouts, membership checks and metrics.
  EXPECT_TRUE(CertNamesNode("node-a", "node-a"));
  EXPECT_TRUE(CertNamesNode("*.rack1.example.com", "gpu7.rack1.example.com"));
  EXPECT_FALSE(CertNamesNode("a", "A"));
  EXPECT_FALSE(CertNamesNode("node-a", "NODE-A"));
  EXPECT_FALSE(CertNamesNode("node-a", "node-a."));
  EXPECT_FALSE(CertNamesNode("*.rack1.example.com", "gpu7.RACK1.example.com"));
  EXPECT_TRUE(DnsNameMatches("node-a", "NODE-A"));  // as a hostname it is the same host
}

TEST(PeerIdentityTest, MayClaimNodeUsesTheSameRule) {
  PeerIdentity who;
  who.authenticated = true;
  who.peer = "ipv4:127.0.0.1:5000";
  who.dns_names = {"*.rack1.example.com"};
  who.ips = {"127.0.0.1"};
  EXPECT_TRUE(who.MayClaimNode("gpu3.rack1.example.com").ok());
  const absl::Status s = who.MayClaimNode("gpu3.rack2.example.com");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("*.rack1.example.com, 127.0.0.1"), absl::string_view::npos) << s;
  EXPECT_EQ(who.NodeOr("gpu3.rack1.example.com"), "gpu3.rack1.example.com");
  EXPECT_EQ(who.NodeOr("gpu3.rack2.example.com"), "*.rack1.example.com");
  PeerIdentity insecure;
  EXPECT_TRUE(insecure.MayClaimNode("anything").ok());
  EXPECT_EQ(insecure.NodeOr("anything"), "anything");
}

}  // namespace
}  // namespace railyard::auth
