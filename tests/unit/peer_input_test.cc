// What another daemon sends over the peer plane, refused before use: comm id coordinators
// (host:port or local:<node>, no gRPC target schemes). Every refusal is checked for its status
// code and for what its message names.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/comm/comm_id.h"
#include "daemon/comm/host_port.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

constexpr char kNonce[] = "0123456789abcdef0123456789abcdef";

std::string Id(const std::string& coordinator, const std::string& nonce = kNonce) {
  return absl::StrCat("ry1-", nonce, "@", coordinator);
}

TEST(HostPortTest, AcceptsDnsNamesIpv4AndBracketedIpv6WithAPort) {
  for (const char* ok : {"a:1", "node-7.cluster.example:7411", "10.0.0.1:65535", "[::1]:7070",
                         "[fe80::1]:7411", "[::ffff:10.0.0.1]:80", "localhost:00080"}) {
    EXPECT_EQ(HostPortProblem(ok), "") << ok;
  }
}

TEST(HostPortTest, RefusesGrpcTargetSchemesAndBadPorts) {
  const std::pair<const char*, const char*> bad[] = {
      {"", "empty"},
      {"host", "no :port"},
      {"host:0", "not a number in 1..65535"},
      {"host:65536", "not a number in 1..65535"},
      {"host:-1", "not a number"},
      {"host:http", "not a number"},
      {"unix:/run/x.sock", "not a number"},
      {"unix:///run/x.sock:80", "not a DNS name"},
      {"unix-abstract:foo:80", "not a DNS name"},
      {"dns:///coord:7411", "not a DNS name"},
      {"dns:coord:7411", "not a DNS name"},
      {"ipv4:10.0.0.1:7411", "neither a DNS name nor an IPv4"},
      {"ipv6:[::1]:7411", "not a DNS name"},
      {"xds:///svc:7411", "not a DNS name"},
      {"vsock:3:7411", "not a DNS name"},
      {"256.0.0.1:80", "neither a DNS name nor an IPv4"},
      {"1.2.3:80", "neither a DNS name nor an IPv4"},
      {"-a.example:80", "not a DNS name"},
      {"a..b:80", "not a DNS name"},
      {"a_b:80", "not a DNS name"},
      {"[::1:80", "bracketed IPv6"},
      {"[zz::1]:80", "bracketed IPv6"},
      {"[/tmp/s]:80", "bracketed IPv6"},
  };
  for (const auto& [text, why] : bad) {
    EXPECT_THAT(HostPortProblem(text), HasSubstr(why)) << text;
  }
  EXPECT_THAT(HostPortProblem(std::string(300, 'a') + ":1"), HasSubstr("more than 259"));
}

TEST(CommIdTest, CoordinatorsAreHostPortOrLocalNodeAndNeverAGrpcScheme) {
  for (const char* ok :
       {"10.0.0.1:7411", "[::1]:7411", "coord.example:7411", "local:node-a", "local:weird_name!"}) {
    auto id = ParseCommId(Id(ok));
    ASSERT_TRUE(id.ok()) << ok << ": " << id.status();
    EXPECT_EQ(id->coordinator, ok);
  }
  EXPECT_TRUE(IsLocalCoordinator("local:a"));
  EXPECT_FALSE(IsLocalCoordinator("a:1"));
  for (const char* bad : {"unix:/run/railyard.sock", "unix-abstract:railyard",
                          "dns:///coord.example:7411", "ipv4:10.0.0.1:7411", "ipv6:[::1]:7411",
                          "xds:///svc", "vsock:3:7411", "coord.example", "coord:0", "local:"}) {
    auto id = ParseCommId(Id(bad));
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(id.status().message()), HasSubstr("malformed comm id")) << bad;
  }
  EXPECT_THAT(std::string(ParseCommId(Id("unix:/x")).status().message()),
              HasSubstr("neither host:port nor local:<node>"));
}

}  // namespace
}  // namespace railyard
