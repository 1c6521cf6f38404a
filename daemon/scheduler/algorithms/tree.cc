// Tree: AllReduce over two complementary binary trees, each reducing then broadcasting half of
// the data, chunked so that a chunk goes up (and then down) as soon as its children delivered
// it; every rank is interior in at most one tree, so each sends ~2M bytes in total. Broadcast and
// Reduce use one tree re-rooted at the op's root. Barrier: signals up and down a tree of nodes.
#include "daemon/scheduler/algorithms/tree.h"

#include <algorithm>
#include <utility>

namespace railyard::scheduler::algorithms {
namespace {

int HighestPowerOfTwoAtMost(int x) {
  int p = 1;
  while (p <= x / 2) p *= 2;
  return p;
}

std::vector<int> PostOrder(const Tree& t) {
  std::vector<int> order;
  std::vector<std::pair<int, size_t>> stack = {{t.root, 0}};
  while (!stack.empty()) {
    auto& [v, next] = stack.back();
    if (next < t.children[v].size()) {
      const int c = t.children[v][next++];
      stack.emplace_back(c, 0);
    } else {
      order.push_back(v);
      stack.pop_back();
    }
  }
  return order;
}

std::vector<int> PreOrder(const Tree& t) {
  std::vector<int> order;
  std::vector<int> stack = {t.root};
  while (!stack.empty()) {
    const int v = stack.back();
    stack.pop_back();
    order.push_back(v);
    for (auto it = t.children[v].rbegin(); it != t.children[v].rend(); ++it) stack.push_back(*it);
  }
  return order;
}

void TreeBarrier(ScheduleBuilder& b) {
  const CommLayout& l = b.layout();
  const int k = l.nnodes;
  if (k <= 1) return;
  const Tree t = InOrderTree(k);
  const auto leader = [&](int pos) { return l.ranks_of_node[pos][0]; };
  std::vector<uint32_t> up(k), down(k);
  for (int v : PostOrder(t)) {
    if (v == t.root) continue;
    std::vector<uint32_t> deps;
    for (int c : t.children[v]) deps.push_back(up[c]);
    up[v] = b.Signal(leader(v), leader(t.parent[v]), deps);
  }
  for (int v : PreOrder(t)) {
    std::vector<uint32_t> deps;
    if (v == t.root) {
      for (int c : t.children[v]) deps.push_back(up[c]);
    } else {
      deps.push_back(down[v]);
    }
    for (int c : t.children[v]) down[c] = b.Signal(leader(v), leader(c), deps);
  }
}

}  // namespace

Tree InOrderTree(int n) {
  Tree t;
  t.parent.assign(n, -1);
  t.children.assign(n, {});
  // 1-based positions x in [1, n].
  for (int x = 1; x <= n; ++x) {
    const int bit = x & -x;
    if (bit < 2) continue;
    const int left = x - bit / 2;
    t.children[x - 1].push_back(left - 1);
    t.parent[left - 1] = x - 1;
    if (x < n) {
      const int right = x + HighestPowerOfTwoAtMost(std::min(bit - 1, n - x));
      t.children[x - 1].push_back(right - 1);
      t.parent[right - 1] = x - 1;
    }
  }
  t.root = n >= 1 ? HighestPowerOfTwoAtMost(n) - 1 : 0;
  return t;
}

int SecondTreeRankAt(int pos, int n) { return n % 2 == 0 ? n - 1 - pos : (pos - 1 + n) % n; }

void TreeReduce(ScheduleBuilder& b, const Tree& t, uint64_t elems, const MemberRefFn& in,
                const MemberRefFn& acc, bool finalize) {
  for (int v : PostOrder(t)) {
    const std::vector<int>& kids = t.children[v];
    if (kids.empty()) {
      if (v == t.root) b.Copy(in(v), acc(v), elems, finalize);
      continue;
    }
    b.Copy(in(v), acc(v), elems);
    for (size_t i = 0; i < kids.size(); ++i) {
      const int c = kids[i];
      b.Reduce(t.children[c].empty() ? in(c) : acc(c), acc(v), elems,
               finalize && v == t.root && i + 1 == kids.size());
    }
  }
}

void TreeBroadcast(ScheduleBuilder& b, const Tree& t, uint64_t elems, const RankRef& src,
                   const MemberRefFn& out) {
  b.Copy(src, out(t.root), elems);
  for (int v : PreOrder(t)) {
    for (int c : t.children[v]) b.Copy(v == t.root ? src : out(v), out(c), elems);
  }
}

absl::Status GenerateTree(ScheduleBuilder& b) {
  const OpShape& s = b.shape();
  const int n = b.nranks();
  const uint64_t c = s.count;
  const Tree t = InOrderTree(n);
  switch (s.op) {
    case OpKind::kAllReduce: {
      const std::vector<Block> halves = SplitEven(0, c, 2);
      const auto rank_at = [n](int tree, int pos) {
        return tree == 0 ? pos : SecondTreeRankAt(pos, n);
      };
      for (int tr = 0; tr < 2; ++tr) {
        const Block h = halves[tr];
        TreeReduce(
            b, t, h.elems, [&](int p) { return b.Send(rank_at(tr, p), h.offset); },
            [&](int p) { return b.Recv(rank_at(tr, p), h.offset); }, /*finalize=*/true);
      }
      for (int tr = 0; tr < 2; ++tr) {
        const Block h = halves[tr];
        TreeBroadcast(b, t, h.elems, b.Recv(rank_at(tr, t.root), h.offset),
                      [&](int p) { return b.Recv(rank_at(tr, p), h.offset); });
      }
      return absl::OkStatus();
    }
    case OpKind::kBroadcast: {
      const auto rank = [&](int pos) { return (pos - t.root + s.root + n) % n; };
      TreeBroadcast(b, t, c, b.Send(s.root), [&](int p) { return b.Recv(rank(p)); });
      return absl::OkStatus();
    }
    case OpKind::kReduce: {
      const auto rank = [&](int pos) { return (pos - t.root + s.root + n) % n; };
      TreeReduce(
          b, t, c, [&](int p) { return b.Send(rank(p)); },
          [&](int p) { return rank(p) == s.root ? b.Recv(s.root) : b.Scratch(rank(p)); },
          /*finalize=*/true);
      return absl::OkStatus();
    }
    case OpKind::kBarrier:
      TreeBarrier(b);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError("tree does not implement this op");
  }
}

}  // namespace railyard::scheduler::algorithms
