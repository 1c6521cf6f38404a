// What another daemon sends over the peer plane, refused before use: comm id coordinators
// (host:port or local:<node>, no gRPC target schemes), JoinComm requests at the coordinator
// (daemon/comm/peer_input.h), the layouts members receive, the bootstrap's job binding and
// bounds, and DaemonCore's Heartbeat and AbortComm membership checks. Every refusal is checked
// for its status code and for the field its message names.
#include "daemon/comm/peer_input.h"

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/comm/bootstrap.h"
#include "daemon/comm/comm_id.h"
#include "daemon/comm/host_port.h"
#include "daemon/comm/peer_identity.h"
#include "daemon/core/daemon_core.h"
#include "daemon/util/deadline_timer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fakes.h"

namespace railyard {
namespace {

using ::testing::HasSubstr;

constexpr char kNonce[] = "0123456789abcdef0123456789abcdef";
constexpr char kCoordinator[] = "coord.example:7411";

std::string Id(const std::string& coordinator, const std::string& nonce = kNonce) {
  return absl::StrCat("ry1-", nonce, "@", coordinator);
}

// A verified peer whose certificate names `names` (what mutual TLS fills in).
PeerIdentity Certified(std::vector<std::string> names) {
  PeerIdentity who;
  who.authenticated = true;
  who.dns_names = std::move(names);
  who.peer = "ipv4:10.0.0.9:5555";
  return who;
}

PeerIdentity Insecure() {
  PeerIdentity who;
  who.peer = "ipv4:10.0.0.9:5555";
  return who;
}

void ExpectRefused(const absl::Status& s, absl::StatusCode code, const std::string& says) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(says));
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
              HasSubstr("coordinator is not host:port or local:<node>: port"));
}

v1::JoinCommRequest GoodJoin() {
  v1::JoinCommRequest req;
  req.set_job_id("job-1");
  req.set_comm_id(Id(kCoordinator));
  req.set_rank(1);
  req.set_nranks(4);
  v1::NodeInfo* n = req.mutable_node();
  n->set_node_name("node-b.example");
  n->set_peer_address("node-b.example:7411");
  n->add_rail_addresses("00ff");
  n->add_rail_addresses("01ff");
  n->set_tag_slot(7);
  n->set_data_plane_version(kDataPlaneVersion);
  req.set_integrity("crc32c");
  return req;
}

TEST(CheckJoinRequestTest, AcceptsAWellFormedJoinFromTheNodeItClaims) {
  EXPECT_TRUE(CheckJoinRequest(Certified({"node-b.example"}), GoodJoin(), kCoordinator).ok());
  EXPECT_TRUE(CheckJoinRequest(Insecure(), GoodJoin(), kCoordinator).ok());
  v1::JoinCommRequest own = GoodJoin();  // this daemon's own rank, without a peer service
  own.mutable_node()->clear_peer_address();
  EXPECT_TRUE(CheckJoinRequest(PeerIdentity::Self(), own, kCoordinator).ok());
  for (const char* mode : {"", "none", "crc32c"}) {
    v1::JoinCommRequest req = GoodJoin();
    req.set_integrity(mode);
    EXPECT_TRUE(CheckJoinRequest(Insecure(), req, kCoordinator).ok()) << mode;
  }
}

TEST(CheckJoinRequestTest, EveryBadFieldIsInvalidArgumentNamingIt) {
  struct Case {
    const char* what;
    std::function<void(v1::JoinCommRequest&)> spoil;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"empty job", [](auto& r) { r.set_job_id(""); }, "JoinCommRequest.job_id"},
      {"job with space", [](auto& r) { r.set_job_id("a b"); },
       "JoinCommRequest.job_id 'a b' is not [A-Za-z0-9._-]{1,128}"},
      {"long job", [](auto& r) { r.set_job_id(std::string(129, 'j')); }, "JoinCommRequest.job_id"},
      {"malformed comm id", [](auto& r) { r.set_comm_id("c"); },
       "JoinCommRequest.comm_id: malformed comm id"},
      {"scheme coordinator", [](auto& r) { r.set_comm_id(Id("unix:/run/x.sock")); },
       "JoinCommRequest.comm_id: malformed comm id"},
      {"another coordinator", [](auto& r) { r.set_comm_id(Id("other.example:7411")); },
       "JoinCommRequest.comm_id names coordinator other.example:7411, not this daemon "
       "(coord.example:7411)"},
      {"local coordinator", [](auto& r) { r.set_comm_id(Id("local:coord")); },
       "names coordinator local:coord"},
      {"nranks 0", [](auto& r) { r.set_nranks(0); }, "JoinCommRequest.nranks 0 not in [1, 65536]"},
      {"nranks huge", [](auto& r) { r.set_nranks(1 << 20); }, "JoinCommRequest.nranks 1048576"},
      {"rank past", [](auto& r) { r.set_rank(4); }, "JoinCommRequest.rank 4 not in [0, 4)"},
      {"rank negative", [](auto& r) { r.set_rank(-1); }, "JoinCommRequest.rank -1"},
      {"no node", [](auto& r) { r.clear_node(); }, "JoinCommRequest.node.node_name is empty"},
      {"long node name", [](auto& r) { r.mutable_node()->set_node_name(std::string(256, 'n')); },
       "JoinCommRequest.node.node_name is 256 bytes, more than 255"},
      {"control in name", [](auto& r) { r.mutable_node()->set_node_name("a\nb"); },
       "JoinCommRequest.node.node_name has byte 0x0a at 1"},
      {"space in name", [](auto& r) { r.mutable_node()->set_node_name("a b"); },
       "JoinCommRequest.node.node_name has byte 0x20"},
      {"utf-8 in name", [](auto& r) { r.mutable_node()->set_node_name("n\xc3\xa9"); },
       "JoinCommRequest.node.node_name has byte 0xc3"},
      {"no peer address", [](auto& r) { r.mutable_node()->clear_peer_address(); },
       "JoinCommRequest.node.peer_address '' is not host:port"},
      {"scheme peer address",
       [](auto& r) { r.mutable_node()->set_peer_address("unix:/run/railyard.sock"); },
       "JoinCommRequest.node.peer_address 'unix:/run/railyard.sock' is not host:port"},
      {"too many rails",
       [](auto& r) {
         for (int i = 0; i < kMaxRailAddresses; ++i) r.mutable_node()->add_rail_addresses("aa");
       },
       "JoinCommRequest.node.rail_addresses has 66 entries, more than 64"},
      {"huge rail address",
       [](auto& r) {
         r.mutable_node()->add_rail_addresses("a");
         r.mutable_node()->add_rail_addresses(std::string(70000, 'f'));
       },
       "JoinCommRequest.node.rail_addresses[3] is 70000 bytes, more than 16384"},
      {"wide tag slot", [](auto& r) { r.mutable_node()->set_tag_slot(1u << 16); },
       "JoinCommRequest.node.tag_slot 65536 does not fit 16 bits"},
      {"tiny paced chunk", [](auto& r) { r.mutable_node()->set_paced_chunk_bytes(4096); },
       "JoinCommRequest.node.paced_chunk_bytes 4096 is neither 0 nor in [16384, 1073741824]"},
      {"huge paced chunk",
       [](auto& r) { r.mutable_node()->set_paced_chunk_bytes(uint64_t{1} << 40); },
       "JoinCommRequest.node.paced_chunk_bytes 1099511627776 is neither 0 nor in"},
      {"unknown integrity", [](auto& r) { r.set_integrity("sha256"); },
       "JoinCommRequest.integrity 'sha256' is not one of"},
  };
  for (const Case& c : cases) {
    v1::JoinCommRequest req = GoodJoin();
    c.spoil(req);
    ExpectRefused(CheckJoinRequest(Insecure(), req, kCoordinator),
                  absl::StatusCode::kInvalidArgument, c.says);
  }
  // The same node address from this daemon itself still has to be host:port when it is set.
  v1::JoinCommRequest own = GoodJoin();
  own.mutable_node()->set_peer_address("dns:///x:1");
  ExpectRefused(CheckJoinRequest(PeerIdentity::Self(), own, kCoordinator),
                absl::StatusCode::kInvalidArgument, "JoinCommRequest.node.peer_address");
}

TEST(CheckJoinRequestTest, AVerifiedPeerMayOnlyJoinAsANodeItsCertificateNames) {
  ExpectRefused(CheckJoinRequest(Certified({"node-c.example"}), GoodJoin(), kCoordinator),
                absl::StatusCode::kPermissionDenied,
                "JoinCommRequest.node.node_name: peer ipv4:10.0.0.9:5555 claims node "
                "'node-b.example'");
  // A malformed name is refused as such before the claim is weighed.
  v1::JoinCommRequest req = GoodJoin();
  req.mutable_node()->set_node_name("");
  ExpectRefused(CheckJoinRequest(Certified({"node-c.example"}), req, kCoordinator),
                absl::StatusCode::kInvalidArgument, "node_name is empty");
}

// A rolling upgrade half done: a member of another data-plane version (or of none: a daemon from
// before versions were announced) is refused with FAILED_PRECONDITION naming it and both
// versions, once everything else checked out; this daemon's own joins carry its own.
TEST(CheckJoinRequestTest, AMemberOfAnotherDataPlaneVersionIsRefusedNamingBoth) {
  for (uint32_t version : {0u, kDataPlaneVersion + 1}) {
    v1::JoinCommRequest req = GoodJoin();
    req.mutable_node()->set_data_plane_version(version);
    const std::string says =
        version == 0 ? "speaks no data-plane version (a railyardd from before versions were "
                       "announced)"
                     : absl::StrCat("speaks data-plane version ", version);
    ExpectRefused(CheckJoinRequest(Insecure(), req, kCoordinator),
                  absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("JoinCommRequest.node.data_plane_version: node node-b.example ",
                               says, ", this daemon ", kDataPlaneVersion,
                               "; every daemon of a communicator must speak the same one"));
    // A malformed field is still named as such first.
    req.set_job_id("");
    ExpectRefused(CheckJoinRequest(Insecure(), req, kCoordinator),
                  absl::StatusCode::kInvalidArgument, "JoinCommRequest.job_id");
  }
  v1::JoinCommRequest own = GoodJoin();
  own.mutable_node()->clear_peer_address();
  own.mutable_node()->set_data_plane_version(0);
  EXPECT_TRUE(CheckJoinRequest(PeerIdentity::Self(), own, kCoordinator).ok());
}

TEST(IntegrityTest, TheStrongestAskedForWins) {
  EXPECT_EQ(StrongerIntegrity("", ""), "");
  EXPECT_EQ(StrongerIntegrity("none", ""), "");
  EXPECT_EQ(StrongerIntegrity("none", "crc32c"), "crc32c");
  EXPECT_EQ(StrongerIntegrity("crc32c", ""), "crc32c");
}

// --- The bootstrap at the coordinator: job binding, bounds, what the layout carries. ---

v1::JoinCommRequest JoinOf(const std::string& job, const std::string& comm, int rank, int nranks,
                           const std::string& node, const std::string& integrity = "") {
  v1::JoinCommRequest req;
  req.set_job_id(job);
  req.set_comm_id(comm);
  req.set_rank(rank);
  req.set_nranks(nranks);
  req.mutable_node()->set_node_name(node);
  req.mutable_node()->set_peer_address(node + ":1");
  req.mutable_node()->add_rail_addresses("aa");
  req.mutable_node()->set_tag_slot(3);
  req.set_integrity(integrity);
  return req;
}

struct Answers {
  std::vector<absl::StatusOr<v1::JoinCommResponse>> got;
  CommBootstrap::Done Done() {
    return [this](const absl::StatusOr<v1::JoinCommResponse>& r) { got.push_back(r); };
  }
};

class BootstrapTest : public ::testing::Test {
 protected:
  testing::FakeClock clock_;
  DeadlineTimer timer_{&clock_};
};

TEST_F(BootstrapTest, ACommIdIsBoundToItsFirstJobWhilePendingAndAfterItFormed) {
  CommBootstrap bootstrap(&timer_);
  Answers a;
  const std::string comm = Id(kCoordinator);
  ASSERT_TRUE(bootstrap.Join(JoinOf("job-a", comm, 0, 2, "a"), absl::Seconds(5), a.Done()).ok());
  const absl::Status pending =
      bootstrap.Join(JoinOf("job-b", comm, 1, 2, "b"), absl::Seconds(5), a.Done());
  ExpectRefused(pending, absl::StatusCode::kPermissionDenied,
                absl::StrCat("communicator ", comm, " belongs to another job"));
  EXPECT_THAT(std::string(pending.message()), ::testing::Not(HasSubstr("job-a")));
  EXPECT_THAT(std::string(pending.message()), ::testing::Not(HasSubstr("job-b")));
  EXPECT_TRUE(a.got.empty());
  ASSERT_TRUE(bootstrap.Join(JoinOf("job-a", comm, 1, 2, "b"), absl::Seconds(5), a.Done()).ok());
  ASSERT_EQ(a.got.size(), 2u);
  ASSERT_TRUE(a.got[0].ok()) << a.got[0].status();
  // Formed: another job still may not take the id, the same job may form it again.
  ExpectRefused(bootstrap.Join(JoinOf("job-b", comm, 0, 2, "b"), absl::Seconds(5), a.Done()),
                absl::StatusCode::kPermissionDenied, "belongs to another job");
  EXPECT_TRUE(bootstrap.Join(JoinOf("job-a", comm, 0, 2, "a"), absl::Seconds(5), a.Done()).ok());
}

TEST_F(BootstrapTest, FormedIdsAreRememberedUpToTheLimitOldestFirst) {
  CommBootstrap bootstrap(&timer_, {/*max_pending=*/16, /*remembered_formed=*/2});
  Answers a;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        bootstrap.Join(JoinOf("job-a", absl::StrCat("c", i), 0, 1, "a"), absl::Seconds(5), a.Done())
            .ok());
  }
  ASSERT_EQ(a.got.size(), 3u);
  // c0 was forgotten (2 remembered); c1 and c2 are still job-a's.
  EXPECT_TRUE(bootstrap.Join(JoinOf("job-b", "c0", 0, 1, "b"), absl::Seconds(5), a.Done()).ok());
  EXPECT_EQ(bootstrap.Join(JoinOf("job-b", "c2", 0, 1, "b"), absl::Seconds(5), a.Done()).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(BootstrapTest, PendingBootstrapsAreBoundedAndExpire) {
  CommBootstrap bootstrap(&timer_, {/*max_pending=*/3, /*remembered_formed=*/16});
  Answers a;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        bootstrap.Join(JoinOf("job", absl::StrCat("c", i), 0, 2, "a"), absl::Seconds(5), a.Done())
            .ok());
  }
  EXPECT_EQ(bootstrap.pending(), 3u);
  ExpectRefused(bootstrap.Join(JoinOf("job", "c3", 0, 2, "a"), absl::Seconds(5), a.Done()),
                absl::StatusCode::kResourceExhausted,
                "3 communicator bootstraps waiting for ranks, its limit (--max_pending_joins)");
  // Joining one already pending is not a new bootstrap: still accepted at the limit.
  EXPECT_TRUE(bootstrap.Join(JoinOf("job", "c0", 1, 2, "b"), absl::Seconds(5), a.Done()).ok());
  EXPECT_EQ(bootstrap.pending(), 2u);
  EXPECT_TRUE(bootstrap.Join(JoinOf("job", "c3", 0, 2, "a"), absl::Seconds(5), a.Done()).ok());
  clock_.Advance(absl::Seconds(6));
  EXPECT_EQ(timer_.RunDue(), 3);
  EXPECT_EQ(bootstrap.pending(), 0u);
  EXPECT_TRUE(bootstrap.Join(JoinOf("job", "c4", 0, 2, "a"), absl::Seconds(5), a.Done()).ok());
}

TEST_F(BootstrapTest, TheNodeBytesPendingBootstrapsHoldAreBounded) {
  v1::JoinCommRequest big = JoinOf("job", "c0", 0, 4, "a");
  big.mutable_node()->set_rail_addresses(0, std::string(4000, 'f'));
  const size_t each = big.node().ByteSizeLong();
  CommBootstrap bootstrap(&timer_, {/*max_pending=*/16, /*remembered_formed=*/16,
                                    /*max_pending_bytes=*/3 * each});
  Answers a;
  for (int r = 0; r < 3; ++r) {
    big.set_rank(r);
    ASSERT_TRUE(bootstrap.Join(big, absl::Seconds(5), a.Done()).ok()) << r;
  }
  big.set_rank(3);
  ExpectRefused(bootstrap.Join(big, absl::Seconds(5), a.Done()),
                absl::StatusCode::kResourceExhausted,
                absl::StrCat("hold ", 3 * each, " bytes of node information; this join's ", each,
                             " more would pass its limit of ", 3 * each));
  ExpectRefused(bootstrap.Join(JoinOf("job", "c1", 0, 1, "a"), absl::Seconds(5), a.Done()),
                absl::StatusCode::kResourceExhausted, "bytes of node information");
  EXPECT_EQ(bootstrap.pending_bytes(), 3 * each);
  // The deadline gives them back.
  clock_.Advance(absl::Seconds(6));
  EXPECT_EQ(timer_.RunDue(), 1);
  EXPECT_EQ(bootstrap.pending_bytes(), 0u);
  ASSERT_EQ(a.got.size(), 3u);
  EXPECT_EQ(a.got[0].status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(bootstrap.Join(big, absl::Seconds(5), a.Done()).ok());
}

TEST_F(BootstrapTest, TheLayoutCarriesAFreshSecretAndTheStrongestIntegrity) {
  CommBootstrap bootstrap(&timer_);
  std::set<uint64_t> secrets;
  for (int i = 0; i < 8; ++i) {
    Answers a;
    const std::string comm = absl::StrCat("c", i);
    ASSERT_TRUE(bootstrap
                    .Join(JoinOf("job", comm, 0, 3, "a", i % 2 ? "crc32c" : "none"),
                          absl::Seconds(5), a.Done())
                    .ok());
    ASSERT_TRUE(
        bootstrap.Join(JoinOf("job", comm, 1, 3, "b", ""), absl::Seconds(5), a.Done()).ok());
    ASSERT_TRUE(
        bootstrap.Join(JoinOf("job", comm, 2, 3, "b", "none"), absl::Seconds(5), a.Done()).ok());
    ASSERT_EQ(a.got.size(), 3u);
    for (const auto& r : a.got) {
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_NE(r->data_secret(), 0u);
      EXPECT_EQ(r->data_secret(), a.got[0]->data_secret());  // one secret per communicator
      EXPECT_EQ(r->integrity(), i % 2 ? "crc32c" : "");
    }
    secrets.insert(a.got[0]->data_secret());
  }
  EXPECT_EQ(secrets.size(), 8u);
}

// --- The layout at a member. ---

constexpr char kMe[] = "me.example:7411";

v1::JoinCommResponse GoodLayout() {
  v1::JoinCommResponse l;
  for (const char* name : {"other.example", "me.example"}) {
    v1::NodeInfo* n = l.add_nodes();
    n->set_node_name(name);
    n->set_peer_address(absl::StrCat(name, ":7411"));
    n->add_rail_addresses("aa");
    n->add_rail_addresses("bb");
    n->set_tag_slot(5);
    n->set_data_plane_version(kDataPlaneVersion);
  }
  for (int node : {0, 0, 1, 1}) l.add_node_of_rank(node);
  l.set_rails(2);
  l.set_data_secret(0x1234);
  l.set_integrity("crc32c");
  return l;
}

LayoutAsk AskOf(int rank, int nranks) {
  LayoutAsk ask;
  ask.comm_id = "c";
  ask.rank = rank;
  ask.nranks = nranks;
  ask.is_me = [](const v1::NodeInfo& n) { return n.peer_address() == kMe; };
  return ask;
}

TEST(CheckLayoutTest, AcceptsAConsistentLayoutAndFindsThisDaemon) {
  auto me = CheckLayoutFromCoordinator(GoodLayout(), AskOf(2, 4));
  ASSERT_TRUE(me.ok()) << me.status();
  EXPECT_EQ(*me, 1);
  // One node, this daemon without a peer service: no address, no secret needed.
  v1::JoinCommResponse solo;
  solo.add_nodes()->set_node_name("solo");
  solo.add_node_of_rank(0);
  solo.set_rails(1);
  LayoutAsk ask = AskOf(0, 1);
  ask.is_me = [](const v1::NodeInfo& n) { return n.node_name() == "solo"; };
  EXPECT_TRUE(CheckLayoutFromCoordinator(solo, ask).ok());
}

TEST(CheckLayoutTest, EveryInconsistencyIsInvalidArgumentNamingTheFieldAndTheCoordinator) {
  struct Case {
    const char* what;
    std::function<void(v1::JoinCommResponse&)> spoil;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"fewer ranks", [](auto& l) { l.mutable_node_of_rank()->RemoveLast(); },
       "JoinCommResponse.node_of_rank has 3 entries, rank 2 asked for 4 ranks"},
      {"more ranks", [](auto& l) { l.add_node_of_rank(1); },
       "JoinCommResponse.node_of_rank has 5 entries"},
      {"my rank elsewhere", [](auto& l) { l.set_node_of_rank(2, 0); },
       "JoinCommResponse.node_of_rank[2] is node 0, but rank 2 is on this daemon (node 1)"},
      {"me absent", [](auto& l) { l.mutable_nodes(1)->set_peer_address("third.example:7411"); },
       "JoinCommResponse.nodes do not list this daemon"},
      {"rank past nodes", [](auto& l) { l.set_node_of_rank(0, 7); },
       "node_of_rank[0] is 7 but the layout has 2 nodes"},
      {"bad name", [](auto& l) { l.mutable_nodes(0)->set_node_name(std::string(300, 'x')); },
       "JoinCommResponse.nodes[0].node_name is 300 bytes, more than 255"},
      {"no address", [](auto& l) { l.mutable_nodes(0)->clear_peer_address(); },
       "JoinCommResponse.nodes[0].peer_address '' is not host:port"},
      {"scheme address", [](auto& l) { l.mutable_nodes(0)->set_peer_address("unix:/tmp/s"); },
       "JoinCommResponse.nodes[0].peer_address 'unix:/tmp/s' is not host:port"},
      {"many rails",
       [](auto& l) {
         for (int i = 0; i < 63; ++i) l.mutable_nodes(0)->add_rail_addresses("cc");
       },
       "JoinCommResponse.nodes[0].rail_addresses has 65 entries, more than 64"},
      {"huge rail",
       [](auto& l) { l.mutable_nodes(1)->set_rail_addresses(1, std::string(20000, 'e')); },
       "JoinCommResponse.nodes[1].rail_addresses[1] is 20000 bytes, more than 16384"},
      {"no rails", [](auto& l) { l.set_rails(0); }, "JoinCommResponse.rails 0 is not in [1, 64]"},
      {"too many rails", [](auto& l) { l.set_rails(65); }, "JoinCommResponse.rails 65"},
      {"unknown integrity", [](auto& l) { l.set_integrity("rot13"); },
       "JoinCommResponse.integrity 'rot13' is not one of"},
      {"no secret", [](auto& l) { l.set_data_secret(0); },
       "JoinCommResponse.data_secret is 0 for a layout of more than one node"},
      {"long cost text",
       [](auto& l) { l.mutable_cost_model()->set_fitted_at(std::string(1000, 't')); },
       "JoinCommResponse.cost_model.fitted_at is 1000 bytes, more than 256"},
      {"long cost source",
       [](auto& l) { l.mutable_cost_model()->set_source(std::string(257, 's')); },
       "JoinCommResponse.cost_model.source is 257 bytes"},
  };
  for (const Case& c : cases) {
    v1::JoinCommResponse l = GoodLayout();
    c.spoil(l);
    auto got = CheckLayoutFromCoordinator(l, AskOf(2, 4));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(std::string(got.status().message()),
                HasSubstr("layout of communicator c from its coordinator: "))
        << c.what;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.says)) << c.what;
  }
  // Listed twice: once by address, once more by the same address under another name.
  LayoutAsk ask = AskOf(2, 4);
  ask.is_me = [](const v1::NodeInfo&) { return true; };  // a predicate matching both nodes
  ExpectRefused(CheckLayoutFromCoordinator(GoodLayout(), ask).status(),
                absl::StatusCode::kInvalidArgument,
                "JoinCommResponse.nodes list this daemon twice (0 and 1)");
}

// A coordinator of another data-plane version (0: one from before versions were announced, which
// lists its own node without one) or a layout listing such a node: FAILED_PRECONDITION naming the
// node and both versions. One node alone exchanges no data between daemons: no check.
TEST(CheckLayoutTest, ANodeOfAnotherDataPlaneVersionIsRefusedNamingIt) {
  for (uint32_t version : {0u, kDataPlaneVersion + 1}) {
    v1::JoinCommResponse l = GoodLayout();
    l.mutable_nodes(0)->set_data_plane_version(version);
    ExpectRefused(CheckLayoutFromCoordinator(l, AskOf(2, 4)).status(),
                  absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("layout of communicator c from its coordinator: "
                               "JoinCommResponse.nodes[0].data_plane_version: node other.example "
                               "speaks ",
                               version == 0 ? "no data-plane version"
                                            : absl::StrCat("data-plane version ", version),
                               ""));
  }
  v1::JoinCommResponse solo;
  v1::NodeInfo* n = solo.add_nodes();
  n->set_node_name("me.example");
  n->set_peer_address(kMe);
  for (int i = 0; i < 4; ++i) solo.add_node_of_rank(0);
  solo.set_rails(1);
  EXPECT_TRUE(CheckLayoutFromCoordinator(solo, AskOf(2, 4)).ok());
}

// --- DaemonCore: the coordinator's join, Heartbeat and AbortComm refusals. ---

class PeerCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ry-peerval-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    DaemonConfig config;
    config.node_name = "unit";
    config.state_dir = dir_;
    config.worker_threads = 1;
    config.join_timeout = absl::Milliseconds(300);
    config.max_pending_joins = 2;
    core_ = std::make_unique<DaemonCore>(config, SessionAuth());
  }
  void TearDown() override {
    core_->Shutdown();
    core_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  v1::JoinCommRequest Join(int nonce, int rank = 0, int nranks = 2) {
    v1::JoinCommRequest req;
    req.set_job_id("job");
    req.set_comm_id(Id(core_->joins().coordinator(), absl::StrCat(std::string(31, '0'), nonce)));
    req.set_rank(rank);
    req.set_nranks(nranks);
    req.mutable_node()->set_node_name("peer");
    req.mutable_node()->set_peer_address("peer.example:7411");
    req.mutable_node()->set_data_plane_version(kDataPlaneVersion);
    return req;
  }

  std::string dir_;
  std::unique_ptr<DaemonCore> core_;
};

TEST_F(PeerCoreTest, JoinsAreCheckedBoundedAndExpireAfterTheJoinTimeout) {
  EXPECT_EQ(core_->joins().coordinator(), "local:unit");
  v1::JoinCommRequest foreign = Join(1);
  foreign.set_comm_id(Id("elsewhere.example:7411"));
  // Answered (from the timer thread) only for joins accepted below: never for a refused one.
  auto answered = std::make_shared<std::atomic<int>>(0);
  auto never = [answered](const absl::StatusOr<v1::JoinCommResponse>&) { ++*answered; };
  ExpectRefused(core_->joins().CoordinateJoin(Insecure(), foreign, never),
                absl::StatusCode::kInvalidArgument,
                "JoinCommRequest.comm_id names coordinator elsewhere.example:7411");
  ExpectRefused(core_->joins().CoordinateJoin(Certified({"not-peer"}), Join(1), never),
                absl::StatusCode::kPermissionDenied, "JoinCommRequest.node.node_name");
  EXPECT_EQ(*answered, 0);

  // Asks for a minute: the bootstrap still expires after --join_timeout (300 ms).
  struct Waiter {
    absl::Notification done;
    absl::Status status;
  };
  auto waiter = std::make_shared<Waiter>();
  v1::JoinCommRequest slow = Join(2);
  slow.set_timeout_ms(60'000);
  const absl::Time start = absl::Now();
  ASSERT_TRUE(core_->joins()
                  .CoordinateJoin(Insecure(), slow,
                                  [waiter](const absl::StatusOr<v1::JoinCommResponse>& r) {
                                    waiter->status = r.status();
                                    waiter->done.Notify();
                                  })
                  .ok());
  ASSERT_TRUE(core_->joins().CoordinateJoin(Insecure(), Join(3), never).ok());
  ExpectRefused(core_->joins().CoordinateJoin(Insecure(), Join(4), never),
                absl::StatusCode::kResourceExhausted, "--max_pending_joins");
  ASSERT_TRUE(waiter->done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(waiter->status.code(), absl::StatusCode::kDeadlineExceeded) << waiter->status;
}

TEST_F(PeerCoreTest, HeartbeatsFromDaemonsSharingNoCommunicatorAreRefused) {
  v1::HeartbeatRequest hb;
  hb.set_from_node("peer");
  ExpectRefused(core_->peer_plane().Heartbeat(Insecure(), hb).status(),
                absl::StatusCode::kPermissionDenied,
                "Heartbeat from node peer refused: it is not another node of a multi-node "
                "communicator of this daemon");
  ExpectRefused(core_->peer_plane().Heartbeat(Certified({"someone-else"}), hb).status(),
                absl::StatusCode::kPermissionDenied,
                "HeartbeatRequest.from_node: peer ipv4:10.0.0.9:5555 claims node 'peer'");
  hb.set_from_node("");
  ExpectRefused(core_->peer_plane().Heartbeat(Insecure(), hb).status(),
                absl::StatusCode::kInvalidArgument, "HeartbeatRequest.from_node is empty");
  hb.set_from_node(std::string(256, 'h'));
  ExpectRefused(core_->peer_plane().Heartbeat(Insecure(), hb).status(),
                absl::StatusCode::kInvalidArgument,
                "HeartbeatRequest.from_node is 256 bytes, more than 255");
}

TEST_F(PeerCoreTest, AbortsFromNonMembersAreRefusedAndMalformedOnesNamed) {
  v1::AbortCommRequest abort;
  abort.set_job_id("job");
  abort.set_comm_id(Id("local:unit"));
  abort.set_code(10);
  abort.set_message("boom");
  abort.set_from_node("peer");
  const absl::Status unknown = core_->peer_plane().AbortFromPeer(Insecure(), abort);
  ExpectRefused(unknown, absl::StatusCode::kPermissionDenied,
                "AbortComm from node peer refused: it is not another member node of "
                "communicator");
  ExpectRefused(core_->peer_plane().AbortFromPeer(Certified({"other"}), abort),
                absl::StatusCode::kPermissionDenied, "AbortCommRequest.from_node: peer");
  abort.set_from_node("a\tb");
  ExpectRefused(core_->peer_plane().AbortFromPeer(Insecure(), abort),
                absl::StatusCode::kInvalidArgument,
                "AbortCommRequest.from_node has byte 0x09 at 1");
  // This daemon naming itself is no member "other than this daemon" either.
  abort.set_from_node("unit");
  const absl::Status self = core_->peer_plane().AbortFromPeer(Insecure(), abort);
  EXPECT_EQ(self.code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace railyard
