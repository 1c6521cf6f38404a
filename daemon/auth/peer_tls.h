// The peer plane's mutual TLS material (railyardd --peer_tls_cert, --peer_tls_key,
// --peer_tls_ca): loaded and checked once at start, so that a daemon whose certificate other
// daemons would refuse does not start at all. Also reads the subjectAltNames of a PEM
// certificate. OpenSSL only; nothing of gRPC.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace railyard::auth {

struct CertNames {
  std::vector<std::string> dns;  // DNS subjectAltNames, as written (wildcards included)
  std::vector<std::string> ips;  // IP subjectAltNames as text ("10.0.0.2", "fd00::1")
  // "DNS:a, DNS:*.b, IP:10.0.0.2" (or "none"), for messages.
  std::string ToString() const;
};

// True when names cover host as a TLS client checks it: an IP address (v4, v6, "[v6]") against
// the IP SANs, anything else against the DNS SANs (DnsNameMatches).
bool CertNamesHost(const CertNames& names, absl::string_view host);

// The subjectAltNames of the first certificate in pem. INVALID_ARGUMENT when pem holds none.
absl::StatusOr<CertNames> SubjectAltNames(absl::string_view pem);

// PEM text of the three files, as gRPC's SSL credentials take it.
struct PeerTlsPem {
  std::string cert_chain;  // this daemon's certificate (and any intermediates)
  std::string private_key;
  std::string ca;  // the cluster CA (one or more certificates) every peer must chain to
};

// Reads the three files and checks that they can serve this daemon as node `node_name`: each
// is readable PEM of its kind, the key is the certificate's, the certificate chains to the CA and
// is valid at `now`, and one of its DNS subjectAltNames names node_name (CertNamesNode).
// INVALID_ARGUMENT naming the flag and file for unreadable or malformed input;
// FAILED_PRECONDITION naming the certificate, the node and the SANs when it does not fit.
absl::StatusOr<PeerTlsPem> LoadPeerTls(const std::string& cert_file, const std::string& key_file,
                                       const std::string& ca_file, absl::string_view node_name,
                                       absl::Time now);

}  // namespace railyard::auth
