// Communicator ids: "ry1-<32 hex digits>@<coordinator address>", like ncclUniqueId but readable.
// The coordinator is the daemon that fixes the communicator's node/rail map (multi-node).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace railyard {

struct CommId {
  std::string nonce;        // 32 lowercase hex digits
  std::string coordinator;  // "host:port" of the coordinator's peer service, or "local:<node>"
};

std::string FormatCommId(const CommId& id);
// INVALID_ARGUMENT saying what is wrong with a malformed id.
absl::StatusOr<CommId> ParseCommId(absl::string_view text);
// 128 random bits as 32 lowercase hex digits (session ids, comm id nonces).
std::string RandomHex128();
// INVALID_ARGUMENT unless 1 <= nranks <= the ranks a communicator may have (the tag layout's
// limit, daemon/scheduler/tags.h) and 0 <= rank < nranks.
absl::Status CheckRankOf(int rank, int nranks);

}  // namespace railyard
