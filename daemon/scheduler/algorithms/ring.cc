// Ring: AllReduce = ReduceScatter + AllGather over ranks 0 -> 1 -> ... -> n-1 -> 0, every block
// chunked so that chunk j of a block moves on as soon as chunk j arrived (the builder derives the
// per-chunk dependencies). Broadcast/Reduce are the pipelined chain from/to the root; Barrier is a
// token that goes round the node leaders twice.
#include "daemon/scheduler/algorithms/ring.h"

namespace railyard::scheduler::algorithms {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

// One lap of a token collects every node's arrival at node 0, the second lap announces it.
void RingBarrier(ScheduleBuilder& b) {
  const CommLayout& l = b.layout();
  const int k = l.nnodes;
  if (k <= 1) return;
  const auto leader = [&](int node) { return l.ranks_of_node[node][0]; };
  std::vector<uint32_t> last;
  for (int i = 0; i < k; ++i) last = {b.Signal(leader(i), leader((i + 1) % k), last)};
  for (int i = 0; i + 2 < k; ++i) last = {b.Signal(leader(i), leader(i + 1), last)};
}

}  // namespace

void RingReduceScatter(ScheduleBuilder& b, const BlockRefFn& in, const BlockRefFn& acc,
                       const std::vector<uint64_t>& lens, bool finalize) {
  const int n = static_cast<int>(lens.size());
  if (n == 1) {
    b.Copy(in(0, 0), acc(0, 0), lens[0], finalize);
    return;
  }
  // Step s: member p sends block p-1-s (its own contribution at s = 0, its partial after) to
  // p+1, which first takes its own contribution to that block into its accumulator.
  for (int s = 0; s + 1 < n; ++s) {
    for (int p = 0; p < n; ++p) {
      const int blk = Mod(p - 1 - s, n);
      const int q = (p + 1) % n;
      b.Copy(in(q, blk), acc(q, blk), lens[blk]);
      b.Reduce(s == 0 ? in(p, blk) : acc(p, blk), acc(q, blk), lens[blk], finalize && s + 2 == n);
    }
  }
}

void RingAllGather(ScheduleBuilder& b, const MemberRefFn& own, const BlockRefFn& out,
                   const std::vector<uint64_t>& lens) {
  const int n = static_cast<int>(lens.size());
  for (int p = 0; p < n; ++p) b.Copy(own(p), out(p, p), lens[p]);
  for (int s = 0; s + 1 < n; ++s) {
    for (int p = 0; p < n; ++p) {
      const int blk = Mod(p - s, n);
      b.Copy(s == 0 ? own(p) : out(p, blk), out((p + 1) % n, blk), lens[blk]);
    }
  }
}

void ChainBroadcast(ScheduleBuilder& b, int n, uint64_t elems, const RankRef& src,
                    const MemberRefFn& out) {
  b.Copy(src, out(0), elems);
  for (int p = 1; p < n; ++p) b.Copy(p == 1 ? src : out(p - 1), out(p), elems);
}

void ChainReduce(ScheduleBuilder& b, int n, uint64_t elems, const MemberRefFn& in,
                 const MemberRefFn& acc, bool finalize) {
  if (n == 1) {
    b.Copy(in(0), acc(0), elems, finalize);
    return;
  }
  for (int p = 1; p < n; ++p) {
    b.Copy(in(p), acc(p), elems);
    b.Reduce(p == 1 ? in(0) : acc(p - 1), acc(p), elems, finalize && p + 1 == n);
  }
}

absl::Status GenerateRing(ScheduleBuilder& b) {
  const OpShape& s = b.shape();
  const int n = b.nranks();
  const uint64_t c = s.count;
  switch (s.op) {
    case OpKind::kAllReduce: {
      const std::vector<Block> blocks = SplitEven(0, c, n);
      const std::vector<uint64_t> lens = Lengths(blocks);
      RingReduceScatter(
          b, [&](int p, int k) { return b.Send(p, blocks[k].offset); },
          [&](int p, int k) { return b.Recv(p, blocks[k].offset); }, lens, /*finalize=*/true);
      RingAllGather(
          b, [&](int p) { return b.Recv(p, blocks[p].offset); },
          [&](int p, int k) { return b.Recv(p, blocks[k].offset); }, lens);
      return absl::OkStatus();
    }
    case OpKind::kReduceScatter: {
      // Partials of other ranks' blocks live in scratch (recv only holds the rank's own block).
      const std::vector<uint64_t> lens(n, c);
      RingReduceScatter(
          b, [&](int p, int k) { return b.Send(p, k * c); },
          [&](int p, int k) { return k == p ? b.Recv(p) : b.Scratch(p, k * c); }, lens,
          /*finalize=*/true);
      return absl::OkStatus();
    }
    case OpKind::kAllGather: {
      const std::vector<uint64_t> lens(n, c);
      RingAllGather(
          b, [&](int p) { return b.Send(p); }, [&](int p, int k) { return b.Recv(p, k * c); },
          lens);
      return absl::OkStatus();
    }
    case OpKind::kBroadcast: {
      const auto rank = [&](int p) { return (s.root + p) % n; };
      ChainBroadcast(b, n, c, b.Send(s.root), [&](int p) { return b.Recv(rank(p)); });
      return absl::OkStatus();
    }
    case OpKind::kReduce: {
      // The chain ends at the root; partials of non-roots live in scratch (no recv there).
      const auto rank = [&](int p) { return (s.root + 1 + p) % n; };
      ChainReduce(
          b, n, c, [&](int p) { return b.Send(rank(p)); },
          [&](int p) { return rank(p) == s.root ? b.Recv(s.root) : b.Scratch(rank(p)); },
          /*finalize=*/true);
      return absl::OkStatus();
    }
    case OpKind::kBarrier:
      RingBarrier(b);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError("ring does not implement this op");
  }
}

}  // namespace railyard::scheduler::algorithms
