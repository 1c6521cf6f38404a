#include "daemon/scheduler/schedule.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/scheduler/algorithms/algorithms.h"
#include "daemon/scheduler/algorithms/builder.h"

namespace railyard::scheduler {

int CommLayout::ranks_per_node() const {
  if (ranks_of_node.empty()) return 0;
  const size_t g = ranks_of_node[0].size();
  for (const auto& ranks : ranks_of_node) {
    if (ranks.size() != g) return 0;
  }
  return static_cast<int>(g);
}

int CommLayout::rail_of_rank(int rank) const {
  return local_index_of_rank[rank] % std::max(1, rails);
}

int CommLayout::rail_for(int rank, uint64_t stripe) const {
  const int r = std::max(1, rails);
  const int g = static_cast<int>(ranks_of_node[node_of_rank[rank]].size());
  const int local = local_index_of_rank[rank];
  if (g >= r) return local % r;
  const int mine = (r - local + g - 1) / g;  // rails local, local + g, ... below r
  return local + g * static_cast<int>(stripe % static_cast<uint64_t>(mine));
}

bool CommLayout::rail_serves(int rank, int rail) const {
  const int r = std::max(1, rails);
  const int g = static_cast<int>(ranks_of_node[node_of_rank[rank]].size());
  if (g >= r) return rail == rail_of_rank(rank);
  return rail >= 0 && rail < r && rail % g == local_index_of_rank[rank];
}

CommLayout CommLayout::Uniform(int nnodes, int ranks_per_node, int rails) {
  std::vector<int> node_of_rank;
  for (int k = 0; k < nnodes; ++k) node_of_rank.insert(node_of_rank.end(), ranks_per_node, k);
  return FromNodeOfRank(node_of_rank, rails);
}

CommLayout CommLayout::FromNodeOfRank(const std::vector<int>& node_of_rank, int rails) {
  CommLayout l;
  l.nranks = static_cast<int>(node_of_rank.size());
  l.nnodes =
      node_of_rank.empty() ? 0 : *std::max_element(node_of_rank.begin(), node_of_rank.end()) + 1;
  l.rails = rails;
  l.node_of_rank = node_of_rank;
  l.local_index_of_rank.resize(l.nranks);
  l.ranks_of_node.assign(l.nnodes, {});
  for (int r = 0; r < l.nranks; ++r) {
    auto& ranks = l.ranks_of_node[node_of_rank[r]];
    l.local_index_of_rank[r] = static_cast<int>(ranks.size());
    ranks.push_back(r);
  }
  return l;
}

// ---------------------------------------------------------------------------------------------
// Project

namespace {

// Inter-node reductions are received into staging slots: a ring of kStagingDepth slots per
// stream (source rank -> destination rank), so that one stream never waits for another's
// reductions. A recv into a slot waits for the step that consumed the slot's previous message.
constexpr int kStagingDepth = 4;

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

bool NeedsStaging(const Transfer& t) {
  return t.bytes > 0 && (t.kind == Transfer::Kind::kReduce || t.finalize);
}

struct Stream {
  uint64_t offset = 0;      // first slot, in the destination rank's scratch
  uint64_t slot_bytes = 0;  // largest transfer of the stream, aligned
  uint64_t next = 0;        // transfers staged so far
  std::vector<int64_t> last_user = std::vector<int64_t>(kStagingDepth, -1);
};

}  // namespace

NodeSchedule Project(const RankSchedule& schedule, const CommLayout& layout, const OpShape& shape,
                     int node) {
  NodeSchedule out;
  out.node = node;
  const auto& transfers = schedule.transfers;
  const auto node_of = [&](int rank) { return layout.node_of_rank[rank]; };

  // Staging streams into this node's ranks, each laid out after the previous one of its rank.
  std::map<std::pair<int, int>, Stream> streams;  // (dst rank, src rank)
  for (const Transfer& t : transfers) {
    if (node_of(t.dst.rank) == node && node_of(t.src.rank) != node && NeedsStaging(t)) {
      Stream& st = streams[{t.dst.rank, t.src.rank}];
      st.slot_bytes = std::max(st.slot_bytes, AlignUp(t.bytes, 64));
    }
  }
  const uint64_t staging_base = AlignUp(schedule.scratch_bytes_per_rank, 64);
  std::vector<uint64_t> staging_end(layout.nranks, staging_base);
  out.scratch_bytes_per_rank = schedule.scratch_bytes_per_rank;
  for (auto& [key, st] : streams) {
    st.offset = staging_end[key.first];
    staging_end[key.first] += kStagingDepth * st.slot_bytes;
    out.scratch_bytes_per_rank = std::max(out.scratch_bytes_per_rank, staging_end[key.first]);
  }

  // This node's completion step of each transfer (-1: the transfer does not touch this node).
  std::vector<int64_t> step_of(transfers.size(), -1);
  std::vector<uint64_t> sent_to(layout.nnodes, 0), recv_from(layout.nnodes, 0);
  // Inter-node transfers so far per (source, destination) rank: their rails (rail_for).
  std::map<std::pair<int, int>, uint64_t> stripes;

  const auto local_deps = [&](const Transfer& t) {
    Deps deps;
    for (uint32_t u : t.deps) {
      if (u < step_of.size() && step_of[u] >= 0) deps.push_back(static_cast<uint32_t>(step_of[u]));
    }
    return deps;
  };
  const auto add = [&](NodeStep step) {
    out.steps.push_back(std::move(step));
    return static_cast<int64_t>(out.steps.size() - 1);
  };

  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& t = transfers[i];
    const int sn = node_of(t.src.rank), dn = node_of(t.dst.rank);
    if (sn != node && dn != node) continue;
    if (sn == dn) {
      NodeStep step;
      step.kind = t.kind == Transfer::Kind::kCopy ? NodeStep::Kind::kCopy : NodeStep::Kind::kReduce;
      step.src = t.src;
      step.dst = t.dst;
      step.bytes = t.bytes;
      step.finalize = t.finalize;
      step.deps = local_deps(t);
      step_of[i] = add(std::move(step));
      continue;
    }
    const int rail = layout.rail_for(t.src.rank, stripes[{t.src.rank, t.dst.rank}]++);
    if (sn == node) {
      NodeStep send;
      send.kind = NodeStep::Kind::kSend;
      send.src = t.src;
      send.bytes = t.bytes;
      send.peer = dn;
      send.rail = rail;
      send.tag = sent_to[dn]++;
      send.deps = local_deps(t);
      step_of[i] = add(std::move(send));
      continue;
    }
    NodeStep recv;
    recv.kind = NodeStep::Kind::kRecv;
    recv.bytes = t.bytes;
    recv.peer = sn;
    recv.rail = rail;
    recv.tag = recv_from[sn]++;
    if (!NeedsStaging(t)) {
      recv.dst = t.dst;
      recv.deps = local_deps(t);
      step_of[i] = add(std::move(recv));
      continue;
    }
    // Receive into a staging slot of the destination rank, then reduce (or finalize-copy) into
    // place once the destination's own dependencies are done.
    Stream& st = streams[{t.dst.rank, t.src.rank}];
    const uint64_t slot = st.next++ % kStagingDepth;
    int64_t& user = st.last_user[slot];
    recv.dst.rank = t.dst.rank;
    recv.dst.space = RankRef::Space::kScratch;
    recv.dst.offset = st.offset + slot * st.slot_bytes;
    if (user >= 0) recv.deps.push_back(static_cast<uint32_t>(user));
    const RankRef staged = recv.dst;
    const int64_t recv_step = add(std::move(recv));
    NodeStep apply;
    apply.kind = t.kind == Transfer::Kind::kCopy ? NodeStep::Kind::kCopy : NodeStep::Kind::kReduce;
    apply.src = staged;
    apply.dst = t.dst;
    apply.bytes = t.bytes;
    apply.finalize = t.finalize;
    apply.deps = local_deps(t);
    apply.deps.push_back(static_cast<uint32_t>(recv_step));
    user = add(std::move(apply));
    step_of[i] = user;
  }
  FuseCopiesIntoReduces(out);
  return out;
}

namespace {

// Whether [a, a + n) and [b, b + n) of one rank overlap without being the same range.
bool PartlyOverlap(const RankRef& a, const RankRef& b, uint64_t n) {
  return a.rank == b.rank && a.space == b.space && a.offset != b.offset &&
         a.offset < b.offset + n && b.offset < a.offset + n;
}

}  // namespace

size_t FuseCopiesIntoReduces(NodeSchedule& schedule) {
  std::vector<NodeStep>& steps = schedule.steps;
  const size_t n = steps.size();
  std::vector<uint32_t> dependents(n, 0);
  for (const NodeStep& s : steps) {
    for (uint32_t d : s.deps) {
      if (d < n) ++dependents[d];
    }
  }
  std::vector<bool> removed(n, false);
  size_t fused = 0;
  for (size_t a = 0; a < n; ++a) {
    NodeStep& reduce = steps[a];
    if (reduce.kind != NodeStep::Kind::kReduce || reduce.bytes == 0) continue;
    for (size_t k = 0; k < reduce.deps.size(); ++k) {
      const uint32_t c = reduce.deps[k];
      if (c >= n || removed[c] || dependents[c] != 1) continue;
      const NodeStep& copy = steps[c];
      if (copy.kind != NodeStep::Kind::kCopy || copy.finalize || copy.bytes != reduce.bytes ||
          copy.dst != reduce.dst || PartlyOverlap(copy.src, copy.dst, copy.bytes) ||
          PartlyOverlap(reduce.src, reduce.dst, reduce.bytes) || reduce.src == reduce.dst) {
        continue;
      }
      // The copy's deps take its place in the reduce's (which keep their order otherwise).
      Deps deps;
      const auto add = [&deps](uint32_t d) {
        if (std::find(deps.begin(), deps.end(), d) == deps.end()) deps.push_back(d);
      };
      for (uint32_t d : reduce.deps) {
        if (d != c) {
          add(d);
          continue;
        }
        for (uint32_t e : copy.deps) add(e);
      }
      reduce.kind = NodeStep::Kind::kCombine;
      reduce.src2 = copy.src;
      reduce.deps = std::move(deps);
      removed[c] = true;
      ++fused;
      break;
    }
  }
  if (fused == 0) return 0;
  // Renumber: the only dependent of a removed copy now depends on the copy's own deps instead.
  std::vector<uint32_t> index(n, 0);
  uint32_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    index[i] = next;
    if (!removed[i]) ++next;
  }
  std::vector<NodeStep> kept;
  kept.reserve(next);
  for (size_t i = 0; i < n; ++i) {
    if (removed[i]) continue;
    NodeStep s = std::move(steps[i]);
    for (uint32_t& d : s.deps) d = index[d];
    kept.push_back(std::move(s));
  }
  steps = std::move(kept);
  return fused;
}

// ---------------------------------------------------------------------------------------------
// Generate

namespace {

absl::Status CheckLayout(const CommLayout& l) {
  if (l.nranks < 1 || l.nnodes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout needs >= 1 rank and node, got ", l.nranks, " and ", l.nnodes));
  }
  if (l.rails < 1) return absl::InvalidArgumentError(absl::StrCat("rails ", l.rails, " < 1"));
  if (l.node_of_rank.size() != static_cast<size_t>(l.nranks) ||
      l.local_index_of_rank.size() != static_cast<size_t>(l.nranks) ||
      l.ranks_of_node.size() != static_cast<size_t>(l.nnodes)) {
    return absl::InvalidArgumentError("layout vectors do not match nranks/nnodes");
  }
  std::vector<bool> seen(l.nranks, false);
  for (int k = 0; k < l.nnodes; ++k) {
    if (l.ranks_of_node[k].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("node ", k, " holds no rank"));
    }
    for (size_t i = 0; i < l.ranks_of_node[k].size(); ++i) {
      const int r = l.ranks_of_node[k][i];
      if (r < 0 || r >= l.nranks || seen[r] || l.node_of_rank[r] != k ||
          l.local_index_of_rank[r] != static_cast<int>(i)) {
        return absl::InvalidArgumentError(
            absl::StrCat("layout is inconsistent at node ", k, " local index ", i));
      }
      seen[r] = true;
    }
  }
  if (std::find(seen.begin(), seen.end(), false) != seen.end()) {
    return absl::InvalidArgumentError("layout leaves a rank on no node");
  }
  return absl::OkStatus();
}

absl::Status CheckShape(const OpShape& s, int n) {
  if (HasRoot(s.op) && (s.root < 0 || s.root >= n)) {
    return absl::InvalidArgumentError(absl::StrCat("root ", s.root, " not in [0, ", n, ")"));
  }
  if (s.op == OpKind::kAllToAllv) {
    const size_t nn = static_cast<size_t>(n) * n;
    if (s.a2av_counts.size() != nn || s.a2av_send_displs.size() != nn ||
        s.a2av_recv_displs.size() != nn) {
      return absl::InvalidArgumentError(
          absl::StrCat("alltoallv needs nranks^2 = ", nn, " counts and displacements"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RankSchedule> Generate(const std::string& algo, const OpShape& shape,
                                      const CommLayout& layout, size_t chunk_bytes) {
  if (IsPointToPoint(shape.op)) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpName(shape.op), " is point-to-point, not a generated collective"));
  }
  const algorithms::AlgorithmInfo* info = algorithms::FindAlgorithm(algo);
  if (info == nullptr) {
    std::vector<std::string> names;
    for (const auto& a : algorithms::AlgorithmTable()) names.emplace_back(a.name);
    return absl::InvalidArgumentError(
        absl::StrCat("unknown algorithm '", algo, "' (known: ", absl::StrJoin(names, ", "), ")"));
  }
  if (!algorithms::Implements(*info, shape.op)) {
    return absl::InvalidArgumentError(
        absl::StrCat("algorithm ", algo, " does not implement op ", OpName(shape.op),
                     " (available: ", algorithms::AlgorithmsFor(shape.op), ")"));
  }
  if (auto s = CheckLayout(layout); !s.ok()) return s;
  if (auto s = CheckShape(shape, layout.nranks); !s.ok()) return s;
  algorithms::ScheduleBuilder builder(shape, layout, chunk_bytes);
  if (auto s = info->generate(builder); !s.ok()) return s;
  return std::move(builder).Finish(info->name);
}

}  // namespace railyard::scheduler
