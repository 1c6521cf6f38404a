#include "daemon/diagnose/verdicts.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace railyard::diagnose {

namespace {

std::string Seconds(double s) {
  if (s < 10) return absl::StrFormat("%.1f s", s);
  return absl::StrFormat("%.0f s", s);
}

// What must agree between nodes for one sequence number.
using Digest = std::tuple<std::string, std::string, uint64_t, std::string, int>;
Digest DigestOf(const v1::OpProgress& op) {
  const bool rooted = op.op() == "broadcast" || op.op() == "reduce";
  // AllToAllv counts differ per rank by design: only the op and dtype must agree.
  const uint64_t count = op.op() == "alltoallv" ? 0 : op.count();
  return {op.op(), op.dtype(), count, op.red_op(), rooted ? op.root() : 0};
}

std::string NodeName(const v1::CommState& st) {
  return st.node_name().empty() ? absl::StrCat("node ", st.node_index()) : st.node_name();
}

}  // namespace

std::string ExactBytes(uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return absl::StrCat(b >> 30, " GiB");
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return absl::StrCat(b >> 20, " MiB");
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return absl::StrCat(b >> 10, " KiB");
  return absl::StrCat(b, " B");
}

const v1::TransferProgress* WaitOn(const v1::CommState& st, uint64_t seq, int node, int rail,
                                   double min_age_s) {
  if (!st.has_front() || st.front().seq() != seq || !st.front().running()) return nullptr;
  for (const v1::TransferProgress& t : st.front().transfers()) {
    if (t.peer_node() == node && (rail < 0 || t.rail() == rail) && t.age_seconds() >= min_age_s) {
      return &t;
    }
  }
  return nullptr;
}

std::string Describe(const v1::OpProgress& op) {
  std::string out = absl::StrCat(op.op(), " ", op.dtype());
  // An AllToAllv's counts are per peer, a barrier has none.
  if (op.op() != "alltoallv" && op.op() != "barrier") {
    absl::StrAppend(&out, " count=", op.count());
    if (op.bytes() > 0) absl::StrAppend(&out, " (", ExactBytes(op.bytes()), ")");
  }
  if (!op.red_op().empty()) absl::StrAppend(&out, " ", op.red_op());
  if (op.op() == "broadcast" || op.op() == "reduce") absl::StrAppend(&out, " root=", op.root());
  return out;
}

std::string RankRanges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

v1::CommDiagnosis Diagnose(const std::vector<v1::CommState>& states,
                           const std::vector<Unanswered>& unanswered, absl::Duration stall) {
  v1::CommDiagnosis out;
  const double stall_s = absl::ToDoubleSeconds(stall);
  for (const v1::CommState& st : states) *out.add_states() = st;
  for (const Unanswered& u : unanswered) out.add_unreachable(absl::StrCat(u.name, ": ", u.why));
  if (!states.empty()) {
    out.set_comm_id(states.front().comm_id());
    out.set_job_id(states.front().job_id());
  }
  std::vector<std::string> verdicts;

  // By node index; node names from whoever knows them.
  std::map<int, const v1::CommState*> by_node;
  for (const v1::CommState& st : states) by_node[st.node_index()] = &st;
  std::map<int, std::string> names;
  for (const v1::CommState& st : states) {
    for (int i = 0; i < st.node_names_size(); ++i) names[i] = st.node_names(i);
  }
  for (const Unanswered& u : unanswered) names[u.node] = u.name;
  for (const auto& [i, st] : by_node) names[i] = NodeName(*st);
  auto name_of = [&](int node) {
    auto it = names.find(node);
    return it != names.end() && !it->second.empty() ? it->second : absl::StrCat("node ", node);
  };
  std::set<int> silent;
  for (const Unanswered& u : unanswered) silent.insert(u.node);

  // The pending (or failed-at) operation each node reports, by sequence number.
  auto pending_of = [](const v1::CommState& st) -> const v1::OpProgress* {
    if (st.has_front() && st.front().submitted_ranks_size() > 0) return &st.front();
    if (st.has_failed_op() && st.failed_op().submitted_ranks_size() > 0) return &st.failed_op();
    return nullptr;
  };
  uint64_t oldest = std::numeric_limits<uint64_t>::max();
  for (const auto& [i, st] : by_node) {
    if (const v1::OpProgress* op = pending_of(*st)) oldest = std::min(oldest, op->seq());
  }

  // 1. Nodes that disagree on the oldest pending sequence number.
  bool disagreement = false;
  if (oldest != std::numeric_limits<uint64_t>::max()) {
    std::map<Digest, std::vector<std::pair<int, const v1::OpProgress*>>> by_digest;
    for (const auto& [i, st] : by_node) {
      const v1::OpProgress* op = pending_of(*st);
      if (op != nullptr && op->seq() == oldest) by_digest[DigestOf(*op)].push_back({i, op});
    }
    if (by_digest.size() > 1) {
      disagreement = true;
      // Sides in node order (each side's nodes are already in order: by_node is sorted).
      std::vector<const std::vector<std::pair<int, const v1::OpProgress*>>*> ordered;
      for (const auto& [digest, nodes] : by_digest) ordered.push_back(&nodes);
      std::sort(ordered.begin(), ordered.end(),
                [](const auto* a, const auto* b) { return a->front().first < b->front().first; });
      std::vector<std::string> sides;
      std::vector<std::string> side_nodes;
      for (const auto* side : ordered) {
        const auto& nodes = *side;
        std::vector<std::string> node_names;
        std::vector<int> ranks;
        for (const auto& [i, op] : nodes) {
          node_names.push_back(name_of(i));
          ranks.insert(ranks.end(), op->submitted_ranks().begin(), op->submitted_ranks().end());
        }
        side_nodes.push_back(absl::StrJoin(node_names, ", "));
        sides.push_back(absl::StrCat(absl::StrJoin(node_names, ", "), " ranks ", RankRanges(ranks),
                                     " submitted ", Describe(*nodes.front().second)));
      }
      verdicts.push_back(absl::StrCat("nodes ", absl::StrJoin(side_nodes, " and "),
                                      " disagree at seq ", oldest, ": ",
                                      absl::StrJoin(sides, "; ")));
    }
  }

  // 2. Ranks that have not submitted the oldest pending sequence number while others wait.
  if (!disagreement && oldest != std::numeric_limits<uint64_t>::max()) {
    std::vector<int> waiting, missing;
    std::vector<std::string> missing_named;
    double since = 0;
    const v1::OpProgress* what = nullptr;
    for (const auto& [i, st] : by_node) {
      for (const v1::RankProgress& r : st->ranks()) {
        if (r.submitted() > oldest) {
          waiting.push_back(r.rank());
        } else if (r.completed() <= oldest) {
          missing.push_back(r.rank());
          missing_named.push_back(
              absl::StrCat("rank ", r.rank(), " (node ", name_of(i),
                           r.pid() > 0 ? absl::StrCat(", pid ", r.pid()) : std::string(),
                           r.left() ? ", which left the communicator" : "", ")"));
        }
      }
      const v1::OpProgress* op = pending_of(*st);
      if (op != nullptr && op->seq() == oldest) {
        since = std::max(since, op->age_seconds());
        if (what == nullptr) what = op;
      }
    }
    if (!missing.empty() && !waiting.empty() && since >= stall_s && what != nullptr) {
      std::string v =
          absl::StrCat(absl::StrJoin(missing_named, ", "), missing.size() == 1 ? " has" : " have",
                       " not submitted seq ", oldest, " (", Describe(*what), "); ",
                       waiting.size() == 1 ? "rank " : "ranks ", RankRanges(waiting),
                       waiting.size() == 1 ? " is" : " are", " waiting since ", Seconds(since));
      if (!silent.empty()) {
        std::vector<std::string> s;
        for (int n : silent) s.push_back(name_of(n));
        absl::StrAppend(&v, " (the ranks of ", absl::StrJoin(s, ", "),
                        " are unknown: it did not answer)");
      }
      verdicts.push_back(std::move(v));
    }
  }

  // 3. Transfers of a running operation that do not complete. Behind a disagreement or a rank
  // that did not submit, transfers wait as a consequence: then only those the peer also reports
  // in flight (the link itself) or whose peer did not answer are findings.
  const bool explained = !verdicts.empty();
  // A node that itself waits on a stalled transfer: its peers waiting on it are a chain whose
  // cause is that node's own wait, reported for it.
  auto stalled = [&](const v1::CommState& st) {
    if (!st.has_front() || !st.front().running()) return false;
    for (const v1::TransferProgress& t : st.front().transfers()) {
      if (t.age_seconds() >= stall_s) return true;
    }
    return false;
  };
  // By cause: a silent peer or a stalled link first, then a lost message, a peer that has not
  // started, a peer still on its way.
  std::vector<std::pair<int, std::string>> links;
  std::set<std::pair<int, int>> mutual_pairs;  // (node, node) reported as waiting on each other
  for (const auto& [i, st] : by_node) {
    if (!st->has_front() || !st->front().running()) continue;
    const v1::OpProgress& op = st->front();
    // The oldest stalled transfer per (peer, rail, direction).
    std::map<std::tuple<int, int, bool>, const v1::TransferProgress*> oldest_transfer;
    for (const v1::TransferProgress& t : op.transfers()) {
      if (t.age_seconds() < stall_s) continue;
      auto& slot = oldest_transfer[{t.peer_node(), t.rail(), t.send()}];
      if (slot == nullptr || t.age_seconds() > slot->age_seconds()) slot = &t;
    }
    for (const auto& [key, t] : oldest_transfer) {
      const int peer = t->peer_node();
      std::string v =
          absl::StrCat("seq ", op.seq(), " step ", t->step(), ": ", name_of(i),
                       t->send() ? " waits for its send to " : " waits for a chunk from ",
                       name_of(peer), " on rail", t->rail(), " (", ExactBytes(t->bytes()),
                       ") since ", Seconds(t->age_seconds()), "; ");
      auto peer_it = by_node.find(peer);
      int cause = 0;
      if (silent.count(peer) > 0) {
        absl::StrAppend(&v, name_of(peer),
                        " did not answer (its daemon is stopped, overloaded or cut off)");
      } else if (peer_it == by_node.end()) {
        cause = 3;
        absl::StrAppend(&v, "nothing is known of ", name_of(peer));
      } else {
        const v1::CommState& ps = *peer_it->second;
        bool counterpart = false;
        if (ps.has_front() && ps.front().seq() == op.seq() && ps.front().running()) {
          for (const v1::TransferProgress& pt : ps.front().transfers()) {
            counterpart |= pt.peer_node() == i && pt.rail() == t->rail() && pt.send() != t->send();
          }
        }
        const uint64_t peer_done = ps.ranks_size() > 0 ? ps.ranks(0).completed() : 0;
        if (explained && !counterpart) continue;
        if (counterpart) {
          cause = 1;
          absl::StrAppend(&v, name_of(peer), " reports that ", t->send() ? "receive" : "send",
                          " in flight (link stalled)");
        } else if (peer_done > op.seq()) {
          cause = 2;
          absl::StrAppend(&v, name_of(peer), " completed seq ", op.seq(),
                          " (the message was lost or went elsewhere)");
        } else if (ps.has_front() && ps.front().seq() == op.seq() && ps.front().running()) {
          // Each waiting for the other: in a schedule that is right, waits cannot form a cycle
          // unless what one of them sent has not arrived (lost, or crawling). On the same rail
          // (both receiving: their sends left into a link that delivers nothing), that link.
          // Reported once per pair.
          const v1::TransferProgress* mutual = WaitOn(ps, op.seq(), i, t->rail(), stall_s);
          if (mutual == nullptr) mutual = WaitOn(ps, op.seq(), i, /*rail=*/-1, stall_s);
          if (mutual != nullptr) {
            if (!mutual_pairs.insert({std::min(i, peer), std::max(i, peer)}).second) continue;
            cause = 1;
            absl::StrAppend(
                &v, name_of(peer),
                mutual->send() ? " waits for its send to " : " waits for a chunk from ", name_of(i),
                " on rail", mutual->rail(), mutual->rail() == t->rail() ? " too" : "", ", since ",
                Seconds(mutual->age_seconds()),
                mutual->rail() == t->rail()
                    ? " (neither side's data arrives: the link is down, cut or very slow)"
                    : absl::StrCat(" (each waits for the other: what one sent has not "
                                   "arrived, on rail",
                                   t->rail(), " or rail", mutual->rail(), ")"));
            links.emplace_back(cause, std::move(v));
            continue;
          }
          if (stalled(ps)) continue;  // a chain: the peer's own wait is the finding
          cause = 4;
          absl::StrAppend(&v, name_of(peer), " runs seq ", op.seq(), " (step ",
                          ps.front().steps_done(), " of ", ps.front().steps_total(),
                          ") and has not reached that ", t->send() ? "receive" : "send");
        } else {
          cause = 3;
          absl::StrAppend(&v, name_of(peer), " has not started seq ", op.seq());
        }
      }
      links.emplace_back(cause, std::move(v));
    }
  }
  std::stable_sort(links.begin(), links.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [cause, v] : links) verdicts.push_back(std::move(v));

  // 4. Daemons that did not answer (beyond what the transfers above already say).
  for (const Unanswered& u : unanswered) {
    verdicts.push_back(
        absl::StrCat(name_of(u.node), " did not answer the diagnosis (", u.why,
                     "): its daemon is stopped, overloaded or cut off from this one"));
  }

  // 5. Failures, once per distinct reason.
  std::set<std::string> reasons;
  for (const auto& [i, st] : by_node) {
    if (st->state() != "failed" || !reasons.insert(st->error()).second) continue;
    verdicts.push_back(absl::StrCat("the communicator failed on ", name_of(i), ": ", st->error()));
  }

  out.set_healthy(verdicts.empty());
  if (verdicts.empty()) {
    int ranks = 0;
    double age = 0;
    for (const auto& [i, st] : by_node) {
      ranks += st->ranks_size();
      if (st->has_front()) age = std::max(age, st->front().age_seconds());
    }
    std::string v = absl::StrCat("healthy: ", ranks, " ranks on ", by_node.size(), " nodes");
    if (oldest != std::numeric_limits<uint64_t>::max()) {
      absl::StrAppend(&v, ", seq ", oldest, " pending for ", Seconds(age));
    } else {
      absl::StrAppend(&v, ", nothing pending");
    }
    verdicts.push_back(std::move(v));
  }
  for (std::string& v : verdicts) out.add_verdicts(std::move(v));
  return out;
}

}  // namespace railyard::diagnose
