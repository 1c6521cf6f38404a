// Communicator ids: "ry1-<32 hex digits>@<coordinator address>", like ncclUniqueId but readable.
// The coordinator is the daemon that fixes the communicator's node/rail map (multi-node).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/util/random_id.h"  // RandomHex128 (nonces), RandomNonZero64 (data secrets)

namespace railyard {

struct CommId {
  std::string nonce;        // 32 lowercase hex digits
  std::string coordinator;  // "host:port" of the coordinator's peer service, or "local:<node>"
};

std::string FormatCommId(const CommId& id);
// True for a coordinator "local:<node>" (a daemon without a peer service: never dialled).
bool IsLocalCoordinator(absl::string_view coordinator);
// INVALID_ARGUMENT saying what is wrong with a malformed id. The coordinator is host:port
// (daemon/comm/host_port.h: a DNS name, IPv4 or [IPv6], port 1..65535; no gRPC target schemes
// such as unix:, dns:, xds:) or local:<node>.
absl::StatusOr<CommId> ParseCommId(absl::string_view text);
// INVALID_ARGUMENT unless 1 <= nranks <= the ranks a communicator may have (the tag layout's
// limit, daemon/scheduler/tags.h) and 0 <= rank < nranks.
absl::Status CheckRankOf(int rank, int nranks);

}  // namespace railyard
