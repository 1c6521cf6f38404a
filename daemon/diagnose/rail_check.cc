#include "daemon/diagnose/rail_check.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/diagnose/verdicts.h"

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
  const v1::TransferProgress* t =
      WaitOn(peer, suspect.seq, suspect.my_node, suspect.rail, suspect.timeout_s);
  if (t == nullptr) return std::nullopt;
  const std::string me =
      t->peer_name().empty() ? absl::StrCat("node ", suspect.my_node) : t->peer_name();
  return absl::StrFormat("waits %.1f s for its %s %s on rail%d too", t->age_seconds(),
                         t->send() ? "send to" : "chunk from", me, t->rail());
}

}  // namespace railyard::diagnose
