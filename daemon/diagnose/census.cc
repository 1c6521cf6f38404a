#include "daemon/diagnose/census.h"

#include <set>

#include "absl/strings/str_cat.h"

namespace railyard::diagnose {

Census TakeCensus(const CensusLayout& layout, const std::vector<v1::CommState>& views,
                  const std::vector<Unanswered>& silent) {
  const int nnodes = static_cast<int>(layout.node_names.size());
  std::vector<const v1::CommState*> view_of(static_cast<size_t>(nnodes), nullptr);
  for (const v1::CommState& v : views) {
    if (v.node_index() >= 0 && v.node_index() < nnodes && view_of[v.node_index()] == nullptr) {
      view_of[v.node_index()] = &v;
    }
  }
  std::vector<std::string> why(static_cast<size_t>(nnodes));
  for (const Unanswered& u : silent) {
    if (u.node >= 0 && u.node < nnodes && why[u.node].empty()) why[u.node] = u.why;
  }
  // Ranks each answering node still has.
  std::set<int> present;
  for (int n = 0; n < nnodes; ++n) {
    const v1::CommState* v = view_of[n];
    if (v == nullptr) continue;
    for (const v1::RankProgress& r : v->ranks()) {
      const int rank = r.rank();
      if (rank < 0 || rank >= layout.nranks ||
          static_cast<size_t>(rank) >= layout.node_of_rank.size() ||
          layout.node_of_rank[rank] != n) {
        continue;  // a node speaks only for its own ranks
      }
      if (!r.left()) present.insert(rank);
    }
  }
  Census out;
  std::vector<bool> node_lost(static_cast<size_t>(nnodes), true);
  int lowest_survivor = -1;
  for (int rank = 0; rank < layout.nranks; ++rank) {
    const int node =
        static_cast<size_t>(rank) < layout.node_of_rank.size() ? layout.node_of_rank[rank] : -1;
    if (present.count(rank) > 0) {
      if (node >= 0 && node < nnodes) node_lost[node] = false;
      if (lowest_survivor < 0) lowest_survivor = rank;
    } else {
      out.lost_ranks.push_back(rank);
    }
  }
  for (int n = 0; n < nnodes; ++n) {
    if (view_of[n] != nullptr) continue;
    const std::string& address =
        static_cast<size_t>(n) < layout.node_addresses.size() ? layout.node_addresses[n] : "";
    out.lost_nodes.push_back(absl::StrCat(layout.node_names[n], " (", address,
                                          "): ", why[n].empty() ? "no answer" : why[n]));
  }
  out.coordinator = layout.coordinator;
  bool coordinator_survives = false;
  bool coordinator_is_member = false;
  for (int n = 0; n < nnodes; ++n) {
    if (static_cast<size_t>(n) < layout.node_addresses.size() &&
        layout.node_addresses[n] == layout.coordinator) {
      coordinator_is_member = true;
      coordinator_survives = !node_lost[n];
    }
  }
  // A coordinator outside the layout (one node, "local:<node>") is left as it is; a member one
  // that lost every rank may be dead: the lowest survivor's node coordinates instead.
  if (coordinator_is_member && !coordinator_survives && lowest_survivor >= 0) {
    const int node = layout.node_of_rank[lowest_survivor];
    if (static_cast<size_t>(node) < layout.node_addresses.size() &&
        !layout.node_addresses[node].empty()) {
      out.coordinator = layout.node_addresses[node];
    }
  }
  return out;
}

}  // namespace railyard::diagnose
