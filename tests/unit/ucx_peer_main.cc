// The peer of UcxTwoProcessTest (transport_test.cc), a program of its own so that no test case
// exists only to be skipped. Spawned by the test with the pipes it talks on in its environment:
// it opens a UCX transport on lo, tells the parent its address, connects to the parent's, sends
// 1 MiB tagged 1 filled as FillPattern(1), says "sent" and blocks until the parent kills it.
// Exit codes: 2 bad environment, 3 transport, 4 connect, 5 send.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "daemon/transport/ucx/ucx_transport.h"
#include "tests/unit/ucx_peer.h"

using railyard::testing::ReadLine;
using railyard::testing::WriteLine;
using railyard::transport::UcxTransport;

int main() {
  // NOLINTBEGIN(concurrency-mt-unsafe): single-threaded here, nothing sets the environment.
  const char* in_env = std::getenv(railyard::testing::kUcxPeerInEnv);
  const char* out_env = std::getenv(railyard::testing::kUcxPeerOutEnv);
  // NOLINTEND(concurrency-mt-unsafe)
  int in_fd = -1, out_fd = -1;
  if (in_env == nullptr || out_env == nullptr || !absl::SimpleAtoi(in_env, &in_fd) ||
      !absl::SimpleAtoi(out_env, &out_fd)) {
    std::fprintf(stderr, "ucx_peer: spawned by transport_test only (%s and %s name its pipes)\n",
                 railyard::testing::kUcxPeerInEnv, railyard::testing::kUcxPeerOutEnv);
    return 2;
  }
  alarm(30);  // never outlive a crashed parent by much
  UcxTransport::Options options;
  options.node_name = "child";
  options.rails.push_back({.device = "lo", .tls = "tcp"});
  auto t = UcxTransport::Create(options);
  if (!t.ok()) {
    std::fprintf(stderr, "ucx_peer: %s\n", t.status().ToString().c_str());
    return 3;
  }
  if (!WriteLine(out_fd, *(*t)->LocalAddress(0))) return 3;
  auto ep = (*t)->Connect(ReadLine(in_fd), 0);
  if (!ep.ok()) {
    std::fprintf(stderr, "ucx_peer: %s\n", ep.status().ToString().c_str());
    return 4;
  }
  std::vector<uint8_t> data(railyard::testing::kUcxPeerBytes);
  railyard::testing::FillPattern(data, 1);
  absl::Notification sent;
  absl::Status send_status;
  (*ep)->Send(1, data.data(), data.size(), [&](absl::Status s) {
    send_status = std::move(s);
    sent.Notify();
  });
  if (!sent.WaitForNotificationWithTimeout(absl::Seconds(20)) || !send_status.ok()) return 5;
  if (!WriteLine(out_fd, "sent")) return 5;
  ReadLine(in_fd);  // blocks until killed
  return 0;
}
