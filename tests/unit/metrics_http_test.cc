// The civetweb endpoint: /metrics, /healthz and /readyz over a real loopback socket.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/strings/numbers.h"
#include "daemon/metrics/exposition.h"
#include "daemon/metrics/http_server.h"
#include "daemon/metrics/registry.h"
#include "gtest/gtest.h"

namespace railyard::metrics {
namespace {

// One HTTP/1.0 GET; returns the whole response ("" when the connection fails).
std::string Get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  timeval tv{5, 0};  // never wait forever on a broken server
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

int PortOf(const std::string& host_port) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(host_port.substr(host_port.rfind(':') + 1), &port)) << host_port;
  return port;
}

TEST(MetricsHttp, ServesMetricsHealthAndReadiness) {
  Registry r;
  r.AddCounter("t_bytes_total", "Bytes").Add({{"k", "v"}}).Increment(42);
  std::atomic<bool> ready{false};
  HttpServer server(&r, [&] { return ready.load(); });
  absl::StatusOr<std::string> bound = server.Start("127.0.0.1:0");
  ASSERT_TRUE(bound.ok()) << bound.status();
  const int port = PortOf(*bound);
  ASSERT_GT(port, 0);
  EXPECT_EQ(bound->substr(0, bound->rfind(':')), "127.0.0.1");

  const std::string metrics = Get(port, "/metrics");
  EXPECT_NE(metrics.find(" 200 OK\r\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\r\n\r\n" + RenderText(r)), std::string::npos) << metrics;

  EXPECT_NE(Get(port, "/healthz").find(" 200 "), std::string::npos);
  EXPECT_NE(Get(port, "/readyz").find(" 503 "), std::string::npos);
  ready = true;
  EXPECT_NE(Get(port, "/readyz").find(" 200 "), std::string::npos);
  EXPECT_NE(Get(port, "/nothing").find(" 404 "), std::string::npos);
  server.Stop();
  EXPECT_EQ(Get(port, "/healthz"), "");
}

TEST(MetricsHttp, BadAddressesFailClearly) {
  Registry r;
  HttpServer a(&r, nullptr);
  absl::StatusOr<std::string> s = a.Start("no-port");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("host:port"), std::string::npos);
  HttpServer b(&r, nullptr);
  absl::StatusOr<std::string> first = b.Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok());
  HttpServer c(&r, nullptr);
  EXPECT_EQ(c.Start(*first).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace railyard::metrics
