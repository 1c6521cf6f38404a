#include "daemon/scheduler/sim/engine.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
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
                        uint32_t* tiers, uint16_t stripe) const {
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
  const int rail = Rail(src, stripe);
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

// Appends n flows: flow_of(i, &flow) fills flow i or says why transfer i is invalid; deps_of(i)
// returns its forward deps (local indices, earlier than i) as a container. Builds the reverse
// edges of the new flows. On error nothing is appended.
template <typename FlowOf, typename DepsOf>
absl::Status AppendJob(FlowGraph* g, size_t n, const FlowOf& flow_of, const DepsOf& deps_of) {
  const size_t base = g->flows.size();
  if (base + n >= std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("too many flows (", base + n, ")"));
  }
  const auto fail = [&](absl::Status s) {
    g->flows.resize(base);
    g->ndeps.resize(base);
    return s;
  };
  g->flows.resize(base + n);
  g->ndeps.resize(base + n);
  Flow* flows = g->flows.data() + base;
  uint32_t* ndeps = g->ndeps.data() + base;
  // One pass over the schedule for the flows and the dependents each has, one to place them.
  std::vector<uint32_t> out(n + 1, 0);  // dependents per local flow, then offsets
  for (size_t i = 0; i < n; ++i) {
    if (absl::Status s = flow_of(i, &flows[i]); !s.ok()) return fail(std::move(s));
    const auto& deps = deps_of(i);
    ndeps[i] = static_cast<uint32_t>(deps.size());
    for (uint32_t u : deps) {
      if (u >= i) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("transfer ", i, " depends on ", u, ", not an earlier transfer")));
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
  g->next_begin.resize(base + n + 1);
  for (size_t i = 0; i < n; ++i) g->next_begin[base + i + 1] = edge_base + out[i + 1];
  uint32_t* next = g->next.data() + edge_base;
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t u : deps_of(i)) next[out[u]++] = static_cast<uint32_t>(base + i);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FlowGraph::AddSchedule(const RankSchedule& schedule, const std::vector<int32_t>& frank,
                                    uint32_t job) {
  const auto n = static_cast<int32_t>(frank.size());
  absl::flat_hash_map<uint64_t, uint16_t> stripes;  // per (src, dst) fabric rank
  return AppendJob(
      this, schedule.transfers.size(),
      [&](size_t i, Flow* f) {
        const Transfer& t = schedule.transfers[i];
        if (t.src.rank < 0 || t.src.rank >= n || t.dst.rank < 0 || t.dst.rank >= n) {
          return absl::InvalidArgumentError(absl::StrCat("transfer ", i, " names rank ", t.src.rank,
                                                         " -> ", t.dst.rank, " outside [0, ", n,
                                                         ")"));
        }
        *f = Flow{};
        f->bytes = t.bytes;
        f->src = frank[t.src.rank];
        f->dst = frank[t.dst.rank];
        f->job = job;
        // Counting intra-node flows too changes nothing: only inter-node ones take a rail.
        f->stripe = stripes[static_cast<uint64_t>(static_cast<uint32_t>(f->src)) << 32 |
                            static_cast<uint32_t>(f->dst)]++;
        return absl::OkStatus();
      },
      [&](size_t i) -> const Deps& { return schedule.transfers[i].deps; });
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
      this, flows.size(),
      [&](size_t i, Flow* f) {
        *f = flows[i];
        return absl::OkStatus();
      },
      [&](size_t i) {
        return Span{deps.data() + begin[i], deps.data() + begin[i + 1]};
      });
  if (!s.ok()) std::abort();
}

// ---------------------------------------------------------------------------------------------
// Engine

namespace {

// A pair's head message whose alpha ends (its bytes start), or an active flow's bytes finishing.
struct Event {
  uint32_t id;   // flow (start) or active slot (finish)
  uint32_t aux;  // start: kStartBit | pair; finish: the slot's version when pushed
};
constexpr uint32_t kStartBit = 0x80000000u;
constexpr uint32_t kVersionMask = 0x7fffffffu;

// Events this close after the earliest pending one (relative) happen with it: flows that share a
// link and finish together then leave it in one batch, and the link's other flows are repriced
// once instead of once per leaver. 1e-12 s per second of simulated time is far below the model's
// resolution.
constexpr double kSameTime = 1e-12;

// Pending events grouped by instant: a heap of distinct times, each with the events due then in
// the order they were pushed. Collectives move in waves (thousands of flows start and finish at
// the same instant), so this costs a heap operation per instant rather than per event.
class EventQueue {
 public:
  bool empty() const { return times_.empty(); }
  double next_time() const { return times_.top(); }

  void Push(double t, Event e) {
    // A wave pushes runs of events for the same instant: skip the lookup for those.
    if (last_ != kNoBucket && t == last_t_) {
      buckets_[last_].push_back(e);
      return;
    }
    const auto [it, fresh] = bucket_of_.try_emplace(t, 0);
    if (fresh) {
      if (free_.empty()) {
        it->second = static_cast<uint32_t>(buckets_.size());
        buckets_.emplace_back();
      } else {
        it->second = free_.back();
        free_.pop_back();
      }
      times_.push(t);
    }
    buckets_[it->second].push_back(e);
    last_ = it->second;
    last_t_ = t;
  }

  // Replaces *out with the events due at next_time() and drops that instant.
  void Pop(std::vector<Event>* out) {
    const auto it = bucket_of_.find(times_.top());
    times_.pop();
    out->clear();
    out->swap(buckets_[it->second]);  // the bucket keeps out's old capacity for reuse
    free_.push_back(it->second);
    if (last_ == it->second) last_ = kNoBucket;
    bucket_of_.erase(it);
  }

 private:
  std::priority_queue<double, std::vector<double>, std::greater<>> times_;
  absl::flat_hash_map<double, uint32_t> bucket_of_;
  std::vector<std::vector<Event>> buckets_;
  std::vector<uint32_t> free_;
  static constexpr uint32_t kNoBucket = std::numeric_limits<uint32_t>::max();
  uint32_t last_ = kNoBucket;  // the bucket of the latest push, due at last_t_
  double last_t_ = 0;
};

// Sorts ids ascending. Waves make thousands of flows ready at once; above a few hundred an LSD
// radix sort (11-bit digits, as many as the largest id needs) beats comparisons.
void SortIds(std::vector<uint32_t>* ids, std::vector<uint32_t>* tmp) {
  const size_t n = ids->size();
  if (n < 512) {
    std::sort(ids->begin(), ids->end());
    return;
  }
  constexpr int kBits = 11;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  const uint32_t max = *std::max_element(ids->begin(), ids->end());
  tmp->resize(n);
  uint32_t count[kMask + 1];
  for (int shift = 0; shift < 32 && (max >> shift) != 0; shift += kBits) {
    std::fill(std::begin(count), std::end(count), 0u);
    for (uint32_t id : *ids) ++count[(id >> shift) & kMask];
    uint32_t sum = 0;
    for (uint32_t& c : count) {
      const uint32_t k = c;
      c = sum;
      sum += k;
    }
    for (uint32_t id : *ids) (*tmp)[count[(id >> shift) & kMask]++] = id;
    ids->swap(*tmp);
  }
}

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
    Reprice(0);
    while (!events_.empty()) {
      // Everything due now happens first; the flows of the touched links are repriced after.
      const double now = events_.next_time();
      const double limit = now + now * kSameTime;
      while (!events_.empty() && events_.next_time() <= limit) {
        events_.Pop(&due_);
        for (const Event& e : due_) {
          if ((e.aux & kStartBit) != 0) {
            Send(e.aux & ~kStartBit, e.id, now, now);
          } else if (active_[e.id].flow != kNone && active_[e.id].version == e.aux) {
            Finish(e.id, now);
          }
        }
      }
      Drain(now);
      Reprice(now);
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
    bool dirty = false;  // membership changed since the last Reprice
  };
  struct Active {
    uint32_t flow = kNone;
    uint32_t pair = kNone;
    uint32_t version = 0;
    double remaining = 0;
    double rate = 0;
    double last = 0;
    std::vector<uint32_t> links;
    std::vector<uint32_t> pos;  // index in links[hop].members
  };
  // (src << 32 | dst, job). Jobs are separate communicators: their messages between the same
  // ranks do not queue behind each other (they only share the links).
  using PairKey = std::pair<uint64_t, uint32_t>;
  // A (source, destination) endpoint with messages in flight: its head is starting (alpha) or
  // moving bytes; the others wait in posting order (a list of waiting_ nodes).
  struct Pair {
    PairKey key;
    uint32_t first = kNone, last = kNone;
  };
  struct Waiting {
    uint32_t flow = 0;
    uint32_t next = kNone;
    double start = 0;  // posted + alpha: the earliest its bytes may move
  };

  // Messages of one job from src to dst on one rail go in order, one at a time (one connection
  // per rail, as the daemon's per-rail endpoints).
  PairKey KeyOf(const Flow& fl) const {
    const auto& f = m_.fabric();
    const bool inter = fl.src != kSwitch && fl.dst != kSwitch &&
                       fl.src / f.ranks_per_node != fl.dst / f.ranks_per_node;
    const uint32_t rail = inter ? static_cast<uint32_t>(m_.Rail(fl.src, fl.stripe)) : 0;
    return {(uint64_t{static_cast<uint32_t>(fl.src)} << 32) | static_cast<uint32_t>(fl.dst),
            fl.job << 8 | rail};
  }

  // Posts every ready flow at time t, in flow order (the order a rank issues its schedule;
  // zero-cost flows complete at once and may make more ready).
  void Drain(double t) {
    while (!ready_.empty()) {
      batch_.swap(ready_);
      if (!std::is_sorted(batch_.begin(), batch_.end())) SortIds(&batch_, &sort_tmp_);
      for (uint32_t id : batch_) Post(id, t);
      batch_.clear();
    }
  }

  // The sender pays its overhead (serialised per rank), the message its alpha from then on; it
  // joins its pair's queue behind the messages posted earlier to the same destination.
  void Post(uint32_t id, double t) {
    const auto& f = m_.fabric();
    const Flow& fl = g_.flows[id];
    if ((fl.flags & Flow::kJoin) != 0 || fl.src == fl.dst) {
      Complete(id, t);
      return;
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
    const PairKey key = KeyOf(fl);
    const auto [it, fresh] = pair_of_.try_emplace(key, kNone);
    if (fresh) {
      it->second = NewPair(key);
      Send(it->second, id, start, t);
      return;
    }
    // The sender's posts are in time order (its overhead is serialised), so appending keeps the
    // queue in posting order.
    Pair& p = pairs_[it->second];
    const uint32_t w = NewWaiting(id, start);
    if (p.last == kNone) {
      p.first = w;
    } else {
      waiting_[p.last].next = w;
    }
    p.last = w;
  }

  // Pair p's head is flow `id`, whose bytes may move from `start`: at t, it waits for its start
  // event, becomes active, or (no bytes) completes and hands the pair to the next message.
  void Send(uint32_t p, uint32_t id, double start, double t) {
    for (;;) {
      if (start > t) {
        events_.Push(start, {id, kStartBit | p});
        return;
      }
      if (StartBytes(id, p, t)) return;
      Complete(id, t);
      if (!NextWaiting(p, &id, &start)) return;
    }
  }

  // Pops pair p's next message; false (and the pair released) when none waits.
  bool NextWaiting(uint32_t p, uint32_t* id, double* start) {
    Pair& pr = pairs_[p];
    if (pr.first == kNone) {
      pair_of_.erase(pr.key);
      free_pairs_.push_back(p);
      return false;
    }
    const uint32_t w = pr.first;
    *id = waiting_[w].flow;
    *start = waiting_[w].start;
    pr.first = waiting_[w].next;
    if (pr.first == kNone) pr.last = kNone;
    waiting_[w].next = free_waiting_;
    free_waiting_ = w;
    return true;
  }

  uint32_t NewPair(const PairKey& key) {
    uint32_t p;
    if (!free_pairs_.empty()) {
      p = free_pairs_.back();
      free_pairs_.pop_back();
    } else {
      p = static_cast<uint32_t>(pairs_.size());
      pairs_.emplace_back();
    }
    pairs_[p] = Pair{key, kNone, kNone};
    return p;
  }

  uint32_t NewWaiting(uint32_t id, double start) {
    uint32_t w = free_waiting_;
    if (w != kNone) {
      free_waiting_ = waiting_[w].next;
    } else {
      w = static_cast<uint32_t>(waiting_.size());
      waiting_.emplace_back();
    }
    waiting_[w] = Waiting{id, kNone, start};
    return w;
  }

  // Puts flow id's bytes on its route at t (rated at the next Reprice); false if it has none.
  bool StartBytes(uint32_t id, uint32_t pair, double t) {
    const Flow& fl = g_.flows[id];
    route_.clear();
    bool inter = false;
    uint32_t tiers = 0;
    m_.Route(fl.src, fl.dst, &route_, &inter, &tiers, fl.stripe);
    auto& jt = res_->job_tiers[fl.job];
    for (int k = 0; k < kNumTiers; ++k) {
      if ((tiers & (1u << k)) != 0) {
        jt[k].bytes += fl.bytes;
        ++jt[k].messages;
      }
    }
    if (fl.bytes == 0 || route_.empty()) return false;
    uint32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slot = static_cast<uint32_t>(active_.size());
      active_.emplace_back();
      stamp_.push_back(0);
    }
    Active& a = active_[slot];
    a.flow = id;
    a.pair = pair;
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
      Touch(route_[h]);
    }
    return true;
  }

  void Finish(uint32_t slot, double t) {
    Active& a = active_[slot];
    const uint32_t id = a.flow, pair = a.pair;
    for (size_t h = 0; h < a.links.size(); ++h) {
      Link& l = links_[a.links[h]];
      const uint32_t p = a.pos[h];
      const auto last = l.members.back();
      l.members[p] = last;
      active_[last.first].pos[last.second] = p;
      l.members.pop_back();
      if (l.members.empty()) l.busy += t - l.since;
      Touch(a.links[h]);
    }
    a.flow = kNone;
    a.version = (a.version + 1) & kVersionMask;
    free_.push_back(slot);
    Complete(id, t);
    uint32_t next = 0;
    double start = 0;
    if (NextWaiting(pair, &next, &start)) Send(pair, next, start, t);
  }

  void Touch(uint32_t link) {
    Link& l = links_[link];
    if (l.dirty) return;
    l.dirty = true;
    dirty_.push_back(link);
  }

  // Recomputes the rate of every active flow on a link whose membership changed.
  void Reprice(double t) {
    ++epoch_;
    for (uint32_t lid : dirty_) {
      Link& l = links_[lid];
      l.dirty = false;
      for (const auto& [slot, hop] : l.members) {
        if (stamp_[slot] == epoch_) continue;
        stamp_[slot] = epoch_;
        Update(slot, t);
      }
    }
    dirty_.clear();
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
    a.version = (a.version + 1) & kVersionMask;
    events_.Push(t + a.remaining / rate, {slot, a.version});
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
  std::vector<uint32_t> dirty_;
  std::vector<Active> active_;
  std::vector<uint32_t> free_;
  std::vector<uint32_t> stamp_;  // per active slot: epoch_ when last repriced
  uint32_t epoch_ = 0;
  absl::flat_hash_map<PairKey, uint32_t> pair_of_;  // busy pairs only
  std::vector<Pair> pairs_;
  std::vector<uint32_t> free_pairs_;
  std::vector<Waiting> waiting_;
  uint32_t free_waiting_ = kNone;
  std::vector<uint32_t> ready_, batch_, sort_tmp_;
  std::vector<uint32_t> route_;
  std::vector<double> cpu_free_;
  size_t done_ = 0;
  EventQueue events_;
  std::vector<Event> due_;
};

}  // namespace

absl::Status RunEngine(const FabricModel& model, const FlowGraph& graph, int njobs,
                       EngineResult* result) {
  Engine e(model, graph, njobs, result);
  return e.Run();
}

}  // namespace railyard::scheduler::sim
