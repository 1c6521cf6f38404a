// One rule for "does this certificate DNS name cover this name": hostnames (DnsNameMatches, the
// daemon's check that its certificate names the host it is dialled at) and node names
// (CertNamesNode: the daemon's check of its own certificate at start, peer_tls.h, and
// PeerIdentity::MayClaimNode for the peers').
#pragma once

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace railyard::auth {

// True when the subjectAltName DNS entry `pattern` names `name`, per RFC 6125 6.4 restricted as
// browsers and gRPC do: ASCII case-insensitive, one trailing dot ignored, and a wildcard only as
// the whole left-most label ("*.example.com") standing for exactly one non-empty label, with at
// least two labels after it ("*.com" names nothing). Partial wildcards ("f*.example.com") and
// names that contain '*' themselves never match.
inline bool DnsNameMatches(absl::string_view pattern, absl::string_view name,
                           bool exact_case = false) {
  auto equal = [exact_case](absl::string_view a, absl::string_view b) {
    return exact_case ? a == b : absl::EqualsIgnoreCase(a, b);
  };
  if (absl::EndsWith(pattern, ".")) pattern.remove_suffix(1);
  if (!exact_case && absl::EndsWith(name, ".")) name.remove_suffix(1);
  if (pattern.empty() || name.empty() || absl::StrContains(name, '*')) return false;
  if (!absl::StrContains(pattern, '*')) return equal(pattern, name);
  if (!absl::StartsWith(pattern, "*.")) return false;
  const absl::string_view suffix = pattern.substr(1);  // ".example.com"
  if (absl::StrContains(suffix, '*')) return false;
  // At least two labels after the wildcard: ".example.com" has an inner dot.
  if (suffix.size() < 4 || suffix.find('.', 1) == absl::string_view::npos ||
      absl::StrContains(suffix, "..")) {
    return false;
  }
  if (name.size() <= suffix.size()) return false;
  const absl::string_view label = name.substr(0, name.size() - suffix.size());
  return !absl::StrContains(label, '.') && equal(name.substr(label.size()), suffix);
}

// Whether a certificate DNS name covers a node *name* (what a daemon claims in joins, heartbeats
// and aborts, and is known by in layouts, membership checks and metrics): the rule above, but
// ASCII case-sensitive and without the trailing-dot allowance, since node names are compared as
// exact strings everywhere else; a certificate for "node-a" must not let its holder appear as
// "NODE-A" or "node-a." beside the real one. Hostnames being dialled keep the rule above.
inline bool CertNamesNode(absl::string_view pattern, absl::string_view node_name) {
  return DnsNameMatches(pattern, node_name, /*exact_case=*/true);
}

}  // namespace railyard::auth
