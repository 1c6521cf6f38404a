#include "daemon/comm/comm_id.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/comm/host_port.h"
#include "daemon/scheduler/tags.h"

namespace railyard {
namespace {
constexpr absl::string_view kPrefix = "ry1-";
constexpr size_t kNonceLength = 32;
constexpr size_t kMaxCoordinatorLength = 255;
constexpr absl::string_view kLocalScheme = "local:";
}  // namespace

std::string FormatCommId(const CommId& id) {
  return absl::StrCat(kPrefix, id.nonce, "@", id.coordinator);
}

bool IsLocalCoordinator(absl::string_view coordinator) {
  return absl::StartsWith(coordinator, kLocalScheme);
}

absl::StatusOr<CommId> ParseCommId(absl::string_view text) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("malformed comm id '", text.substr(0, 80), "': ",
                                                   why, " (expected ry1-<32 hex>@<coordinator>)"));
  };
  if (text.substr(0, kPrefix.size()) != kPrefix) return bad("wrong prefix");
  text.remove_prefix(kPrefix.size());
  const size_t at = text.find('@');
  if (at != kNonceLength) return bad("nonce is not 32 hex digits");
  CommId id;
  id.nonce = std::string(text.substr(0, at));
  for (char c : id.nonce) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return bad("nonce is not hex");
  }
  id.coordinator = std::string(text.substr(at + 1));
  if (id.coordinator.empty() || id.coordinator.size() > kMaxCoordinatorLength) {
    return bad("coordinator address is empty or too long");
  }
  for (char c : id.coordinator) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) {
      return bad("coordinator address has spaces or control characters");
    }
  }
  // A daemon without a peer service names itself local:<node>; every other coordinator is dialled
  // (PeerClients), so it must be host:port and nothing gRPC reads as a target scheme of its own.
  if (absl::StartsWith(id.coordinator, kLocalScheme)) {
    if (id.coordinator.size() == kLocalScheme.size()) return bad("local: names no node");
    return id;
  }
  if (std::string why = HostPortProblem(id.coordinator); !why.empty()) {
    return bad(absl::StrCat("coordinator is not host:port or local:<node>: ", why));
  }
  return id;
}

absl::Status CheckRankOf(int rank, int nranks) {
  if (nranks < 1 || nranks > scheduler::tags::kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("nranks ", nranks, " not in [1, ", scheduler::tags::kMaxRanks, "]"));
  }
  if (rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " not in [0, ", nranks, ")"));
  }
  return absl::OkStatus();
}

}  // namespace railyard
