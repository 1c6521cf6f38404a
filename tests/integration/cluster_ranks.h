// Helpers of the multi-daemon tests: one rank per virtual node joined in one communicator, and
// reading a daemon's /metrics.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "railyard/client.h"
#include "tests/integration/virtual_cluster.h"

namespace railyard::testing {

// One rank on each daemon of the cluster, joined in one communicator of cluster.size() ranks;
// with buffer_bytes, a buffer of that size per rank. A step that fails is reported (EXPECT) and
// what was made so far is returned: check ok.
struct RankPerNode {
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<Buffer> bufs;
  std::vector<Comm> comms;
  std::string comm_id;
  bool ok = false;
};
inline RankPerNode JoinRankPerNode(VirtualCluster& cluster, size_t buffer_bytes = 0,
                                   const std::string& job = "itest",
                                   const std::string& integrity = "") {
  RankPerNode out;
  const int n = cluster.size();
  for (int i = 0; i < n; ++i) {
    ClientOptions o = cluster[i].Options(job);
    o.integrity = integrity;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return out;
    if (buffer_bytes > 0) {
      auto b = (*c)->Allocate(buffer_bytes);
      EXPECT_TRUE(b.ok()) << b.status();
      if (!b.ok()) return out;
      out.bufs.push_back(*std::move(b));
    }
    out.clients.push_back(*std::move(c));
  }
  auto id = out.clients[0]->CreateCommId();
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return out;
  out.comm_id = *id;
  out.comms.resize(n);
  std::vector<absl::Status> joined(n);
  std::vector<std::thread> joiners;
  for (int r = 0; r < n; ++r) {
    joiners.emplace_back([&, r] {
      auto m = out.clients[r]->InitComm(out.comm_id, r, n);
      joined[r] = m.status();
      if (m.ok()) out.comms[r] = *std::move(m);
    });
  }
  for (auto& t : joiners) t.join();
  out.ok = true;
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(joined[r].ok()) << "rank " << r << ": " << joined[r];
    out.ok = out.ok && joined[r].ok();
  }
  return out;
}

// GET http://<address><path> over a plain socket; the body, or "" on any error.
inline std::string HttpGet(const std::string& address, const std::string& path) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "";
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr) != 1) return "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: x\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The daemon's /metrics address, from its "metrics" log line.
inline std::string MetricsAddress(DaemonProcess& d) {
  const std::string log = d.Log();
  const std::string key = "metrics_address=";
  const size_t at = log.find(key);
  if (at == std::string::npos) return "";
  size_t end = at + key.size();
  while (end < log.size() && log[end] != ' ' && log[end] != '\n' && log[end] != '"') ++end;
  return log.substr(at + key.size(), end - at - key.size());
}

// Sum of every sample of `family` in a Prometheus text exposition.
inline double SumSamples(const std::string& text, const std::string& family) {
  double sum = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(family, 0) != 0 || (line[family.size()] != '{' && line[family.size()] != ' ')) {
      continue;
    }
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

}  // namespace railyard::testing
