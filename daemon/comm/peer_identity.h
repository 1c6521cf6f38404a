// Who is at the other end of a Peer RPC. With mutual TLS (--peer_tls_*) it is what the peer's
// certificate, signed by the cluster CA, says: its DNS and IP subject alternative names. With
// --peer_insecure nothing is verified and any claim passes (loopback demos only).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "daemon/auth/dns_name.h"

namespace railyard {

struct PeerIdentity {
  // True when the peer presented a certificate the cluster CA signed (mutual TLS).
  bool authenticated = false;
  // True for this daemon itself (a local rank's join on its own coordinator).
  bool self = false;
  std::vector<std::string> dns_names;  // subjectAltName DNS entries
  std::vector<std::string> ips;        // subjectAltName IP entries, as text
  std::string peer;                    // gRPC's peer string ("ipv4:10.0.0.2:4711"), for logs

  static PeerIdentity Self() {
    PeerIdentity id;
    id.self = true;
    return id;
  }
  // Verified identities are checked; unverified ones (--peer_insecure) are trusted as claimed.
  bool verified() const { return authenticated || self; }

  // OK when this peer may speak as the daemon named node_name: its certificate names it
  // (auth::CertNamesNode: exactly, case included, or by a "*.example.com" wildcard). An
  // unauthenticated peer (--peer_insecure) may claim anything; this daemon may claim anything.
  absl::Status MayClaimNode(absl::string_view node_name) const {
    if (!authenticated) return absl::OkStatus();
    for (const std::string& dns : dns_names) {
      if (auth::CertNamesNode(dns, node_name)) return absl::OkStatus();  // wildcards too
    }
    return absl::PermissionDeniedError(
        absl::StrCat("peer ", peer, " claims node '", node_name.substr(0, 64),
                     "' but its certificate names only [", Names(), "]"));
  }

  // The name this peer is known by in logs and membership checks: when authenticated, `claimed`
  // if the certificate names it (MayClaimNode), else its first DNS name; unauthenticated,
  // `claimed`.
  std::string NodeOr(absl::string_view claimed) const {
    if (authenticated && !dns_names.empty()) {
      if (MayClaimNode(claimed).ok()) return std::string(claimed);
      return dns_names.front();
    }
    return std::string(claimed);
  }

  std::string Names() const {
    std::vector<std::string> all = dns_names;
    all.insert(all.end(), ips.begin(), ips.end());
    return absl::StrJoin(all, ", ");
  }
};

}  // namespace railyard
