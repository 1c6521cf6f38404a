// Hierarchical, rail-aligned (PRIMER section 3). The data is cut into G shards; shard i is the
// business of the ranks with local index i, which talk across nodes only to each other, on rail
// i mod R. Intra-node phases are direct (memory); inter-node phases are rings/chains over the K
// ranks of one local index:
//   AllReduce:     intra reduce-to-owner of shard i -> inter ring AllReduce of shard i -> intra
//                  copy-to-all. Each rank sends 2 (K-1)/K * M/G bytes across nodes.
//   ReduceScatter: intra reduce of the K blocks owned by local index i -> inter ring RS.
//   AllGather:     inter ring AG among local index i -> intra copy-to-all.
//   Broadcast:     root copies to its node -> inter chain of shard i -> intra copy-to-all.
//   Reduce:        intra reduce-to-owner -> inter chain reduce of shard i to the root's node ->
//                  copy of the shards to the root.
//   AllToAll(v):   the blocks from node k to node m are gathered on local index (k+m) mod G of
//                  node k, sent as one message to the same local index of node m, and scattered
//                  there (K(K-1) inter-node flows instead of N(N-1)); intra-node blocks are a
//                  direct pairwise exchange.
//   Barrier:       dissemination over the nodes.
#include "daemon/scheduler/algorithms/hier.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/scheduler/algorithms/direct.h"
#include "daemon/scheduler/algorithms/rhd.h"
#include "daemon/scheduler/algorithms/ring.h"

namespace railyard::scheduler::algorithms {
namespace {

class Hier {
 public:
  explicit Hier(ScheduleBuilder& b)
      : b_(b), s_(b.shape()), l_(b.layout()), k_(l_.nnodes), g_(l_.ranks_per_node()) {}

  // Rank with local index i on node k.
  int R(int k, int i) const { return l_.ranks_of_node[k][i]; }

  // Inputs of node k at element `at` for the owner with local index i, starting with its own.
  std::vector<RankRef> LocalInputs(int k, int i, uint64_t at) const {
    std::vector<RankRef> inputs;
    inputs.reserve(g_);
    for (int j = 0; j < g_; ++j) inputs.push_back(b_.Send(R(k, (i + j) % g_), at));
    return inputs;
  }

  // Copies `src` (held by local index i of node k, at element `at` of recv) to the node's others.
  void LocalCopyToAll(int k, int i, uint64_t at, uint64_t elems) {
    std::vector<RankRef> outs;
    for (int j = 1; j < g_; ++j) outs.push_back(b_.Recv(R(k, (i + j) % g_), at));
    DirectBroadcast(b_, b_.Recv(R(k, i), at), outs, elems);
  }

  void AllReduce() {
    const std::vector<Block> shards = SplitEven(0, s_.count, g_);
    // Reserve the transfers: reduce-to-owner (G per shard and node), the two rings (K - 1 steps
    // over every piece of every shard), copy-to-all (G - 1 per shard and node) and its fences.
    uint64_t total = 0;
    for (int i = 0; i < g_; ++i) {
      const uint64_t shard = b_.Chunks(shards[i].elems);
      total += static_cast<uint64_t>(k_) * (static_cast<uint64_t>(2 * g_) * shard + 1);
      if (k_ > 1) {
        for (const Block& piece : SplitEven(shards[i].offset, shards[i].elems, k_)) {
          total += 2 * static_cast<uint64_t>(k_ - 1) * b_.Chunks(piece.elems);
        }
      }
    }
    b_.Reserve(total);
    for (int k = 0; k < k_; ++k) {
      for (int i = 0; i < g_; ++i) {
        const Block sh = shards[i];
        DirectReduce(b_, LocalInputs(k, i, sh.offset), b_.Recv(R(k, i), sh.offset), sh.elems,
                     /*finalize=*/k_ == 1);
      }
    }
    if (k_ > 1) {
      for (int i = 0; i < g_; ++i) {
        const std::vector<Block> sub = SplitEven(shards[i].offset, shards[i].elems, k_);
        const std::vector<uint64_t> lens = Lengths(sub);
        const auto at = [&](int p, int blk) { return b_.Recv(R(p, i), sub[blk].offset); };
        RingReduceScatter(b_, at, at, lens, /*finalize=*/true);
        RingAllGather(
            b_, [&](int p) { return at(p, p); }, at, lens);
      }
    }
    for (int k = 0; k < k_; ++k) {
      for (int i = 0; i < g_; ++i) LocalCopyToAll(k, i, shards[i].offset, shards[i].elems);
    }
  }

  void ReduceScatter() {
    const uint64_t c = s_.count;
    // Local index i of node k accumulates the node's partial of the block of R(m, i) for every
    // node m: into its recv for its own block, into scratch slot m for the others.
    const auto acc = [&](int k, int i, int m) {
      return m == k ? b_.Recv(R(k, i)) : b_.Scratch(R(k, i), m * c);
    };
    for (int k = 0; k < k_; ++k) {
      for (int i = 0; i < g_; ++i) {
        for (int m = 0; m < k_; ++m) {
          DirectReduce(b_, LocalInputs(k, i, R(m, i) * c), acc(k, i, m), c,
                       /*finalize=*/k_ == 1);
        }
      }
    }
    if (k_ > 1) {
      const std::vector<uint64_t> lens(k_, c);
      for (int i = 0; i < g_; ++i) {
        const auto at = [&](int p, int blk) { return acc(p, i, blk); };
        RingReduceScatter(b_, at, at, lens, /*finalize=*/true);
      }
    }
  }

  void AllGather() {
    const uint64_t c = s_.count;
    const std::vector<uint64_t> lens(k_, c);
    for (int i = 0; i < g_; ++i) {
      RingAllGather(
          b_, [&](int p) { return b_.Send(R(p, i)); },
          [&](int p, int blk) { return b_.Recv(R(p, i), R(blk, i) * c); }, lens);
    }
    for (int k = 0; k < k_; ++k) {
      for (int i = 0; i < g_; ++i) {
        for (int m = 0; m < k_; ++m) LocalCopyToAll(k, i, R(m, i) * c, c);
      }
    }
  }

  void Broadcast() {
    const int k0 = l_.node_of_rank[s_.root];
    const std::vector<Block> shards = SplitEven(0, s_.count, g_);
    std::vector<RankRef> outs;
    outs.reserve(g_);
    for (int j = 0; j < g_; ++j) outs.push_back(b_.Recv(R(k0, j)));
    DirectBroadcast(b_, b_.Send(s_.root), outs, s_.count);
    if (k_ == 1) return;
    for (int i = 0; i < g_; ++i) {
      const Block sh = shards[i];
      ChainBroadcast(b_, k_, sh.elems, b_.Recv(R(k0, i), sh.offset),
                     [&](int p) { return b_.Recv(R((k0 + p) % k_, i), sh.offset); });
    }
    for (int k = 0; k < k_; ++k) {
      if (k == k0) continue;
      for (int i = 0; i < g_; ++i) LocalCopyToAll(k, i, shards[i].offset, shards[i].elems);
    }
  }

  void Reduce() {
    const int k0 = l_.node_of_rank[s_.root];
    const std::vector<Block> shards = SplitEven(0, s_.count, g_);
    // Owner (k, i) accumulates shard i: in the root's recv for the root, else in scratch.
    const auto acc = [&](int k, int i) {
      return R(k, i) == s_.root ? b_.Recv(s_.root, shards[i].offset) : b_.Scratch(R(k, i));
    };
    for (int k = 0; k < k_; ++k) {
      for (int i = 0; i < g_; ++i) {
        DirectReduce(b_, LocalInputs(k, i, shards[i].offset), acc(k, i), shards[i].elems,
                     /*finalize=*/k_ == 1);
      }
    }
    if (k_ > 1) {
      for (int i = 0; i < g_; ++i) {
        // Chain over the nodes, ending at the root's node.
        const auto at = [&](int p) { return acc((k0 + 1 + p) % k_, i); };
        ChainReduce(b_, k_, shards[i].elems, at, at, /*finalize=*/true);
      }
    }
    for (int i = 0; i < g_; ++i) {
      b_.Copy(acc(k0, i), b_.Recv(s_.root, shards[i].offset), shards[i].elems);
    }
  }

  void AllToAll() {
    const int n = b_.nranks();
    std::vector<std::vector<int>> nodes(k_);
    uint64_t staging = 0;
    for (int k = 0; k < k_; ++k) {
      nodes[k] = l_.ranks_of_node[k];
      for (int y = 0; y < g_; ++y) {
        staging = std::max(staging, PairwiseStagingElems(s_, n, nodes[k], y));
      }
    }
    for (int k = 0; k < k_; ++k) PairwiseExchange(b_, nodes[k], 0);
    if (k_ == 1) return;
    // Node pair (k, m): aggregated on local index (k + m) % G on both sides; blocks ordered by
    // (source local index, destination local index).
    const auto total = [&](int k, int m) {
      uint64_t t = 0;
      for (int si = 0; si < g_; ++si) {
        for (int di = 0; di < g_; ++di) t += A2ACount(s_, n, R(k, si), R(m, di));
      }
      return t;
    };
    // Scratch: [pairwise staging][outgoing aggregates][incoming aggregates].
    std::vector<uint64_t> out_end(n, staging);
    std::vector<std::vector<uint64_t>> out_at(k_, std::vector<uint64_t>(k_));
    for (int k = 0; k < k_; ++k) {
      for (int m = 0; m < k_; ++m) {
        if (m == k) continue;
        const int agg = R(k, (k + m) % g_);
        out_at[k][m] = out_end[agg];
        out_end[agg] += total(k, m);
      }
    }
    const uint64_t in_base = *std::max_element(out_end.begin(), out_end.end());
    std::vector<uint64_t> in_end(n, in_base);
    std::vector<std::vector<uint64_t>> in_at(k_, std::vector<uint64_t>(k_));
    for (int k = 0; k < k_; ++k) {
      for (int m = 0; m < k_; ++m) {
        if (m == k) continue;
        const int agg = R(m, (k + m) % g_);
        in_at[k][m] = in_end[agg];
        in_end[agg] += total(k, m);
      }
    }
    // All gathers first: they read send blocks that the scatters' recv blocks alias in place.
    for (int k = 0; k < k_; ++k) {
      for (int m = 0; m < k_; ++m) {
        if (m == k) continue;
        const int agg = R(k, (k + m) % g_);
        uint64_t pos = out_at[k][m];
        for (int si = 0; si < g_; ++si) {
          for (int di = 0; di < g_; ++di) {
            const int src = R(k, si), dst = R(m, di);
            const uint64_t cnt = A2ACount(s_, n, src, dst);
            b_.Copy(b_.Send(src, A2ASendDispl(s_, n, src, dst)), b_.Scratch(agg, pos), cnt);
            pos += cnt;
          }
        }
      }
    }
    for (int k = 0; k < k_; ++k) {
      for (int m = 0; m < k_; ++m) {
        if (m == k) continue;
        const int li = (k + m) % g_;
        b_.Copy(b_.Scratch(R(k, li), out_at[k][m]), b_.Scratch(R(m, li), in_at[k][m]), total(k, m));
      }
    }
    for (int k = 0; k < k_; ++k) {
      for (int m = 0; m < k_; ++m) {
        if (m == k) continue;
        const int agg = R(m, (k + m) % g_);
        uint64_t pos = in_at[k][m];
        for (int si = 0; si < g_; ++si) {
          for (int di = 0; di < g_; ++di) {
            const int src = R(k, si), dst = R(m, di);
            const uint64_t cnt = A2ACount(s_, n, src, dst);
            b_.Copy(b_.Scratch(agg, pos), b_.Recv(dst, A2ARecvDispl(s_, n, dst, src)), cnt);
            pos += cnt;
          }
        }
      }
    }
  }

 private:
  ScheduleBuilder& b_;
  const OpShape& s_;
  const CommLayout& l_;
  const int k_;
  const int g_;
};

}  // namespace

absl::Status GenerateHier(ScheduleBuilder& b) {
  const CommLayout& l = b.layout();
  if (l.ranks_per_node() == 0) {
    std::vector<size_t> sizes;
    for (const auto& ranks : l.ranks_of_node) sizes.push_back(ranks.size());
    return absl::InvalidArgumentError(
        absl::StrCat("hier needs the same number of ranks on every node (ranks per node: ",
                     absl::StrJoin(sizes, ", "), ")"));
  }
  Hier h(b);
  switch (b.shape().op) {
    case OpKind::kAllReduce:
      h.AllReduce();
      break;
    case OpKind::kReduceScatter:
      h.ReduceScatter();
      break;
    case OpKind::kAllGather:
      h.AllGather();
      break;
    case OpKind::kBroadcast:
      h.Broadcast();
      break;
    case OpKind::kReduce:
      h.Reduce();
      break;
    case OpKind::kAllToAll:
    case OpKind::kAllToAllv:
      h.AllToAll();
      break;
    case OpKind::kBarrier:
      DisseminationBarrier(b);
      break;
    default:
      return absl::InvalidArgumentError("hier does not implement this op");
  }
  return absl::OkStatus();
}

}  // namespace railyard::scheduler::algorithms
