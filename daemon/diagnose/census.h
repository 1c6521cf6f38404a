// Which ranks of a communicator are gone, from the member daemons' views of it (the same views
// railctl diagnose judges): the answer to Local.CommCensus, from which the survivors of a failure
// derive the shrunk communicator (Comm on_failure="shrink"). Pure: unit tested with hand-made
// views.
#pragma once

#include <string>
#include <vector>

#include "daemon/diagnose/verdicts.h"
#include "railyard/v1/diagnose.pb.h"

namespace railyard::diagnose {

// The communicator as this daemon knows it (from its layout, not from any peer).
struct CensusLayout {
  int nranks = 0;
  std::vector<int> node_of_rank;            // by rank: index into the node lists
  std::vector<std::string> node_names;      // by node index
  std::vector<std::string> node_addresses;  // by node index: Peer service host:port ("" if none)
  std::string coordinator;                  // the comm id's coordinator
};

struct Census {
  std::vector<int> lost_ranks;          // ascending
  std::vector<std::string> lost_nodes;  // "name (address): why", by node index
  std::string coordinator;              // for the shrunk communicator's id
};

// views: the member daemons' views that arrived (this daemon's among them). A view counts only
// for the node it came from (`node_index`, which the caller checked is the node it asked) and
// only for that node's ranks: a rank its node's view marks left, or does not list, is gone; so
// is every rank of a node in `silent` or with no view at all. The coordinator stays the comm
// id's unless its node has no surviving rank (or it names no node of the layout and is not
// reachable as one): then it is the address of the lowest surviving rank's node.
Census TakeCensus(const CensusLayout& layout, const std::vector<v1::CommState>& views,
                  const std::vector<Unanswered>& silent);

}  // namespace railyard::diagnose
