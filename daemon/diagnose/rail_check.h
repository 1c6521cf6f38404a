// Whether a peer's view of a communicator (Peer.GetCommState, the view railctl diagnose gathers)
// confirms that a rail between it and this node stopped delivering, given a suspect this node's
// run found (scheduler::FindStalledRail: a transfer with that peer on that rail has waited past
// the timeout with nothing from the peer on the rail for as long). Confirmed when the peer has
// finished the operation (everything it sent for it left long ago: the bytes were lost on the
// way), or runs it and itself waits at least as long on a transfer with this node on the same
// rail. A peer that has not started the operation, waits for another node, or failed, confirms
// nothing: it is late, not cut off. Pure: unit tested with hand-made views.
#pragma once

#include <optional>
#include <string>

#include "railyard/v1/diagnose.pb.h"

namespace railyard::diagnose {

struct RailSuspect {
  uint64_t seq = 0;      // the operation this node runs
  int my_node = 0;       // this node's index in the communicator
  int rail = 0;          // the silent rail
  double timeout_s = 0;  // how long the peer's own transfer must have waited
};

// The evidence, as a phrase after the peer's name ("finished seq 12", "waits 6.0 s for its chunk
// from n0 on rail1 too", naming this node as the peer's view does); nullopt: the view confirms
// nothing.
std::optional<std::string> PeerConfirmsRailStall(const v1::CommState& peer,
                                                 const RailSuspect& suspect);

}  // namespace railyard::diagnose
