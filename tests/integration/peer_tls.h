// Certificates for the peer plane's mutual TLS, made at test time by scripts/peer-certs.sh (the
// openssl CLI), and the railyardd flags that use them. One directory is one cluster CA: two
// directories are two CAs that do not trust each other.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace railyard::testing {

// Makes (or keeps: the script is idempotent) the CA in dir and a certificate per spec: "NODE"
// (DNS:NODE, IP:127.0.0.1) or "NODE=IP,IP" (DNS:NODE and those IPs). A failure fails the test.
inline void MakePeerCerts(const std::string& dir, const std::vector<std::string>& specs) {
  std::string cmd = std::string("'") + PEER_CERTS_SCRIPT + "' '" + dir + "'";
  for (const auto& s : specs) cmd += " '" + s + "'";
  const int rc = std::system((cmd + " >'" + dir + ".certs.log' 2>&1").c_str());
  ASSERT_EQ(rc, 0) << "peer-certs.sh failed: " << cmd;
}

// The TLS flags of the daemon whose certificate in dir is `cert_node`'s, trusting ca_dir's CA
// (dir by default).
inline std::vector<std::string> PeerTlsFlags(const std::string& dir, const std::string& cert_node,
                                             const std::string& ca_dir = "") {
  return {"--peer_tls_cert=" + dir + "/" + cert_node + ".pem",
          "--peer_tls_key=" + dir + "/" + cert_node + "-key.pem",
          "--peer_tls_ca=" + (ca_dir.empty() ? dir : ca_dir) + "/ca.pem"};
}

}  // namespace railyard::testing
