// auth::LoadPeerTls and auth::SubjectAltNames on certificates scripts/peer-certs.sh makes now
// (the openssl CLI): validity in time, wildcards, IP SANs. Refusals with real daemons are in
// tests/integration/peer_tls_test.cc.
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "daemon/auth/peer_tls.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard::auth {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class LoadPeerTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/ry-tls-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    const std::string cmd = std::string(PEER_CERTS_SCRIPT) + " " + dir_ +
                            " node-a '*.rack.test' 'node-b=10.0.0.7,fd00::7' >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  static absl::StatusOr<PeerTlsPem> Load(const std::string& cert, const std::string& node,
                                         absl::Time now = absl::Now()) {
    return LoadPeerTls(dir_ + "/" + cert + ".pem", dir_ + "/" + cert + "-key.pem", dir_ + "/ca.pem",
                       node, now);
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  static std::string dir_;
};
std::string LoadPeerTlsTest::dir_;

TEST_F(LoadPeerTlsTest, LoadsAValidCertificateForItsNode) {
  absl::StatusOr<PeerTlsPem> pem = Load("node-a", "node-a");
  ASSERT_TRUE(pem.ok()) << pem.status();
  EXPECT_EQ(pem->cert_chain, Read(dir_ + "/node-a.pem"));
  EXPECT_EQ(pem->private_key, Read(dir_ + "/node-a-key.pem"));
  EXPECT_EQ(pem->ca, Read(dir_ + "/ca.pem"));
}

TEST_F(LoadPeerTlsTest, WildcardCoversOneLabel) {
  EXPECT_TRUE(Load("_.rack.test", "gpu3.rack.test").ok());
  absl::StatusOr<PeerTlsPem> deeper = Load("_.rack.test", "a.gpu3.rack.test");
  EXPECT_EQ(deeper.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(deeper.status().message(), HasSubstr("SANs: DNS:*.rack.test, IP:127.0.0.1"));
}

TEST_F(LoadPeerTlsTest, RefusesOutsideTheValidityPeriod) {
  // peer-certs.sh makes certificates valid for 30 days from now.
  absl::StatusOr<PeerTlsPem> expired = Load("node-a", "node-a", absl::Now() + absl::Hours(24 * 40));
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(expired.status().message(), HasSubstr("certificate has expired"));
  absl::StatusOr<PeerTlsPem> early = Load("node-a", "node-a", absl::Now() - absl::Hours(24));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.status().message(), HasSubstr("certificate is not yet valid"));
}

TEST_F(LoadPeerTlsTest, RefusesAKeyFileThatIsACertificate) {
  absl::StatusOr<PeerTlsPem> pem = LoadPeerTls(dir_ + "/node-a.pem", dir_ + "/node-a.pem",
                                               dir_ + "/ca.pem", "node-a", absl::Now());
  EXPECT_EQ(pem.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pem.status().message(),
              HasSubstr("--peer_tls_key " + dir_ + "/node-a.pem: not an unencrypted PEM"));
}

TEST_F(LoadPeerTlsTest, SubjectAltNamesByType) {
  absl::StatusOr<CertNames> names = SubjectAltNames(Read(dir_ + "/node-b.pem"));
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(names->dns, ElementsAre("node-b"));
  EXPECT_THAT(names->ips, ElementsAre("10.0.0.7", "fd00::7"));
  EXPECT_EQ(names->ToString(), "DNS:node-b, IP:10.0.0.7, IP:fd00::7");
  EXPECT_EQ(SubjectAltNames("not pem").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CertNamesHostTest, IpsAgainstIpSansNamesAgainstDnsSans) {
  CertNames names;
  names.dns = {"node-b", "*.rack.test"};
  names.ips = {"10.0.0.7", "fd00::7"};
  EXPECT_TRUE(CertNamesHost(names, "10.0.0.7"));
  EXPECT_TRUE(CertNamesHost(names, "fd00:0::7"));  // normalised
  EXPECT_TRUE(CertNamesHost(names, "[fd00::7]"));
  EXPECT_TRUE(CertNamesHost(names, "node-b"));
  EXPECT_TRUE(CertNamesHost(names, "gpu1.rack.test"));
  EXPECT_FALSE(CertNamesHost(names, "127.0.0.1"));
  EXPECT_FALSE(CertNamesHost(names, "node-c"));
}

}  // namespace
}  // namespace railyard::auth
