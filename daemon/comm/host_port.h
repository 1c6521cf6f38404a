// "host:port" as the peer plane names daemons (comm id coordinators, NodeInfo.peer_address): a
// DNS name, an IPv4 dotted quad or a bracketed IPv6 address, then a decimal port in 1..65535.
// Nothing else: gRPC would read "unix:/path", "dns:///x", "xds:..." or "vsock:..." as a target of
// its own scheme and dial it, so a peer could make this daemon connect where it chooses.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace railyard {

// The longest host:port accepted (a DNS name is at most 253 bytes, ":65535" 6 more).
inline constexpr size_t kMaxHostPortBytes = 259;

// Empty when text is host:port as above, else why not ("port 0 is not in 1..65535").
std::string HostPortProblem(absl::string_view text);

}  // namespace railyard
