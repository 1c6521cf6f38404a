#include "daemon/scheduler/sim/engine.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace railyard::scheduler::sim {

using topology::FabricKind;

const char* TierName(int tier) {
  switch (tier) {
    case kTierIntra:
      return "intra";
    case kTierNic:
      return "nic";
    case kTierSpine:
      return "spine";
    case kTierTorus:
      return "torus";
    default:
      return "?";
  }
}

// ---------------------------------------------------------------------------------------------
// FabricModel

FabricModel::FabricModel(const topology::FabricSpec& fabric) : f_(fabric) {
  g_ = f_.ranks_per_node;
  r_ = f_.rails;
  const int k = f_.nodes;
  capacity_.assign(static_cast<size_t>(k) * g_ * 2, f_.intra.beta_bytes_per_s);
  tier_.assign(capacity_.size(), kTierIntra);
  const auto add = [&](int64_t n, double cap, Tier t) {
    const auto base = static_cast<int64_t>(capacity_.size());
    capacity_.insert(capacity_.end(), n, cap);
    tier_.insert(tier_.end(), n, t);
    return base;
  };
  if (f_.kind == FabricKind::kTorus) {
    ndims_ = static_cast<int>(f_.torus_dims.size());
    int s = 1;
    for (int d : f_.torus_dims) {
      stride_.push_back(s);
      s *= d;
    }
    torus_base_ = add(int64_t{k} * ndims_ * 2, f_.inter.beta_bytes_per_s, kTierTorus);
    return;
  }
  nic_base_ = add(int64_t{k} * r_ * 2, f_.inter.beta_bytes_per_s, kTierNic);
  if (f_.kind == FabricKind::kThreeTier) {
    const int racks = (k + f_.nodes_per_rack - 1) / f_.nodes_per_rack;
    spine_base_ =
        add(int64_t{racks} * 2,
            f_.nodes_per_rack * r_ * f_.inter.beta_bytes_per_s / f_.oversubscription, kTierSpine);
  }
}

bool FabricModel::HasTier(int tier) const {
  switch (tier) {
    case kTierIntra:
      return true;
    case kTierNic:
      return f_.kind != FabricKind::kTorus;
    case kTierSpine:
      return f_.kind == FabricKind::kThreeTier;
    case kTierTorus:
      return f_.kind == FabricKind::kTorus;
    default:
      return false;
  }
}

std::string FabricModel::NodeName(int node) const {
  if (f_.kind != FabricKind::kTorus) return absl::StrCat("node", node);
  std::vector<int> c;
  for (int d = 0; d < ndims_; ++d) c.push_back(node / stride_[d] % f_.torus_dims[d]);
  return absl::StrCat("(", absl::StrJoin(c, ","), ")");
}

std::string FabricModel::Name(uint32_t link) const {
  const int64_t l = link;
  if (l < nic_base_ || (f_.kind == FabricKind::kTorus && l < torus_base_)) {
    const int64_t port = l / 2;
    return absl::StrCat("node", port / g_, "/local", port % g_, l % 2 == 0 ? " tx" : " rx");
  }
  if (f_.kind == FabricKind::kTorus) {
    const int64_t i = l - torus_base_;
    const int node = static_cast<int>(i / 2 / ndims_), dim = static_cast<int>(i / 2 % ndims_);
    const int c = node / stride_[dim] % f_.torus_dims[dim];
    const int step = i % 2 == 0 ? 1 : f_.torus_dims[dim] - 1;
    const int to = node + ((c + step) % f_.torus_dims[dim] - c) * stride_[dim];
    return absl::StrCat("torus ", NodeName(node), "->", NodeName(to));
  }
  if (f_.kind == FabricKind::kThreeTier && l >= spine_base_) {
    const int64_t i = l - spine_base_;
    return absl::StrCat("rack", i / 2, i % 2 == 0 ? " up" : " down");
  }
  const int64_t i = l - nic_base_;
  return absl::StrCat("node", i / 2 / r_, "/rail", i / 2 % r_, i % 2 == 0 ? " tx" : " rx");
}

void FabricModel::Route(int32_t src, int32_t dst, std::vector<uint32_t>* route, bool* inter,
                        uint32_t* tiers) const {
  *tiers = 0;
  if (src == kSwitch || dst == kSwitch) {
    // Rank <-> in-network switch: the rank's NIC on its rail, one direction.
    const int32_t rank = src == kSwitch ? dst : src;
    route->push_back(Nic(rank / g_, rank % g_ % r_, src == kSwitch ? 1 : 0));
    *inter = true;
    *tiers = 1u << kTierNic;
    return;
  }
  const int sn = src / g_, ss = src % g_, dn = dst / g_, ds = dst % g_;
  if (sn == dn) {
    route->push_back(Intra(sn, ss, 0));
    route->push_back(Intra(dn, ds, 1));
    *inter = false;
    *tiers = 1u << kTierIntra;
    return;
  }
  *inter = true;
  if (f_.kind == FabricKind::kTorus) {
    // Dimension-ordered: fix coordinate 0 first, then 1, ...; the shorter way round.
    int at = sn;
    for (int d = 0; d < ndims_; ++d) {
      const int size = f_.torus_dims[d];
      const int from = at / stride_[d] % size, to = dn / stride_[d] % size;
      if (from == to) continue;
      const int fwd = ((to - from) % size + size) % size;
      const bool plus = fwd <= size - fwd;
      const int hops = plus ? fwd : size - fwd;
      int c = from;
      for (int h = 0; h < hops; ++h) {
        const int node = at + (c - from) * stride_[d];
        route->push_back(TorusLink(node, d, plus ? 0 : 1));
        c = plus ? (c + 1) % size : (c + size - 1) % size;
      }
      at += (to - from) * stride_[d];
    }
    *tiers = 1u << kTierTorus;
    return;
  }
  const int rail = ss % r_;
  route->push_back(Nic(sn, rail, 0));
  *tiers = 1u << kTierNic;
  if (f_.kind == FabricKind::kThreeTier) {
    const int sr = sn / f_.nodes_per_rack, dr = dn / f_.nodes_per_rack;
    if (sr != dr) {
      route->push_back(Spine(sr, 0));
      route->push_back(Spine(dr, 1));
      *tiers |= 1u << kTierSpine;
    }
  }
  route->push_back(Nic(dn, rail, 1));
}

// ---------------------------------------------------------------------------------------------
// FlowGraph

namespace {

// Appends n flows (flow_of(i)) whose forward deps (local, earlier) deps_of(i) returns as a
// container, building the reverse edges of the new flows.
template <typename FlowOf, typename DepsOf>
absl::Status AppendJob(FlowGraph* g, size_t n, const FlowOf& flow_of, const DepsOf& deps_of) {
  const size_t base = g->flows.size();
  if (base + n >= std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("too many flows (", base + n, ")"));
  }
  g->flows.reserve(base + n);
  g->ndeps.resize(base + n, 0);
  std::vector<uint32_t> out(n + 1, 0);  // dependents per local flow, then offsets
  for (size_t i = 0; i < n; ++i) {
    g->flows.push_back(flow_of(i));
    const auto& deps = deps_of(i);
    g->ndeps[base + i] = static_cast<uint32_t>(deps.size());
    for (uint32_t u : deps) {
      if (u >= i) {
        return absl::InvalidArgumentError(
            absl::StrCat("transfer ", i, " depends on ", u, ", not an earlier transfer"));
      }
      ++out[u];
    }
  }
  uint64_t edges = 0;
  for (size_t i = 0; i <= n; ++i) {
    const uint32_t c = out[i];
    out[i] = static_cast<uint32_t>(edges);
    edges += c;
  }
  const uint64_t edge_base = g->next.size();
  g->next.resize(edge_base + edges);
  g->next_begin.reserve(base + n + 1);
  for (size_t i = 0; i < n; ++i) g->next_begin.push_back(edge_base + out[i + 1]);
  std::vector<uint32_t> fill(out.begin(), out.begin() + static_cast<ptrdiff_t>(n));
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t u : deps_of(i)) g->next[edge_base + fill[u]++] = static_cast<uint32_t>(base + i);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FlowGraph::AddSchedule(const RankSchedule& schedule, const std::vector<int32_t>& frank,
                                    uint32_t job) {
  const auto n = static_cast<int32_t>(frank.size());
  for (size_t i = 0; i < schedule.transfers.size(); ++i) {
    const Transfer& t = schedule.transfers[i];
    if (t.src.rank < 0 || t.src.rank >= n || t.dst.rank < 0 || t.dst.rank >= n) {
      return absl::InvalidArgumentError(absl::StrCat("transfer ", i, " names rank ", t.src.rank,
                                                     " -> ", t.dst.rank, " outside [0, ", n, ")"));
    }
  }
  return AppendJob(
      this, schedule.transfers.size(),
      [&](size_t i) {
        const Transfer& t = schedule.transfers[i];
        Flow f;
        f.bytes = t.bytes;
        f.src = frank[t.src.rank];
        f.dst = frank[t.dst.rank];
        f.job = job;
        return f;
      },
      [&](size_t i) -> const std::vector<uint32_t>& { return schedule.transfers[i].deps; });
}

void FlowGraph::AddFlows(const std::vector<Flow>& flows, const std::vector<uint64_t>& begin,
                         const std::vector<uint32_t>& deps) {
  struct Span {
    const uint32_t* b;
    const uint32_t* e;
    size_t size() const { return static_cast<size_t>(e - b); }
    const uint32_t* begin() const { return b; }
    const uint32_t* end() const { return e; }
  };
  // Deps are generated earlier-only by the caller; the status cannot fail.
  absl::Status s = AppendJob(
      this, flows.size(), [&](size_t i) { return flows[i]; },
      [&](size_t i) {
        return Span{deps.data() + begin[i], deps.data() + begin[i + 1]};
      });
  if (!s.ok()) std::abort();
}

// ---------------------------------------------------------------------------------------------
// Engine

namespace {

struct Event {
  double t;
  uint32_t id;       // flow (kStart) or active slot (kFinish)
  uint32_t version;  // kFinish: the slot's version when pushed; kStart: UINT32_MAX
  bool operator>(const Event& o) const {
    if (t != o.t) return t > o.t;
    return id > o.id;
  }
};
constexpr uint32_t kStartEvent = std::numeric_limits<uint32_t>::max();

class Engine {
 public:
  Engine(const FabricModel& model, const FlowGraph& graph, int njobs, EngineResult* result)
      : m_(model), g_(graph), res_(result) {
    const auto& f = model.fabric();
    ndeps_ = graph.ndeps;
    const int nlinks = model.nlinks();
    links_.resize(nlinks);
    res_->link_bytes.assign(nlinks, 0);
    res_->link_busy.assign(nlinks, 0);
    res_->job_time.assign(njobs, 0);
    res_->job_flows.assign(njobs, 0);
    res_->job_tiers.assign(njobs, std::vector<TierStats>(kNumTiers));
    for (auto& tiers : res_->job_tiers) {
      for (int t = 0; t < kNumTiers; ++t) tiers[t].tier = TierName(t);
    }
    cpu_free_.assign(static_cast<size_t>(f.nranks()), 0);
  }

  absl::Status Run() {
    const size_t n = g_.flows.size();
    for (size_t i = 0; i < n; ++i) {
      if (ndeps_[i] == 0) ready_.push_back(static_cast<uint32_t>(i));
    }
    Drain(0);
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      if (e.version == kStartEvent) {
        StartBytes(e.id, e.t);
      } else if (active_[e.id].version == e.version && active_[e.id].flow != kNone) {
        Finish(e.id, e.t);
      }
      Drain(e.t);
    }
    if (done_ != n) {
      return absl::InternalError(absl::StrCat("simulation stalled: ", n - done_, " of ", n,
                                              " transfers never became ready (dependency cycle)"));
    }
    for (size_t l = 0; l < links_.size(); ++l) res_->link_busy[l] = links_[l].busy;
    return absl::OkStatus();
  }

 private:
  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

  struct Link {
    std::vector<std::pair<uint32_t, uint32_t>> members;  // (active slot, hop index)
    double since = 0;
    double busy = 0;
  };
  struct Active {
    uint32_t flow = kNone;
    uint32_t version = 0;
    double remaining = 0;
    double rate = 0;
    double last = 0;
    std::vector<uint32_t> links;
    std::vector<uint32_t> pos;  // index in links[hop].members
  };

  // Starts every ready flow at time t (zero-cost flows complete at once, freeing others).
  void Drain(double t) {
    const auto& f = m_.fabric();
    while (!ready_.empty()) {
      const uint32_t id = ready_.back();
      ready_.pop_back();
      const Flow& fl = g_.flows[id];
      if ((fl.flags & Flow::kJoin) != 0 || fl.src == fl.dst) {
        Complete(id, t);
        continue;
      }
      double start = t;
      if (fl.src != kSwitch && f.overhead_s > 0) {
        start = std::max(t, cpu_free_[fl.src]) + f.overhead_s;
        cpu_free_[fl.src] = start;
      }
      if ((fl.flags & Flow::kNoAlpha) == 0) {
        const bool inter = fl.src == kSwitch || fl.dst == kSwitch ||
                           fl.src / f.ranks_per_node != fl.dst / f.ranks_per_node;
        start += inter ? f.inter.alpha_s : f.intra.alpha_s;
      }
      events_.push({start, id, kStartEvent});
    }
  }

  void StartBytes(uint32_t id, double t) {
    const Flow& fl = g_.flows[id];
    route_.clear();
    bool inter = false;
    uint32_t tiers = 0;
    m_.Route(fl.src, fl.dst, &route_, &inter, &tiers);
    auto& jt = res_->job_tiers[fl.job];
    for (int k = 0; k < kNumTiers; ++k) {
      if ((tiers & (1u << k)) != 0) {
        jt[k].bytes += fl.bytes;
        ++jt[k].messages;
      }
    }
    if (fl.bytes == 0 || route_.empty()) {
      Complete(id, t);
      return;
    }
    uint32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slot = static_cast<uint32_t>(active_.size());
      active_.emplace_back();
    }
    Active& a = active_[slot];
    a.flow = id;
    a.remaining = static_cast<double>(fl.bytes);
    a.rate = 0;
    a.last = t;
    a.links.assign(route_.begin(), route_.end());
    a.pos.resize(route_.size());
    for (size_t h = 0; h < route_.size(); ++h) {
      Link& l = links_[route_[h]];
      if (l.members.empty()) l.since = t;
      a.pos[h] = static_cast<uint32_t>(l.members.size());
      l.members.emplace_back(slot, static_cast<uint32_t>(h));
      res_->link_bytes[route_[h]] += fl.bytes;
    }
    Reprice(slot, t);
  }

  void Finish(uint32_t slot, double t) {
    Active& a = active_[slot];
    const uint32_t id = a.flow;
    for (size_t h = 0; h < a.links.size(); ++h) {
      Link& l = links_[a.links[h]];
      const uint32_t p = a.pos[h];
      const auto last = l.members.back();
      l.members[p] = last;
      active_[last.first].pos[last.second] = p;
      l.members.pop_back();
      if (l.members.empty()) l.busy += t - l.since;
    }
    a.flow = kNone;
    ++a.version;
    Reprice(slot, t);
    free_.push_back(slot);
    Complete(id, t);
  }

  // Recomputes the rate of every active flow on the links of `slot` (whose membership changed).
  void Reprice(uint32_t slot, double t) {
    ++epoch_;
    if (stamp_.size() < active_.size()) stamp_.resize(active_.size(), 0);
    // Update() never changes a slot's links, so this reference stays valid.
    const std::vector<uint32_t>& links = active_[slot].links;
    for (uint32_t lid : links) {
      for (const auto& [other, hop] : links_[lid].members) {
        if (stamp_[other] == epoch_) continue;
        stamp_[other] = epoch_;
        Update(other, t);
      }
    }
  }

  void Update(uint32_t slot, double t) {
    Active& a = active_[slot];
    double rate = std::numeric_limits<double>::infinity();
    for (uint32_t lid : a.links) {
      rate = std::min(rate, m_.capacity(lid) / static_cast<double>(links_[lid].members.size()));
    }
    if (rate == a.rate) return;
    a.remaining = std::max(0.0, a.remaining - (t - a.last) * a.rate);
    a.last = t;
    a.rate = rate;
    ++a.version;
    events_.push({t + a.remaining / rate, slot, a.version});
  }

  void Complete(uint32_t id, double t) {
    ++done_;
    const Flow& fl = g_.flows[id];
    res_->job_time[fl.job] = std::max(res_->job_time[fl.job], t);
    ++res_->job_flows[fl.job];
    for (uint64_t e = g_.next_begin[id]; e < g_.next_begin[id + 1]; ++e) {
      const uint32_t next = g_.next[e];
      if (--ndeps_[next] == 0) ready_.push_back(next);
    }
  }

  const FabricModel& m_;
  const FlowGraph& g_;
  EngineResult* res_;
  std::vector<uint32_t> ndeps_;
  std::vector<Link> links_;
  std::vector<Active> active_;
  std::vector<uint32_t> free_;
  std::vector<uint32_t> ready_;
  std::vector<uint32_t> route_;
  std::vector<double> cpu_free_;
  std::vector<uint32_t> stamp_;
  uint32_t epoch_ = 0;
  size_t done_ = 0;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
};

}  // namespace

absl::Status RunEngine(const FabricModel& model, const FlowGraph& graph, int njobs,
                       EngineResult* result) {
  Engine e(model, graph, njobs, result);
  return e.Run();
}

}  // namespace railyard::scheduler::sim
