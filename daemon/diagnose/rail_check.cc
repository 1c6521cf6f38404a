#include "daemon/diagnose/rail_check.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace railyard::diagnose {

std::optional<std::string> PeerConfirmsRailStall(const v1::CommState& peer,
                                                 const RailSuspect& suspect) {
  if (peer.state() != "ready") return std::nullopt;  // joining, or failed on its own
  // Every rank's `completed` is the peer's next collective: past seq, it finished seq.
  bool finished = peer.ranks_size() > 0;
  for (const v1::RankProgress& r : peer.ranks()) {
    if (r.completed() <= suspect.seq) finished = false;
  }
  if (finished) return absl::StrCat("finished seq ", suspect.seq);
  if (!peer.has_front() || peer.front().seq() != suspect.seq || !peer.front().running()) {
    return std::nullopt;
  }
  for (const v1::TransferProgress& t : peer.front().transfers()) {
    if (t.peer_node() != suspect.my_node || t.rail() != suspect.rail) continue;
    if (t.age_seconds() < suspect.timeout_s) continue;
    const std::string me =
        t.peer_name().empty() ? absl::StrCat("node ", suspect.my_node) : t.peer_name();
    return absl::StrFormat("waits %.1f s for its %s %s on rail%d too", t.age_seconds(),
                           t.send() ? "send to" : "chunk from", me, t.rail());
  }
  return std::nullopt;
}

}  // namespace railyard::diagnose
