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
namespace {

// The largest power of two p <= n and its rem = n - p extra ranks, folded away: rank 2i (i < rem)
// adds its input into rank 2i + 1's recv region and sits out until Unfold gives it the result.
struct Fold {
  int p = 1;
  int logp = 0;
  int rem = 0;
  std::vector<int> core;     // core index -> rank
  std::vector<bool> folded;  // holds a folded pair's sum in its recv region (not its send)
};

Fold FoldToPowerOfTwo(ScheduleBuilder& b, uint64_t len) {
  const int n = b.nranks();
  Fold f;
  while (f.p * 2 <= n) {
    f.p *= 2;
    ++f.logp;
  }
  f.rem = n - f.p;
  f.folded.assign(n, false);
  for (int i = 0; i < f.rem; ++i) {
    b.Copy(b.Send(2 * i + 1), b.Recv(2 * i + 1), len);
    b.Reduce(b.Send(2 * i), b.Recv(2 * i + 1), len);
    f.folded[2 * i + 1] = true;
    f.core.push_back(2 * i + 1);
  }
  for (int r = 2 * f.rem; r < n; ++r) f.core.push_back(r);
  return f;
}

void Unfold(ScheduleBuilder& b, const Fold& f, uint64_t len) {
  for (int i = 0; i < f.rem; ++i) b.Copy(b.Recv(2 * i + 1), b.Recv(2 * i), len);
}

}  // namespace

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
  const Fold fold = FoldToPowerOfTwo(b, len);
  const int p = fold.p, logp = fold.logp;
  const std::vector<int>& core = fold.core;
  const std::vector<bool>& folded = fold.folded;
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
  Unfold(b, fold, len);
  return absl::OkStatus();
}

absl::Status GenerateRd(ScheduleBuilder& b) {
  const OpShape& s = b.shape();
  if (s.op != OpKind::kAllReduce) return absl::InvalidArgumentError("rd implements allreduce");
  const int n = b.nranks();
  const uint64_t len = s.count;
  if (n == 1) {
    b.Copy(b.Send(0), b.Recv(0), len, /*finalize=*/true);
    return absl::OkStatus();
  }
  const Fold fold = FoldToPowerOfTwo(b, len);
  const std::vector<int>& core = fold.core;
  const std::vector<bool>& folded = fold.folded;
  const int p = fold.p;
  for (int k = 0; k < fold.logp; ++k) {
    const bool last = k + 1 == fold.logp;
    // Every partner's partial into this rank's scratch before any partial changes: in round 0
    // (in place, send == recv) that also reads every input before it is overwritten.
    for (int v = 0; v < p; ++v) {
      const int w = core[v ^ (1 << k)];
      const bool input = k == 0 && !folded[w];
      b.Copy(input ? b.Send(w) : b.Recv(w), b.Scratch(core[v]), len);
    }
    for (int v = 0; v < p; ++v) {
      const int r = core[v];
      if (k == 0 && !folded[r]) b.Copy(b.Send(r), b.Recv(r), len);
      b.Reduce(b.Scratch(r), b.Recv(r), len, last);
    }
  }
  Unfold(b, fold, len);
  return absl::OkStatus();
}

}  // namespace railyard::scheduler::algorithms
