// Recursive halving-doubling (Rabenseifner): with p the largest power of two <= n and
// rem = n - p, ranks 2i (i < rem) first fold their whole input into rank 2i + 1 (neighbours, so
// usually on one node) and sit out. The p remaining ranks then halve: in round k a rank and its
// partner (index XOR 2^k: the big early rounds stay between close ranks) swap halves of their
// current range and each reduces the half it keeps; after log2(p) rounds every rank owns a
// fully reduced 1/p of the data. Doubling replays the rounds backwards, exchanging what each
// owns; finally the folded ranks get the result back. Each core rank sends 2 (p-1)/p M bytes,
// a folding pair additionally M each way.
#include "daemon/scheduler/algorithms/rhd.h"

#include <vector>

namespace railyard::scheduler::algorithms {

void DisseminationBarrier(ScheduleBuilder& b) {
  const CommLayout& l = b.layout();
  const int k = l.nnodes;
  if (k <= 1) return;
  // heard[i]: every signal node i received so far (a round's send follows all of them).
  std::vector<std::vector<uint32_t>> heard(k);
  for (int dist = 1; dist < k; dist *= 2) {
    std::vector<uint32_t> sent(k);
    for (int i = 0; i < k; ++i) {
      sent[i] = b.Signal(l.ranks_of_node[i][0], l.ranks_of_node[(i + dist) % k][0], heard[i]);
    }
    for (int i = 0; i < k; ++i) heard[(i + dist) % k].push_back(sent[i]);
  }
}

absl::Status GenerateRhd(ScheduleBuilder& b) {
  const OpShape& s = b.shape();
  if (s.op == OpKind::kBarrier) {
    DisseminationBarrier(b);
    return absl::OkStatus();
  }
  if (s.op != OpKind::kAllReduce) return absl::InvalidArgumentError("rhd implements allreduce");
  const int n = b.nranks();
  const uint64_t len = s.count;
  if (n == 1) {
    b.Copy(b.Send(0), b.Recv(0), len, /*finalize=*/true);
    return absl::OkStatus();
  }
  int p = 1, logp = 0;
  while (p * 2 <= n) {
    p *= 2;
    ++logp;
  }
  const int rem = n - p;
  std::vector<int> core;  // core index -> rank
  std::vector<bool> folded(n, false);
  for (int i = 0; i < rem; ++i) {
    b.Copy(b.Send(2 * i + 1), b.Recv(2 * i + 1), len);
    b.Reduce(b.Send(2 * i), b.Recv(2 * i + 1), len);
    folded[2 * i + 1] = true;
    core.push_back(2 * i + 1);
  }
  for (int r = 2 * rem; r < n; ++r) core.push_back(r);
  // Before the first round, a core rank's contribution is its send region, or its recv region
  // when it holds a folded pair's sum.
  const auto in = [&](int v, uint64_t at) {
    return folded[core[v]] ? b.Recv(core[v], at) : b.Send(core[v], at);
  };
  const auto acc = [&](int v, uint64_t at) { return b.Recv(core[v], at); };

  // kept[k][v]: the range core rank v holds after halving round k.
  std::vector<Block> range(p, Block{0, len});
  std::vector<std::vector<Block>> kept(logp);
  for (int k = 0; k < logp; ++k) {
    const bool last = k + 1 == logp;
    for (int v = 0; v < p; ++v) {
      const int w = v ^ (1 << k);
      if (w < v) continue;
      const Block r = range[v];
      const Block lower{r.offset, r.elems / 2};
      const Block upper{r.offset + lower.elems, r.elems - lower.elems};
      // v keeps the lower half, w the upper one.
      if (k == 0) b.Copy(in(w, upper.offset), acc(w, upper.offset), upper.elems);
      b.Reduce(k == 0 ? in(v, upper.offset) : acc(v, upper.offset), acc(w, upper.offset),
               upper.elems, last);
      if (k == 0) b.Copy(in(v, lower.offset), acc(v, lower.offset), lower.elems);
      b.Reduce(k == 0 ? in(w, lower.offset) : acc(w, lower.offset), acc(v, lower.offset),
               lower.elems, last);
      range[v] = lower;
      range[w] = upper;
    }
    kept[k] = range;
  }
  for (int k = logp - 1; k >= 0; --k) {
    for (int v = 0; v < p; ++v) {
      const int w = v ^ (1 << k);
      const Block mine = kept[k][v];
      b.Copy(acc(v, mine.offset), acc(w, mine.offset), mine.elems);
    }
  }
  for (int i = 0; i < rem; ++i) b.Copy(b.Recv(2 * i + 1), b.Recv(2 * i), len);
  return absl::OkStatus();
}

}  // namespace railyard::scheduler::algorithms
