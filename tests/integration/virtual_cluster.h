// n railyardd on loopback as "virtual nodes" vnode0..: each with its own socket, a peer port and
// a topology file declaring 2 rails on lo; mutual TLS between them unless told otherwise.
#pragma once

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/peer_tls.h"

namespace railyard::testing {

// How the daemons of a VirtualCluster talk: mutual TLS with certificates made at test time
// (DNS:vnodeN, IP:127.0.0.1, one CA), or plaintext (--peer_insecure).
enum class PeerPlane { kTls, kInsecure };

// n virtual nodes; extra flags go to every daemon.
class VirtualCluster {
 public:
  VirtualCluster(int n, std::vector<std::string> extra = {}, PeerPlane plane = PeerPlane::kTls)
      : dir_(MakeTempDir()) {
    std::vector<std::string> nodes;
    for (int i = 0; i < n; ++i) nodes.push_back("vnode" + std::to_string(i));
    if (plane == PeerPlane::kTls) MakePeerCerts(dir_ + "/certs", nodes);
    for (int i = 0; i < n; ++i) {
      const std::string topo = dir_ + "/node" + std::to_string(i) + ".json";
      std::ofstream(topo) << "{\"node\": \"" << nodes[i]
                          << "\", \"rails\": [{\"name\": \"rail0\", \"device\": \"lo\"},"
                             " {\"name\": \"rail1\", \"device\": \"lo\"}]}\n";
      std::vector<std::string> flags = plane == PeerPlane::kTls
                                           ? PeerTlsFlags(dir_ + "/certs", nodes[i])
                                           : std::vector<std::string>{"--peer_insecure"};
      flags.insert(flags.end(), {"--peer_listen=127.0.0.1:0", "--topology=" + topo});
      flags.insert(flags.end(), extra.begin(), extra.end());
      daemons_.push_back(std::make_unique<DaemonProcess>(flags));
    }
  }
  ~VirtualCluster() {
    daemons_.clear();
    std::filesystem::remove_all(dir_);
  }
  DaemonProcess& operator[](int i) { return *daemons_[i]; }
  int size() const { return static_cast<int>(daemons_.size()); }
  std::string Sockets() const {
    std::string s;
    for (const auto& d : daemons_) s += (s.empty() ? "" : ",") + d->socket();
    return s;
  }
  bool ready() const {
    for (const auto& d : daemons_) {
      if (!d->ready()) return false;
    }
    return true;
  }
  std::string Logs() const {
    std::string s;
    for (const auto& d : daemons_) s += d->Log() + "\n";
    return s;
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

}  // namespace railyard::testing
