#include "daemon/scheduler/symbolic_executor.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/kernels/reduce.h"
#include "daemon/scheduler/compressed.h"
#include "daemon/scheduler/op.h"

namespace railyard::scheduler {

SimMemory SimMemory::ForOp(const OpShape& shape, int nranks, bool in_place, std::byte fill) {
  SimMemory mem;
  mem.ranks.resize(nranks);
  const uint64_t esize = kernels::ElementSize(shape.dtype);
  const size_t n = static_cast<size_t>(nranks);
  for (int r = 0; r < nranks; ++r) {
    RankRequest req;
    req.op = shape.op;
    req.dtype = shape.dtype;
    req.red_op = shape.red_op;
    req.count = shape.count;
    req.root = shape.root;
    if (shape.op == OpKind::kAllToAllv) {
      for (int j = 0; j < nranks; ++j) {
        req.send_counts.push_back(shape.a2av_counts[r * n + j]);
        req.send_displs.push_back(shape.a2av_send_displs[r * n + j]);
        req.recv_counts.push_back(shape.a2av_counts[j * n + r]);
        req.recv_displs.push_back(shape.a2av_recv_displs[r * n + j]);
      }
    }
    Extents e;
    if (auto got = ComputeExtents(req, r, nranks); got.ok()) e = *got;
    SimRankMemory& m = mem.ranks[r];
    m.send_bytes = e.needs_send ? e.send_bytes : 0;
    m.recv_bytes = e.needs_recv ? e.recv_bytes : 0;
    uint64_t size = m.send_bytes + m.recv_bytes;
    if (!in_place) {
      m.recv_offset = m.send_bytes;
    } else if (shape.op == OpKind::kReduceScatter) {
      m.recv_offset = shape.count * esize * r;
      size = m.send_bytes;
    } else if (shape.op == OpKind::kAllGather) {
      m.send_offset = shape.count * esize * r;
      size = m.recv_bytes;
    } else {
      size = std::max(m.send_bytes, m.recv_bytes);
    }
    m.user.assign(size, fill);
  }
  return mem;
}

namespace {

struct Access {
  uint32_t buffer;  // rank * 2 (+1 for scratch)
  uint64_t lo, hi;
  uint32_t step;  // global step id
  bool write;
};

struct Region {
  std::byte* ptr = nullptr;
  uint32_t buffer = 0;
  uint64_t offset = 0;
};

using MsgKey = std::tuple<int, int, uint64_t>;  // sender node, receiver node, tag

struct Message {
  std::vector<std::byte> data;
  int rail = 0;
  uint32_t send_step = 0;
};

const char* KindName(NodeStep::Kind k) {
  switch (k) {
    case NodeStep::Kind::kCopy:
      return "copy";
    case NodeStep::Kind::kReduce:
      return "reduce";
    case NodeStep::Kind::kCombine:
      return "combine";
    case NodeStep::Kind::kSend:
      return "send";
    case NodeStep::Kind::kRecv:
      return "recv";
    case NodeStep::Kind::kEncode:
      return "encode";
    case NodeStep::Kind::kDecode:
      return "decode";
    case NodeStep::Kind::kDecodeAdd:
      return "decode-add";
    case NodeStep::Kind::kWiden:
      return "widen";
    case NodeStep::Kind::kWidenAdd:
      return "widen-add";
    case NodeStep::Kind::kNarrow:
      return "narrow";
  }
  return "?";
}

const char* SpaceName(RankRef::Space s) {
  switch (s) {
    case RankRef::Space::kSend:
      return "send";
    case RankRef::Space::kRecv:
      return "recv";
    case RankRef::Space::kScratch:
      return "scratch";
  }
  return "?";
}

class Run {
 public:
  Run(const std::vector<NodeSchedule>& nodes, const CommLayout& layout, const OpShape& shape,
      SimMemory* memory, const SimOptions& options)
      : nodes_(nodes), layout_(layout), shape_(shape), mem_(*memory), options_(options) {}

  absl::StatusOr<SimStats> Go() {
    if (auto s = Setup(); !s.ok()) return s;
    for (uint32_t g = 0; g < total_; ++g) {
      if (pending_[g] == 0) ready_.push_back(g);
    }
    while (!ready_.empty()) {
      const uint32_t g = ready_.front();
      ready_.pop_front();
      if (auto s = Start(g); !s.ok()) return s;
    }
    if (done_ < total_) return Deadlock();
    if (!mailbox_.empty()) {
      const auto& [key, msg] = *mailbox_.begin();
      return absl::InternalError(
          absl::StrCat("send without a matching recv: ", Describe(msg.send_step), ", ",
                       mailbox_.size(), " such message(s)"));
    }
    stats_.steps = total_;
    Reach();
    if (options_.check_races && total_ <= options_.max_race_steps) {
      if (auto s = CheckRaces(); !s.ok()) return s;
      stats_.races_checked = true;
    }
    return std::move(stats_);
  }

 private:
  const NodeStep& StepOf(uint32_t g) const {
    return nodes_[node_of_step_[g]].steps[g - base_[node_of_step_[g]]];
  }

  std::string Describe(uint32_t g) const {
    const int node = node_of_step_[g];
    const NodeStep& s = StepOf(g);
    std::string d = absl::StrCat("node ", node, " step ", g - base_[node], " (", KindName(s.kind),
                                 " ", s.bytes, " bytes");
    if (s.kind == NodeStep::Kind::kSend || s.kind == NodeStep::Kind::kRecv) {
      absl::StrAppend(&d, ", peer ", s.peer, " rail ", s.rail, " tag ", s.tag);
    }
    return d + ")";
  }

  absl::Status Setup() {
    const int k = layout_.nnodes;
    if (static_cast<int>(nodes_.size()) != k) {
      return absl::InternalError(absl::StrCat(nodes_.size(), " node schedules for ", k, " nodes"));
    }
    if (static_cast<int>(mem_.ranks.size()) != layout_.nranks) {
      return absl::InternalError("memory does not have one entry per rank");
    }
    esize_ = kernels::ElementSize(shape_.dtype);
    for (int r = 0; r < layout_.nranks; ++r) {
      const uint64_t bytes = nodes_[layout_.node_of_rank[r]].scratch_bytes_per_rank;
      mem_.ranks[r].scratch.assign(bytes, std::byte{0xC7});
    }
    base_.resize(k + 1);
    total_ = 0;
    for (int i = 0; i < k; ++i) {
      if (nodes_[i].node != i) {
        return absl::InternalError(absl::StrCat("schedule ", i, " is for node ", nodes_[i].node));
      }
      base_[i] = total_;
      total_ += static_cast<uint32_t>(nodes_[i].steps.size());
    }
    base_[k] = total_;
    node_of_step_.resize(total_);
    pending_.assign(total_, 0);
    dependents_.assign(total_, {});
    preds_.assign(total_, {});
    for (int i = 0; i < k; ++i) {
      const auto& steps = nodes_[i].steps;
      for (uint32_t j = 0; j < steps.size(); ++j) {
        const uint32_t g = base_[i] + j;
        node_of_step_[g] = i;
        const NodeStep& s = steps[j];
        if ((s.kind == NodeStep::Kind::kSend || s.kind == NodeStep::Kind::kRecv) &&
            (s.peer < 0 || s.peer >= k || s.peer == i)) {
          return absl::InternalError(absl::StrCat("bad peer in ", Describe(g)));
        }
        if ((s.kind == NodeStep::Kind::kCopy || s.kind == NodeStep::Kind::kReduce ||
             s.kind == NodeStep::Kind::kCombine) &&
            s.bytes % esize_ != 0) {
          return absl::InternalError(
              absl::StrCat(Describe(g), " is not a whole number of elements"));
        }
        for (uint32_t d : s.deps) {
          if (d >= steps.size() || d == j) {
            return absl::InternalError(absl::StrCat("bad dep ", d, " in ", Describe(g)));
          }
          ++pending_[g];
          dependents_[base_[i] + d].push_back(g);
          preds_[g].push_back(base_[i] + d);
        }
      }
    }
    order_.assign(total_, 0);
    stats_.rank_bytes_sent.assign(layout_.nranks, 0);
    stats_.rank_net_bytes_sent.assign(layout_.nranks, 0);
    stats_.rank_net_bytes_received.assign(layout_.nranks, 0);
    return absl::OkStatus();
  }

  absl::StatusOr<Region> Resolve(uint32_t g, const RankRef& ref, uint64_t bytes, bool write) {
    const int node = node_of_step_[g];
    if (ref.rank < 0 || ref.rank >= layout_.nranks || layout_.node_of_rank[ref.rank] != node) {
      return absl::InternalError(
          absl::StrCat(Describe(g), " touches rank ", ref.rank, ", not one of its node"));
    }
    SimRankMemory& m = mem_.ranks[ref.rank];
    uint64_t size = 0, at = 0;
    Region region;
    region.buffer = static_cast<uint32_t>(ref.rank) * 2;
    std::byte* base = m.user.data();
    switch (ref.space) {
      case RankRef::Space::kSend:
        size = m.send_bytes;
        at = m.send_offset;
        break;
      case RankRef::Space::kRecv:
        size = m.recv_bytes;
        at = m.recv_offset;
        break;
      case RankRef::Space::kScratch:
        size = m.scratch.size();
        base = m.scratch.data();
        region.buffer += 1;
        break;
    }
    if (ref.offset > size || bytes > size - ref.offset) {
      return absl::InternalError(absl::StrCat(Describe(g), " accesses rank ", ref.rank, "'s ",
                                              SpaceName(ref.space), " [", ref.offset, ", +", bytes,
                                              ") outside its ", size, " bytes"));
    }
    region.offset = at + ref.offset;
    region.ptr = base + region.offset;
    if (bytes > 0 && options_.check_races) {
      accesses_.push_back({region.buffer, region.offset, region.offset + bytes, g, write});
    }
    return region;
  }

  absl::Status Start(uint32_t g) {
    const NodeStep& s = StepOf(g);
    const int node = node_of_step_[g];
    switch (s.kind) {
      case NodeStep::Kind::kCopy:
      case NodeStep::Kind::kReduce:
      case NodeStep::Kind::kCombine: {
        const bool combine = s.kind == NodeStep::Kind::kCombine;
        auto src = Resolve(g, s.src, s.bytes, false);
        if (!src.ok()) return src.status();
        auto dst = Resolve(g, s.dst, s.bytes, true);
        if (!dst.ok()) return dst.status();
        // kCombine's left operand; for the others dst is.
        absl::StatusOr<Region> left = dst;
        if (combine) left = Resolve(g, s.src2, s.bytes, false);
        if (!left.ok()) return left.status();
        for (const Region* r : {&*src, &*left}) {
          if (r->buffer == dst->buffer && r->offset != dst->offset && s.bytes > 0 &&
              r->offset < dst->offset + s.bytes && dst->offset < r->offset + s.bytes) {
            return absl::InternalError(absl::StrCat(Describe(g), " partially overlaps its source"));
          }
        }
        const size_t count = s.bytes / esize_;
        const bool avg = shape_.red_op == kernels::RedOp::kAvg;
        const auto divisor = static_cast<uint32_t>(layout_.nranks);
        if (s.kind == NodeStep::Kind::kCopy) {
          if (s.finalize && avg) {
            const void* srcs[] = {src->ptr};
            kernels::Reduce(shape_.dtype, kernels::RedOp::kAvg, dst->ptr, srcs, 1, count, divisor);
          } else if (src->ptr != dst->ptr) {
            std::memmove(dst->ptr, src->ptr, s.bytes);
          }
        } else if (count > 0) {
          const void* srcs[] = {left->ptr, src->ptr};
          const kernels::RedOp op = avg && !s.finalize ? kernels::RedOp::kSum : shape_.red_op;
          kernels::Reduce(shape_.dtype, op, dst->ptr, srcs, 2, count, divisor);
        }
        stats_.local_bytes += s.bytes;
        if (s.src.rank != s.dst.rank) stats_.rank_bytes_sent[s.src.rank] += s.bytes;
        if (combine && s.src2.rank != s.dst.rank) stats_.rank_bytes_sent[s.src2.rank] += s.bytes;
        Finish(g);
        return absl::OkStatus();
      }
      case NodeStep::Kind::kEncode:
      case NodeStep::Kind::kDecode:
      case NodeStep::Kind::kDecodeAdd: {
        const size_t n = s.bytes / sizeof(float);
        const uint64_t wire = kernels::EncodedBytes(options_.codec, n);
        const bool encode = s.kind == NodeStep::Kind::kEncode;
        auto src = Resolve(g, s.src, encode ? s.bytes : wire, false);
        if (!src.ok()) return src.status();
        auto dst = Resolve(g, s.dst, encode ? wire : s.bytes, true);
        if (!dst.ok()) return dst.status();
        float* residual = nullptr;
        if (encode && options_.residuals != nullptr) {
          auto& all = *options_.residuals;
          if (all.size() < nodes_.size()) all.resize(nodes_.size());
          std::vector<float>& e = all[node];
          if (e.size() != nodes_[node].residual_elems) e.assign(nodes_[node].residual_elems, 0.f);
          if (s.aux > e.size() || n > e.size() - s.aux) {
            return absl::InternalError(absl::StrCat(Describe(g), " has residual offset ", s.aux,
                                                    " past the schedule's ", e.size()));
          }
          residual = e.data() + s.aux;
        }
        if (absl::Status st = RunCodecStep(s.kind, options_.codec, src->ptr, dst->ptr, n, residual);
            !st.ok()) {
          return absl::InternalError(absl::StrCat(Describe(g), ": ", st.message()));
        }
        stats_.local_bytes += s.bytes;
        Finish(g);
        return absl::OkStatus();
      }
      case NodeStep::Kind::kWiden:
      case NodeStep::Kind::kWidenAdd:
      case NodeStep::Kind::kNarrow: {
        // bytes counts the float32 side; the data side holds bytes / 4 elements of the dtype.
        const size_t n = s.bytes / sizeof(float);
        const bool narrow = s.kind == NodeStep::Kind::kNarrow;
        auto src = Resolve(g, s.src, narrow ? s.bytes : n * esize_, false);
        if (!src.ok()) return src.status();
        auto dst = Resolve(g, s.dst, narrow ? n * esize_ : s.bytes, true);
        if (!dst.ok()) return dst.status();
        const bool divide = s.finalize && shape_.red_op == kernels::RedOp::kAvg;
        RunConvertStep(s.kind, shape_.dtype, src->ptr, dst->ptr, n,
                       divide ? static_cast<uint32_t>(layout_.nranks) : 1);
        stats_.local_bytes += s.bytes;
        Finish(g);
        return absl::OkStatus();
      }
      case NodeStep::Kind::kSend: {
        auto src = Resolve(g, s.src, s.bytes, false);
        if (!src.ok()) return src.status();
        const MsgKey key{node, s.peer, s.tag};
        if (!sent_.insert(key).second) {
          return absl::InternalError(absl::StrCat("duplicate tag: ", Describe(g)));
        }
        Message msg;
        msg.data.assign(src->ptr, src->ptr + s.bytes);
        msg.rail = s.rail;
        msg.send_step = g;
        LinkStats& link = stats_.links[LinkKey{node, s.peer, s.rail}];
        link.bytes += s.bytes;
        link.messages += 1;
        stats_.rank_bytes_sent[s.src.rank] += s.bytes;
        stats_.rank_net_bytes_sent[s.src.rank] += s.bytes;
        mailbox_.emplace(key, std::move(msg));
        Finish(g);
        if (auto it = waiting_.find(key); it != waiting_.end()) {
          const uint32_t r = it->second;
          waiting_.erase(it);
          return Deliver(r);
        }
        return absl::OkStatus();
      }
      case NodeStep::Kind::kRecv: {
        const MsgKey key{s.peer, node, s.tag};
        if (mailbox_.count(key) != 0) return Deliver(g);
        if (!waiting_.emplace(key, g).second) {
          return absl::InternalError(absl::StrCat("two recvs with one tag: ", Describe(g)));
        }
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  }

  absl::Status Deliver(uint32_t g) {
    const NodeStep& s = StepOf(g);
    const int node = node_of_step_[g];
    auto it = mailbox_.find(MsgKey{s.peer, node, s.tag});
    Message msg = std::move(it->second);
    mailbox_.erase(it);
    if (msg.data.size() != s.bytes || msg.rail != s.rail) {
      return absl::InternalError(
          absl::StrCat(Describe(g), " matched ", Describe(msg.send_step), ": size or rail differ"));
    }
    auto dst = Resolve(g, s.dst, s.bytes, true);
    if (!dst.ok()) return dst.status();
    if (s.bytes > 0) std::memcpy(dst->ptr, msg.data.data(), s.bytes);
    preds_[g].push_back(msg.send_step);
    stats_.rank_net_bytes_received[s.dst.rank] += s.bytes;
    if (!layout_.rail_serves(s.dst.rank, s.rail)) stats_.cross_rail_bytes += s.bytes;
    Finish(g);
    return absl::OkStatus();
  }

  void Finish(uint32_t g) {
    order_[g] = done_++;
    for (uint32_t d : dependents_[g]) {
      if (--pending_[d] == 0) ready_.push_back(d);
    }
  }

  absl::Status Deadlock() const {
    std::string what;
    int shown = 0;
    uint32_t stuck = 0;
    for (uint32_t g = 0; g < total_; ++g) {
      const bool waiting_msg = std::any_of(waiting_.begin(), waiting_.end(),
                                           [g](const auto& kv) { return kv.second == g; });
      if (pending_[g] == 0 && !waiting_msg) continue;
      ++stuck;
      if (shown < 4) {
        absl::StrAppend(&what, shown ? "; " : "", Describe(g),
                        waiting_msg ? " waits for its message"
                                    : absl::StrCat(" waits for ", pending_[g], " dep(s)"));
        ++shown;
      }
    }
    return absl::InternalError(absl::StrCat("deadlock: ", total_ - done_, " of ", total_,
                                            " steps can never run (", stuck, " blocked): ", what));
  }

  // reached[a][b] from per-step node sets propagated in execution order.
  void Reach() {
    const int k = layout_.nnodes;
    const size_t words = (static_cast<size_t>(k) + 63) / 64;
    std::vector<uint32_t> by_order(total_);
    for (uint32_t g = 0; g < total_; ++g) by_order[order_[g]] = g;
    std::vector<uint64_t> set(static_cast<size_t>(total_) * words, 0);
    stats_.reached.assign(k, std::vector<bool>(k, false));
    std::vector<std::vector<uint64_t>> node_set(k, std::vector<uint64_t>(words, 0));
    for (uint32_t o = 0; o < total_; ++o) {
      const uint32_t g = by_order[o];
      uint64_t* row = &set[static_cast<size_t>(g) * words];
      const int node = node_of_step_[g];
      row[node / 64] |= uint64_t{1} << (node % 64);
      for (uint32_t p : preds_[g]) {
        const uint64_t* prow = &set[static_cast<size_t>(p) * words];
        for (size_t w = 0; w < words; ++w) row[w] |= prow[w];
      }
      for (size_t w = 0; w < words; ++w) node_set[node][w] |= row[w];
    }
    for (int a = 0; a < k; ++a) {
      for (int b = 0; b < k; ++b) {
        stats_.reached[a][b] = a == b || ((node_set[a][b / 64] >> (b % 64)) & 1) != 0;
      }
    }
  }

  absl::Status CheckRaces() {
    // before[o] has bit q set when the step executed q-th happens before the one executed o-th.
    const size_t words = (static_cast<size_t>(total_) + 63) / 64;
    std::vector<uint64_t> before(static_cast<size_t>(total_) * words, 0);
    std::vector<uint32_t> by_order(total_);
    for (uint32_t g = 0; g < total_; ++g) by_order[order_[g]] = g;
    for (uint32_t o = 0; o < total_; ++o) {
      uint64_t* row = &before[static_cast<size_t>(o) * words];
      for (uint32_t p : preds_[by_order[o]]) {
        const uint32_t q = order_[p];
        const uint64_t* prow = &before[static_cast<size_t>(q) * words];
        for (size_t w = 0; w <= q / 64; ++w) row[w] |= prow[w];
        row[q / 64] |= uint64_t{1} << (q % 64);
      }
    }
    const auto happens_before = [&](uint32_t x, uint32_t y) {
      const uint32_t qx = order_[x], qy = order_[y];
      return ((before[static_cast<size_t>(qy) * words + qx / 64] >> (qx % 64)) & 1) != 0;
    };
    std::sort(accesses_.begin(), accesses_.end(), [](const Access& a, const Access& b) {
      return std::tie(a.buffer, a.lo) < std::tie(b.buffer, b.lo);
    });
    std::vector<const Access*> active;
    for (size_t i = 0; i < accesses_.size(); ++i) {
      const Access& a = accesses_[i];
      if (i > 0 && accesses_[i - 1].buffer != a.buffer) active.clear();
      active.erase(std::remove_if(active.begin(), active.end(),
                                  [&](const Access* b) { return b->hi <= a.lo; }),
                   active.end());
      for (const Access* b : active) {
        if (!a.write && !b->write) continue;
        if (a.step == b->step) continue;
        if (happens_before(a.step, b->step) || happens_before(b->step, a.step)) continue;
        const uint32_t rank = a.buffer / 2;
        return absl::InternalError(
            absl::StrCat("race on rank ", rank, (a.buffer % 2) ? " scratch" : " user memory",
                         " bytes [", std::max(a.lo, b->lo), ", ", std::min(a.hi, b->hi),
                         ") between ", Describe(a.step), " and ", Describe(b->step)));
      }
      active.push_back(&a);
    }
    return absl::OkStatus();
  }

  const std::vector<NodeSchedule>& nodes_;
  const CommLayout& layout_;
  const OpShape& shape_;
  SimMemory& mem_;
  const SimOptions& options_;
  size_t esize_ = 1;
  std::vector<uint32_t> base_;
  uint32_t total_ = 0;
  uint32_t done_ = 0;
  std::vector<int> node_of_step_;
  std::vector<uint32_t> pending_;
  std::vector<std::vector<uint32_t>> dependents_;
  std::vector<std::vector<uint32_t>> preds_;  // deps plus the matching send of a recv
  std::vector<uint32_t> order_;               // execution order of each step
  std::deque<uint32_t> ready_;
  std::map<MsgKey, Message> mailbox_;
  std::map<MsgKey, uint32_t> waiting_;
  std::set<MsgKey> sent_;
  std::vector<Access> accesses_;
  SimStats stats_;
};

}  // namespace

absl::StatusOr<SimStats> RunSymbolic(const std::vector<NodeSchedule>& nodes,
                                     const CommLayout& layout, const OpShape& shape,
                                     SimMemory* memory, const SimOptions& options) {
  Run run(nodes, layout, shape, memory, options);
  return run.Go();
}

absl::StatusOr<SimStats> RunSymbolic(const RankSchedule& schedule, const CommLayout& layout,
                                     const OpShape& shape, SimMemory* memory,
                                     const SimOptions& options) {
  if (auto s = CheckRankSchedule(schedule, layout); !s.ok()) return s;
  std::vector<NodeSchedule> nodes;
  nodes.reserve(layout.nnodes);
  for (int k = 0; k < layout.nnodes; ++k) nodes.push_back(Project(schedule, layout, shape, k));
  return RunSymbolic(nodes, layout, shape, memory, options);
}

absl::Status CheckRankSchedule(const RankSchedule& schedule, const CommLayout& layout) {
  const auto& ts = schedule.transfers;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Transfer& t = ts[i];
    if (t.src.rank < 0 || t.src.rank >= layout.nranks || t.dst.rank < 0 ||
        t.dst.rank >= layout.nranks) {
      return absl::InternalError(absl::StrCat("transfer ", i, " names a rank out of range"));
    }
    const int a = layout.node_of_rank[t.src.rank], b = layout.node_of_rank[t.dst.rank];
    for (uint32_t u : t.deps) {
      if (u >= i) {
        return absl::InternalError(absl::StrCat("transfer ", i, " depends on later transfer ", u));
      }
      const int c = layout.node_of_rank[ts[u].src.rank], d = layout.node_of_rank[ts[u].dst.rank];
      if (c != a && c != b && d != a && d != b) {
        return absl::InternalError(absl::StrCat("transfer ", i, " (node ", a, " -> ", b,
                                                ") depends on transfer ", u, " (node ", c, " -> ",
                                                d, "), which neither of its nodes sees"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace railyard::scheduler
