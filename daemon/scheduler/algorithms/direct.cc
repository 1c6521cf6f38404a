// Direct: AllToAll(v) as a pairwise exchange; AllReduce as reduce-to-owner of 1/n of the data
// (each rank reduces its block from every rank) followed by copy-to-all; ReduceScatter,
// AllGather, Broadcast and Reduce as the matching single phase. Fewest dependent steps (two
// phases at most), n-1 peers per rank: right within a node and for few nodes.
#include "daemon/scheduler/algorithms/direct.h"

namespace railyard::scheduler::algorithms {

void DirectReduce(ScheduleBuilder& b, const std::vector<RankRef>& inputs, const RankRef& acc,
                  uint64_t elems, bool finalize) {
  b.Copy(inputs[0], acc, elems, finalize && inputs.size() == 1);
  for (size_t i = 1; i < inputs.size(); ++i) {
    b.Reduce(inputs[i], acc, elems, finalize && i + 1 == inputs.size());
  }
}

void DirectBroadcast(ScheduleBuilder& b, const RankRef& src, const std::vector<RankRef>& outs,
                     uint64_t elems) {
  for (const RankRef& out : outs) b.Copy(src, out, elems);
}

uint64_t A2ACount(const OpShape& s, int n, int i, int j) {
  return s.op == OpKind::kAllToAllv ? s.a2av_counts[static_cast<size_t>(i) * n + j] : s.count;
}

uint64_t A2ASendDispl(const OpShape& s, int n, int i, int j) {
  return s.op == OpKind::kAllToAllv ? s.a2av_send_displs[static_cast<size_t>(i) * n + j]
                                    : s.count * j;
}

uint64_t A2ARecvDispl(const OpShape& s, int n, int j, int i) {
  return s.op == OpKind::kAllToAllv ? s.a2av_recv_displs[static_cast<size_t>(j) * n + i]
                                    : s.count * i;
}

uint64_t PairwiseStagingElems(const OpShape& s, int n, const std::vector<int>& group, int y) {
  uint64_t total = 0;
  for (int x = 0; x < y; ++x) total += A2ACount(s, n, group[x], group[y]);
  return total;
}

void PairwiseExchange(ScheduleBuilder& b, const std::vector<int>& group, uint64_t scratch_base) {
  const OpShape& s = b.shape();
  const int n = b.nranks();
  const int g = static_cast<int>(group.size());
  for (int i : group) {
    b.Copy(b.Send(i, A2ASendDispl(s, n, i, i)), b.Recv(i, A2ARecvDispl(s, n, i, i)),
           A2ACount(s, n, i, i));
  }
  std::vector<uint64_t> cursor(g, scratch_base);
  for (int y = 0; y < g; ++y) {
    for (int x = 0; x < y; ++x) {
      const int i = group[x], j = group[y];
      const uint64_t ij = A2ACount(s, n, i, j), ji = A2ACount(s, n, j, i);
      const RankRef stage = b.Scratch(j, cursor[y]);
      cursor[y] += ij;
      b.Copy(b.Send(i, A2ASendDispl(s, n, i, j)), stage, ij);
      b.Copy(b.Send(j, A2ASendDispl(s, n, j, i)), b.Recv(i, A2ARecvDispl(s, n, i, j)), ji);
      b.Copy(stage, b.Recv(j, A2ARecvDispl(s, n, j, i)), ij);
    }
  }
}

namespace {

void AllPairsBarrier(ScheduleBuilder& b) {
  const CommLayout& l = b.layout();
  for (int i = 0; i < l.nnodes; ++i) {
    for (int d = 1; d < l.nnodes; ++d) {
      b.Signal(l.ranks_of_node[i][0], l.ranks_of_node[(i + d) % l.nnodes][0], {});
    }
  }
}

// Rank r's inputs at element `at`, starting with r's own (so owners start on different ranks).
std::vector<RankRef> InputsFrom(ScheduleBuilder& b, int r, uint64_t at) {
  std::vector<RankRef> inputs;
  inputs.reserve(b.nranks());
  for (int j = 0; j < b.nranks(); ++j) inputs.push_back(b.Send((r + j) % b.nranks(), at));
  return inputs;
}

}  // namespace

absl::Status GenerateDirect(ScheduleBuilder& b) {
  const OpShape& s = b.shape();
  const int n = b.nranks();
  const uint64_t c = s.count;
  switch (s.op) {
    case OpKind::kAllReduce: {
      const std::vector<Block> blocks = SplitEven(0, c, n);
      for (int r = 0; r < n; ++r) {
        DirectReduce(b, InputsFrom(b, r, blocks[r].offset), b.Recv(r, blocks[r].offset),
                     blocks[r].elems, /*finalize=*/true);
      }
      for (int r = 0; r < n; ++r) {
        std::vector<RankRef> outs;
        for (int j = 1; j < n; ++j) outs.push_back(b.Recv((r + j) % n, blocks[r].offset));
        DirectBroadcast(b, b.Recv(r, blocks[r].offset), outs, blocks[r].elems);
      }
      return absl::OkStatus();
    }
    case OpKind::kReduceScatter:
      for (int r = 0; r < n; ++r) DirectReduce(b, InputsFrom(b, r, r * c), b.Recv(r), c, true);
      return absl::OkStatus();
    case OpKind::kAllGather:
      for (int r = 0; r < n; ++r) {
        std::vector<RankRef> outs;
        outs.reserve(n);
        for (int j = 0; j < n; ++j) outs.push_back(b.Recv((r + j) % n, r * c));
        DirectBroadcast(b, b.Send(r), outs, c);
      }
      return absl::OkStatus();
    case OpKind::kBroadcast: {
      std::vector<RankRef> outs;
      outs.reserve(n);
      for (int j = 0; j < n; ++j) outs.push_back(b.Recv((s.root + j) % n));
      DirectBroadcast(b, b.Send(s.root), outs, c);
      return absl::OkStatus();
    }
    case OpKind::kReduce:
      DirectReduce(b, InputsFrom(b, s.root, 0), b.Recv(s.root), c, /*finalize=*/true);
      return absl::OkStatus();
    case OpKind::kAllToAll:
    case OpKind::kAllToAllv: {
      std::vector<int> all(n);
      for (int r = 0; r < n; ++r) all[r] = r;
      PairwiseExchange(b, all, 0);
      return absl::OkStatus();
    }
    case OpKind::kBarrier:
      AllPairsBarrier(b);
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError("direct does not implement this op");
  }
}

}  // namespace railyard::scheduler::algorithms
