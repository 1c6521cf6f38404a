// Mutual TLS on the peer plane with real daemons and certificates made at test time: what a
// daemon refuses to start with (no security said, a partial set, unreadable files, a certificate
// not naming its node or from another CA), and what daemons that do not trust each other cannot
// do (form a communicator). The multi-node matrix itself runs over TLS (multinode_test.cc).
#include "tests/integration/peer_tls.h"

#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"

namespace railyard::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class PeerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    // Two unrelated cluster CAs.
    MakePeerCerts(dir_ + "/a", {"vnode0", "vnode1", "other-node", "*.rack.test"});
    MakePeerCerts(dir_ + "/b", {"vnode1"});
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string a() const { return dir_ + "/a"; }
  std::string b() const { return dir_ + "/b"; }

  // Starts a daemon named node with flags and expects it to refuse: its exit code and log.
  std::pair<int, std::string> Refused(const std::string& node, std::vector<std::string> flags) {
    flags.insert(flags.begin(), {"--node_name=" + node, "--peer_listen=127.0.0.1:0"});
    DaemonProcess d(flags);
    auto code = d.process().Wait(std::chrono::seconds(10));
    EXPECT_TRUE(code.has_value()) << "the daemon started:\n" << d.Log();
    EXPECT_FALSE(d.ready());
    return {code.value_or(-1), d.Log()};
  }

  // A daemon named node (from its topology file) with flags; it must serve.
  std::unique_ptr<DaemonProcess> Serving(const std::string& node, std::vector<std::string> flags) {
    const std::string topo = dir_ + "/" + node + ".json";
    std::ofstream(topo) << "{\"node\": \"" << node
                        << "\", \"rails\": [{\"name\": \"rail0\", \"device\": \"lo\"}]}\n";
    flags.insert(flags.end(), {"--peer_listen=127.0.0.1:0", "--topology=" + topo});
    auto d = std::make_unique<DaemonProcess>(flags);
    EXPECT_TRUE(d->ready()) << d->Log();
    return d;
  }

  std::string dir_;
};

TEST_F(PeerTlsTest, RefusesPeerListenWithNeitherTlsNorPeerInsecure) {
  auto [code, log] = Refused("vnode0", {});
  EXPECT_EQ(code, 2) << log;
  EXPECT_THAT(log, AllOf(HasSubstr("--peer_listen needs the peer service's mutual TLS"),
                         HasSubstr("--peer_tls_cert"), HasSubstr("--peer_tls_key"),
                         HasSubstr("--peer_tls_ca"), HasSubstr("or --peer_insecure")));
}

TEST_F(PeerTlsTest, RefusesAPartialSetNamingTheMissingFlag) {
  auto [code, log] = Refused(
      "vnode0", {"--peer_tls_cert=" + a() + "/vnode0.pem", "--peer_tls_ca=" + a() + "/ca.pem"});
  EXPECT_EQ(code, 2) << log;
  EXPECT_THAT(log, HasSubstr("mutual TLS of the peer service is incomplete: --peer_tls_cert, "
                             "--peer_tls_ca given but --peer_tls_key missing"));
}

TEST_F(PeerTlsTest, RefusesTlsTogetherWithPeerInsecure) {
  std::vector<std::string> flags = PeerTlsFlags(a(), "vnode0");
  flags.push_back("--peer_insecure");
  auto [code, log] = Refused("vnode0", flags);
  EXPECT_EQ(code, 2) << log;
  EXPECT_THAT(log, HasSubstr("--peer_insecure and --peer_tls_cert, --peer_tls_key, --peer_tls_ca "
                             "are both set"));
}

TEST_F(PeerTlsTest, RefusesUnreadableOrNonPemFilesNamingThem) {
  std::vector<std::string> flags = PeerTlsFlags(a(), "vnode0");
  flags[1] = "--peer_tls_key=" + dir_ + "/no-such-key.pem";
  auto [code, log] = Refused("vnode0", flags);
  EXPECT_EQ(code, 1) << log;
  EXPECT_THAT(log, HasSubstr("--peer_tls_key " + dir_ + "/no-such-key.pem: cannot read the file"));

  std::ofstream(dir_ + "/garbage.pem") << "this is not PEM\n";
  flags = PeerTlsFlags(a(), "vnode0");
  flags[2] = "--peer_tls_ca=" + dir_ + "/garbage.pem";
  std::tie(code, log) = Refused("vnode0", flags);
  EXPECT_EQ(code, 1) << log;
  EXPECT_THAT(log, HasSubstr("--peer_tls_ca " + dir_ + "/garbage.pem: not a PEM certificate"));

  flags = PeerTlsFlags(a(), "vnode0");
  flags[1] = "--peer_tls_key=" + a() + "/vnode1-key.pem";  // a key, but another node's
  std::tie(code, log) = Refused("vnode0", flags);
  EXPECT_EQ(code, 1) << log;
  EXPECT_THAT(log, AllOf(HasSubstr("vnode1-key.pem is not the key of certificate"),
                         HasSubstr("vnode0.pem")));
}

TEST_F(PeerTlsTest, RefusesACertificateThatDoesNotNameItsNode) {
  // The node name comes from --node_name here; a topology file's "node" counts the same.
  auto [code, log] = Refused("vnode0", PeerTlsFlags(a(), "other-node"));
  EXPECT_EQ(code, 1) << log;
  EXPECT_THAT(log,
              AllOf(HasSubstr("certificate " + a() + "/other-node.pem"),
                    HasSubstr("SANs: DNS:other-node, IP:127.0.0.1"), HasSubstr("for node 'vnode0'"),
                    HasSubstr("does not name the node in a DNS subjectAltName")));
}

TEST_F(PeerTlsTest, RefusesACertificateFromAnotherCa) {
  // vnode1's certificate from CA b, with CA a as the cluster's.
  auto [code, log] = Refused("vnode1", PeerTlsFlags(b(), "vnode1", a()));
  EXPECT_EQ(code, 1) << log;
  EXPECT_THAT(log, AllOf(HasSubstr("certificate " + b() + "/vnode1.pem"), HasSubstr("vnode1"),
                         HasSubstr("does not verify against the CA --peer_tls_ca " + a() +
                                   "/ca.pem: unable to get local issuer certificate")));
}

TEST_F(PeerTlsTest, FlagsComeFromTheEnvironmentToo) {
  const std::vector<std::string> flags = PeerTlsFlags(a(), "vnode0");
  ::setenv("RAILYARD_PEER_TLS_CERT", flags[0].substr(flags[0].find('=') + 1).c_str(), 1);
  ::setenv("RAILYARD_PEER_TLS_KEY", flags[1].substr(flags[1].find('=') + 1).c_str(), 1);
  ::setenv("RAILYARD_PEER_TLS_CA", flags[2].substr(flags[2].find('=') + 1).c_str(), 1);
  auto d = Serving("vnode0", {});
  ::unsetenv("RAILYARD_PEER_TLS_CERT");
  ::unsetenv("RAILYARD_PEER_TLS_KEY");
  ::unsetenv("RAILYARD_PEER_TLS_CA");
  EXPECT_THAT(d->Log(), HasSubstr("mutual TLS"));
  ::setenv("RAILYARD_PEER_INSECURE", "true", 1);
  auto insecure = Serving("vnode1", {});
  ::unsetenv("RAILYARD_PEER_INSECURE");
  EXPECT_THAT(insecure->Log(), HasSubstr("insecure: the peer service is plaintext"));
}

// Each rank on its own daemon joins a comm id (coordinated by daemons[0]) with timeout, then
// runs a barrier, waits linger and runs another; returns each rank's first failure (or OK).
std::vector<absl::Status> JoinAcross(std::vector<std::unique_ptr<DaemonProcess>>& daemons,
                                     std::chrono::milliseconds timeout,
                                     std::chrono::milliseconds linger = {}) {
  std::vector<std::unique_ptr<Client>> clients;
  for (auto& d : daemons) {
    auto c = Client::Connect(d->Options());
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {c.status()};
    clients.push_back(*std::move(c));
  }
  auto id = clients[0]->CreateCommId();
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return {id.status()};
  const int n = static_cast<int>(daemons.size());
  std::vector<absl::Status> got(n);
  std::vector<Comm> comms(n);
  std::vector<std::thread> joiners;
  for (int r = 0; r < n; ++r) {
    joiners.emplace_back([&, r] {
      auto m = clients[r]->InitComm(*id, r, n, timeout);
      got[r] = m.status();
      if (m.ok()) {
        comms[r] = *std::move(m);
        got[r] = comms[r].Barrier().wait(std::chrono::seconds(30));
        if (!got[r].ok()) return;
        std::this_thread::sleep_for(linger);
        got[r] = comms[r].Barrier().wait(std::chrono::seconds(30));
      }
    });
  }
  for (auto& t : joiners) t.join();
  return got;
}

TEST_F(PeerTlsTest, DaemonsOfDifferentCasCannotFormACommunicator) {
  std::vector<std::unique_ptr<DaemonProcess>> daemons;
  daemons.push_back(Serving("vnode0", PeerTlsFlags(a(), "vnode0")));
  daemons.push_back(Serving("vnode1", PeerTlsFlags(b(), "vnode1")));
  const auto start = std::chrono::steady_clock::now();
  std::vector<absl::Status> got = JoinAcross(daemons, std::chrono::milliseconds(3000));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(got.size(), 2u);
  // vnode1 never reached its coordinator: its handshake fails both ways.
  EXPECT_EQ(got[1].code(), absl::StatusCode::kUnavailable) << got[1];
  EXPECT_THAT(got[1].message(), AllOf(HasSubstr("coordinator not reached"),
                                      HasSubstr("signed by the same --peer_tls_ca")));
  EXPECT_FALSE(got[0].ok());  // the coordinator's own rank waits in vain
  std::cout << "vnode1's rank: " << got[1] << "\nvnode0's rank: " << got[0] << "\n";
  EXPECT_LT(took, std::chrono::seconds(20)) << got[0] << got[1];
  // Bounded by the request's timeout (3 s) plus the join's grace (2 s), not --init_timeout.
}

TEST_F(PeerTlsTest, APlaintextDaemonCannotJoinAnMtlsCoordinator) {
  std::vector<std::unique_ptr<DaemonProcess>> daemons;
  daemons.push_back(Serving("vnode0", PeerTlsFlags(a(), "vnode0")));
  daemons.push_back(Serving("vnode1", {"--peer_insecure"}));
  const auto start = std::chrono::steady_clock::now();
  std::vector<absl::Status> got = JoinAcross(daemons, std::chrono::milliseconds(2000));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].code(), absl::StatusCode::kUnavailable) << got[1];
  EXPECT_THAT(got[1].message(), HasSubstr("coordinator not reached"));
  EXPECT_FALSE(got[0].ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST_F(PeerTlsTest, RefusesACertificateNotNamingTheHostOthersDial) {
  // Other daemons dial a coordinator at the host its comm ids name (here 127.0.0.1) and check
  // its certificate against it: one naming DNS:vnode0 and IP 10.9.9.9 only would fail every
  // join, so the daemon does not start with it.
  MakePeerCerts(dir_ + "/c", {"vnode0=10.9.9.9"});
  auto [code, log] = Refused("vnode0", PeerTlsFlags(dir_ + "/c", "vnode0"));
  EXPECT_EQ(code, 1) << log;
  EXPECT_THAT(log, AllOf(HasSubstr("SANs: DNS:vnode0, IP:10.9.9.9) does not name 127.0.0.1, the "
                                   "host other daemons dial this one at"),
                         HasSubstr("add it to the certificate's subjectAltNames")));
}

TEST_F(PeerTlsTest, WildcardCertificatesFormACommunicator) {
  // One "*.rack.test" certificate for both nodes: their names match it (RFC 6125 wildcard), and
  // so do the names heartbeats and aborts expect; the coordinator is dialled at 127.0.0.1.
  // Heartbeats (every second, each peer's certificate checked against its layout name) must
  // keep the peers alive past --peer_timeout: the second barrier, 4 s later, still passes.
  std::vector<std::string> flags = PeerTlsFlags(a(), "_.rack.test");
  flags.push_back("--peer_timeout=2s");
  std::vector<std::unique_ptr<DaemonProcess>> daemons;
  daemons.push_back(Serving("gpu0.rack.test", flags));
  daemons.push_back(Serving("gpu1.rack.test", flags));
  std::vector<absl::Status> got =
      JoinAcross(daemons, std::chrono::milliseconds(20000), std::chrono::milliseconds(4000));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].ok()) << got[0] << daemons[0]->Log();
  EXPECT_TRUE(got[1].ok()) << got[1] << daemons[1]->Log();
  // But a node outside the wildcard's domain is refused at start.
  auto [code, log] = Refused("gpu2.rack.other", PeerTlsFlags(a(), "_.rack.test"));
  EXPECT_EQ(code, 1) << log;
  EXPECT_THAT(log, HasSubstr("DNS:*.rack.test"));
}

}  // namespace
}  // namespace railyard::testing
