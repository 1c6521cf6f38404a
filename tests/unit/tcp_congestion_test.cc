// --rail_tcp_congestion: the flag's parsing, and the policy applied to real sockets of this
// process (a listener, what it accepts, a connection) through the socket() hook, as UcxRail
// applies it to UCX's.
#include "daemon/transport/tcp_congestion.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/util/unique_fd.h"

namespace railyard::transport {
namespace {

TEST(TcpCongestionPolicyTest, ParsesAutoHostAndLists) {
  auto policy = ParseTcpCongestionPolicy("auto");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->mode, TcpCongestionPolicy::Mode::kAuto);
  EXPECT_EQ(policy->names, (std::vector<std::string>{"cubic", "reno"}));
  EXPECT_EQ(TcpCongestionPolicyText(*policy), "auto");

  policy = ParseTcpCongestionPolicy("host");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->mode, TcpCongestionPolicy::Mode::kHost);
  EXPECT_EQ(TcpCongestionPolicyText(*policy), "host");

  policy = ParseTcpCongestionPolicy("reno,cubic");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->mode, TcpCongestionPolicy::Mode::kNames);
  EXPECT_EQ(policy->names, (std::vector<std::string>{"reno", "cubic"}));
  EXPECT_EQ(TcpCongestionPolicyText(*policy), "reno,cubic");

  policy = ParseTcpCongestionPolicy("dctcp");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->names, (std::vector<std::string>{"dctcp"}));
}

TEST(TcpCongestionPolicyTest, RejectsWhatNamesNoAlgorithm) {
  for (const char* bad : {"", ",", "cubic,", ",reno", "cubic,,reno", "CUBIC", "cu bic", "reno;rm",
                          "bbr\n", "sixteen_chars_xx", "auto,reno", "../reno"}) {
    auto policy = ParseTcpCongestionPolicy(bad);
    ASSERT_FALSE(policy.ok()) << "'" << bad << "' was accepted";
    EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(policy.status().message().find("--rail_tcp_congestion"), std::string::npos)
        << policy.status();
  }
  // 15 characters is the kernel's limit, and allowed.
  EXPECT_TRUE(ParseTcpCongestionPolicy("fifteen_chars_x").ok());
}

// The algorithms this kernel offers (net.ipv4.tcp_available_congestion_control).
std::vector<std::string> Available() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_available_congestion_control");
  std::vector<std::string> names;
  for (std::string name; in >> name;) names.push_back(name);
  return names;
}

bool Has(const std::vector<std::string>& names, const std::string& name) {
  for (const std::string& n : names) {
    if (n == name) return true;
  }
  return false;
}

using Fd = railyard::UniqueFd;

Fd TcpSocket() { return Fd(socket(AF_INET, SOCK_STREAM, 0)); }

bool SetCongestion(int fd, const std::string& name) {
  return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                    static_cast<socklen_t>(name.size())) == 0;
}

// A listener on 127.0.0.1, its port in *port.
Fd Listener(uint16_t* port) {
  Fd fd = TcpSocket();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd.get(), 4) != 0) {
    return Fd();
  }
  socklen_t len = sizeof(addr);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

Fd ConnectTo(uint16_t port) {
  Fd fd = TcpSocket();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return Fd();
  return fd;
}

// Two algorithms to move between: bbr (what auto replaces) and another the kernel accepts here.
class TcpCongestionApplyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<std::string> available = Available();
    if (!Has(available, "bbr") || !Has(available, "reno")) {
      GTEST_SKIP() << "this kernel lacks bbr or reno (available: " << available.size()
                   << " algorithms)";
    }
    Fd probe = TcpSocket();
    if (!SetCongestion(probe.get(), "bbr") || !SetCongestion(probe.get(), "reno")) {
      GTEST_SKIP() << "this process may not choose bbr and reno: " << std::strerror(errno);
    }
  }
};

TEST(TcpCongestionHookTest, TheProcessSocketIsTheHook) {
  // Executables linking railyard_transport export socket(), so libraries (UCX's) call it.
  EXPECT_TRUE(TcpCongestionHookActive());
}

// Sockets opened inside a scope as the host would: the default algorithm, set to bbr first
// (the kernel's default may be anything) by a nested "bbr" scope.
TEST_F(TcpCongestionApplyTest, AScopeSetsNewTcpSocketsAndWhatTheListenerAccepts) {
  TcpCongestionResult result;
  TcpCongestionPolicy bbr_first = *ParseTcpCongestionPolicy("bbr");
  TcpCongestionResult ignored;
  const TcpCongestionPolicy policy;  // auto: bbr becomes cubic, else reno
  uint16_t port = 0;
  Fd listener, reno_socket, udp, unix_socket;
  {
    const TcpCongestionScope outer(policy, &result);
    {
      const TcpCongestionScope inner(bbr_first, &ignored);
      Fd bbr_socket = TcpSocket();
      EXPECT_EQ(TcpCongestionOf(bbr_socket.get()), "bbr");  // the inner scope applies
    }
    listener = Listener(&port);
    reno_socket = TcpSocket();
    udp = Fd(socket(AF_INET, SOCK_DGRAM, 0));
    unix_socket = Fd(socket(AF_UNIX, SOCK_STREAM, 0));
  }
  ASSERT_GE(listener.get(), 0);
  const std::string chosen = TcpCongestionOf(listener.get());
  EXPECT_TRUE(chosen == "cubic" || chosen == "reno") << chosen;
  EXPECT_EQ(TcpCongestionOf(udp.get()), "");
  EXPECT_EQ(TcpCongestionOf(unix_socket.get()), "");
  EXPECT_EQ(result.sockets, 2);  // the listener and the other TCP socket; not UDP or unix
  EXPECT_EQ(result.error, "");
  if (result.changed > 0) {
    EXPECT_EQ(result.to, chosen);
  }

  // What the listener accepts inherits its choice: UcxRail relies on this for the connections
  // UCX accepts inside worker progress, outside any scope.
  Fd client = ConnectTo(port);
  ASSERT_GE(client.get(), 0);
  Fd accepted(accept(listener.get(), nullptr, nullptr));
  ASSERT_GE(accepted.get(), 0) << std::strerror(errno);
  EXPECT_EQ(TcpCongestionOf(accepted.get()), chosen);

  // Outside a scope nothing is changed: the client has the host's default.
  std::ifstream default_cc("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string host;
  default_cc >> host;
  EXPECT_EQ(TcpCongestionOf(client.get()), host);
}

TEST_F(TcpCongestionApplyTest, AutoMovesOnlyBbr) {
  Fd a = TcpSocket(), b = TcpSocket();
  ASSERT_TRUE(SetCongestion(a.get(), "bbr"));
  ASSERT_TRUE(SetCongestion(b.get(), "reno"));
  TcpCongestionResult result;
  const TcpCongestionPolicy policy;
  ApplyTcpCongestion(a.get(), policy, &result);
  ApplyTcpCongestion(b.get(), policy, &result);
  EXPECT_EQ(result.sockets, 2);
  EXPECT_EQ(result.changed, 1);
  EXPECT_EQ(result.from, "bbr");
  EXPECT_EQ(TcpCongestionOf(a.get()), result.to);
  EXPECT_EQ(TcpCongestionOf(b.get()), "reno");
}

TEST_F(TcpCongestionApplyTest, NamesAreTriedInOrderAndRefusalsReported) {
  Fd a = TcpSocket();
  ASSERT_TRUE(SetCongestion(a.get(), "bbr"));

  TcpCongestionResult result;
  ApplyTcpCongestion(a.get(), *ParseTcpCongestionPolicy("no_such_cc,reno"), &result);
  EXPECT_EQ(result.sockets, 1);
  EXPECT_EQ(result.changed, 1);
  EXPECT_EQ(result.to, "reno");
  EXPECT_EQ(result.error, "");
  EXPECT_EQ(TcpCongestionOf(a.get()), "reno");

  // Nothing the kernel accepts: the socket keeps its algorithm and the result says why.
  result = {};
  ApplyTcpCongestion(a.get(), *ParseTcpCongestionPolicy("no_such_cc"), &result);
  EXPECT_EQ(result.sockets, 1);
  EXPECT_EQ(result.changed, 0);
  EXPECT_EQ(result.from, "reno");
  EXPECT_NE(result.error.find("no_such_cc: "), std::string::npos) << result.error;
  EXPECT_EQ(TcpCongestionOf(a.get()), "reno");

  // A list names the algorithm even for sockets not on bbr; "host" touches nothing.
  result = {};
  ApplyTcpCongestion(a.get(), *ParseTcpCongestionPolicy("bbr"), &result);
  EXPECT_EQ(result.changed, 1);
  EXPECT_EQ(result.from, "reno");
  EXPECT_EQ(TcpCongestionOf(a.get()), "bbr");
  result = {};
  ApplyTcpCongestion(a.get(), *ParseTcpCongestionPolicy("host"), &result);
  EXPECT_EQ(result.sockets, 1);
  EXPECT_EQ(result.changed, 0);
  EXPECT_EQ(TcpCongestionOf(a.get()), "bbr");
}

}  // namespace
}  // namespace railyard::transport
