// Schedule generators, Project and the symbolic executor: every algorithm's schedule, projected
// onto the nodes and run over simulated memory, must produce the collective's definition (1..9
// nodes x 1..4 ranks, odd counts and 0, in place and out of place) and put on each link the bytes
// of the PRIMER's formulas.
#include "daemon/scheduler/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/kernels/types.h"
#include "daemon/scheduler/algorithms/algorithms.h"
#include "daemon/scheduler/algorithms/builder.h"
#include "daemon/scheduler/algorithms/tree.h"
#include "daemon/scheduler/op.h"
#include "daemon/scheduler/symbolic_executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace railyard::scheduler {
namespace {

using algorithms::Block;
using algorithms::SplitEven;
using kernels::DataType;
using kernels::RedOp;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// Cases

struct Case {
  std::string algo;
  OpKind op = OpKind::kAllReduce;
  CommLayout layout;
  uint64_t count = 0;
  bool in_place = false;
  DataType dtype = DataType::kInt32;
  RedOp red = RedOp::kSum;
  int root = 0;
  size_t chunk_bytes = 0;

  std::string Name() const {
    std::string nodes;
    for (const auto& ranks : layout.ranks_of_node) absl::StrAppend(&nodes, ranks.size(), ".");
    return absl::StrCat(algo, " ", OpName(op), " nodes(", nodes, ") rails ", layout.rails,
                        " count ", count, in_place ? " in-place" : " out-of-place", " ",
                        std::string(kernels::Name(dtype)), " ", std::string(kernels::Name(red)),
                        " root ", root, " chunk ", chunk_bytes);
  }
};

// AllToAllv counts: symmetric (i, j) in place (send and recv must then share counts and displs),
// skewed otherwise; blocks placed in reverse peer order with one-element gaps.
uint64_t A2avCount(const Case& c, int i, int j) {
  if (c.in_place) return (i + j + c.count) % 3 + c.count / 2;
  return (i * 7 + j * 3 + c.count) % 5 + c.count / 3;
}

OpShape ShapeOf(const Case& c) {
  OpShape s;
  s.op = c.op;
  s.dtype = c.dtype;
  s.red_op = c.red;
  s.count = c.count;
  s.root = c.root;
  if (c.op == OpKind::kAllToAllv) {
    const int n = c.layout.nranks;
    s.a2av_counts.resize(n * n);
    s.a2av_send_displs.resize(n * n);
    s.a2av_recv_displs.resize(n * n);
    for (int i = 0; i < n; ++i) {
      uint64_t spos = 0, rpos = 0;
      for (int j = n - 1; j >= 0; --j) {
        s.a2av_counts[i * n + j] = A2avCount(c, i, j);
        s.a2av_send_displs[i * n + j] = spos;
        spos += A2avCount(c, i, j) + 1;
      }
      for (int j = 0; j < n; ++j) {
        // In place, recv displs must equal send displs; out of place use another order.
        if (c.in_place) {
          s.a2av_recv_displs[i * n + j] = s.a2av_send_displs[i * n + j];
        } else {
          s.a2av_recv_displs[i * n + j] = rpos;
          rpos += A2avCount(c, j, i) + 2;
        }
      }
    }
  }
  return s;
}

// Input element e of rank r: small values, so sums are exact in float and never wrap.
double Input(int r, uint64_t e) { return static_cast<double>((r * 37 + e * 11 + 5) % 41) - 20; }

void Store(DataType t, std::byte* p, double v) {
  if (t == DataType::kInt32) {
    const auto x = static_cast<int32_t>(v);
    std::memcpy(p, &x, 4);
  } else {
    const auto x = static_cast<float>(v);
    std::memcpy(p, &x, 4);
  }
}

double Load(DataType t, const std::byte* p) {
  if (t == DataType::kInt32) {
    int32_t x;
    std::memcpy(&x, p, 4);
    return x;
  }
  float x;
  std::memcpy(&x, p, 4);
  return x;
}

// The reduction of rank inputs at (element of rank j = at(j)).
template <typename At>
double Reduced(const Case& c, At at) {
  const int n = c.layout.nranks;
  double acc = at(0);
  for (int j = 1; j < n; ++j) {
    const double v = at(j);
    switch (c.red) {
      case RedOp::kMax:
        acc = std::max(acc, v);
        break;
      case RedOp::kMin:
        acc = std::min(acc, v);
        break;
      default:
        acc += v;
    }
  }
  if (c.red == RedOp::kAvg) {
    if (c.dtype == DataType::kInt32) return std::trunc(acc / n);
    return static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
  }
  return acc;
}

// Writes the op's expected recv contents of every rank into `want` (a copy of the inputs).
void Expect(const Case& c, const OpShape& s, SimMemory* want) {
  const int n = c.layout.nranks;
  const uint64_t cnt = c.count;
  const DataType t = c.dtype;
  for (int r = 0; r < n; ++r) {
    std::byte* out = want->recv(r);
    const auto put = [&](uint64_t e, double v) { Store(t, out + e * 4, v); };
    switch (c.op) {
      case OpKind::kAllReduce:
        for (uint64_t e = 0; e < cnt; ++e) put(e, Reduced(c, [&](int j) { return Input(j, e); }));
        break;
      case OpKind::kReduceScatter:
        for (uint64_t e = 0; e < cnt; ++e) {
          put(e, Reduced(c, [&](int j) { return Input(j, r * cnt + e); }));
        }
        break;
      case OpKind::kAllGather:
        for (int j = 0; j < n; ++j) {
          for (uint64_t e = 0; e < cnt; ++e) put(j * cnt + e, Input(j, e));
        }
        break;
      case OpKind::kBroadcast:
        for (uint64_t e = 0; e < cnt; ++e) put(e, Input(c.root, e));
        break;
      case OpKind::kReduce:
        if (r != c.root) break;
        for (uint64_t e = 0; e < cnt; ++e) put(e, Reduced(c, [&](int j) { return Input(j, e); }));
        break;
      case OpKind::kAllToAll:
        for (int j = 0; j < n; ++j) {
          for (uint64_t e = 0; e < cnt; ++e) put(j * cnt + e, Input(j, r * cnt + e));
        }
        break;
      case OpKind::kAllToAllv:
        for (int j = 0; j < n; ++j) {
          const uint64_t k = s.a2av_counts[j * n + r];
          const uint64_t from = s.a2av_send_displs[j * n + r];
          const uint64_t to = s.a2av_recv_displs[r * n + j];
          for (uint64_t e = 0; e < k; ++e) put(to + e, Input(j, from + e));
        }
        break;
      default:
        break;
    }
  }
}

// Test chunk size: about two chunks per ring block, so that pipelining is exercised while the
// schedules of 36 ranks stay a few thousand steps.
size_t ChunkFor(const Case& c) {
  const int n = c.layout.nranks;
  uint64_t total = c.count * 4;
  if (c.op == OpKind::kReduceScatter || c.op == OpKind::kAllGather || c.op == OpKind::kAllToAll ||
      c.op == OpKind::kAllToAllv) {
    total *= n;
  }
  return std::max<uint64_t>(4, total / (n + 2));
}

struct Outcome {
  RankSchedule schedule;
  SimStats stats;
};

// Generates, runs and checks the result of one case.
Outcome RunCase(const Case& c) {
  Outcome out;
  SCOPED_TRACE(c.Name());
  const OpShape shape = ShapeOf(c);
  auto schedule = Generate(c.algo, shape, c.layout, c.chunk_bytes);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  if (!schedule.ok()) return out;
  EXPECT_EQ(schedule->algorithm, c.algo);
  const int n = c.layout.nranks;
  SimMemory mem = SimMemory::ForOp(shape, n, c.in_place, std::byte{0x5A});
  for (int r = 0; r < n; ++r) {
    const uint64_t elems = mem.ranks[r].send_bytes / 4;
    for (uint64_t e = 0; e < elems; ++e) Store(c.dtype, mem.send(r) + e * 4, Input(r, e));
  }
  SimMemory want = mem;
  Expect(c, shape, &want);
  auto stats = RunSymbolic(*schedule, c.layout, shape, &mem);
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (!stats.ok()) return out;
  for (int r = 0; r < n; ++r) {
    const auto& got = mem.ranks[r].user;
    const auto& exp = want.ranks[r].user;
    if (got.size() != exp.size()) {
      ADD_FAILURE() << "rank " << r << " buffer size changed";
      return out;
    }
    for (size_t b = 0; b < got.size(); b += 4) {
      const double g = Load(c.dtype, &got[b]), w = Load(c.dtype, &exp[b]);
      const bool same = c.dtype == DataType::kInt32
                            ? std::memcmp(&got[b], &exp[b], 4) == 0
                            : std::fabs(g - w) <= 1e-5 * std::max(1.0, std::fabs(w));
      if (!same) {
        ADD_FAILURE() << "rank " << r << " byte " << b << " (recv region at "
                      << mem.ranks[r].recv_offset << "): got " << g << ", want " << w;
        return out;
      }
    }
  }
  EXPECT_TRUE(stats->races_checked);
  // Every inter-node byte is counted once on its link, at its sender and at its receiver.
  uint64_t link_bytes = 0, sent = 0, received = 0;
  for (const auto& [key, link] : stats->links) link_bytes += link.bytes;
  for (int r = 0; r < n; ++r) {
    sent += stats->rank_net_bytes_sent[r];
    received += stats->rank_net_bytes_received[r];
  }
  EXPECT_EQ(link_bytes, sent);
  EXPECT_EQ(link_bytes, received);
  out.schedule = std::move(*schedule);
  out.stats = std::move(*stats);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Byte formulas (PRIMER sections 2-4): what each rank sends, M being the op's message bytes.

uint64_t Len(const std::vector<Block>& blocks, int i) { return blocks[i].elems; }

void CheckBytes(const Case& c, const Outcome& o) {
  SCOPED_TRACE(c.Name());
  const CommLayout& l = c.layout;
  const int n = l.nranks;
  const uint64_t es = 4;
  const uint64_t cnt = c.count;
  const SimStats& st = o.stats;
  const auto& sent = st.rank_bytes_sent;
  const auto& net = st.rank_net_bytes_sent;
  const uint64_t m = cnt * es;
  if (c.op == OpKind::kBarrier) {
    for (int a = 0; a < l.nnodes; ++a) {
      for (int b = 0; b < l.nnodes; ++b) {
        EXPECT_TRUE(st.reached[a][b])
            << "node " << a << " may finish before node " << b << " arrived";
      }
    }
    for (const auto& [key, link] : st.links) EXPECT_EQ(link.bytes, 0u);
    return;
  }
  const auto each = [&](auto want) {
    for (int r = 0; r < n; ++r) EXPECT_EQ(sent[r], want(r)) << "rank " << r;
  };
  uint64_t total = 0;
  for (int r = 0; r < n; ++r) total += sent[r];
  if (c.algo == kAlgoRing) {
    switch (c.op) {
      case OpKind::kAllReduce: {
        const auto blocks = SplitEven(0, cnt, n);
        each([&](int p) {
          return n == 1 ? 0 : (2 * cnt - Len(blocks, p) - Len(blocks, (p + 1) % n)) * es;
        });
        // PRIMER: 2 (N-1)/N M per rank, exact when N divides M, within an element per block.
        const double primer = 2.0 * (n - 1) / n * static_cast<double>(m);
        for (int r = 0; r < n; ++r) EXPECT_LE(std::fabs(sent[r] - primer), 2.0 * es);
        if (cnt % n == 0) {
          for (int r = 0; r < n; ++r) EXPECT_EQ(sent[r], 2 * (n - 1) * (m / n));
        }
        break;
      }
      case OpKind::kReduceScatter:
      case OpKind::kAllGather:
        each([&](int) { return (n - 1) * m; });  // (N-1)/N of the N*count buffer
        break;
      case OpKind::kBroadcast:
        each([&](int r) { return r == (c.root + n - 1) % n ? 0 : m; });
        break;
      case OpKind::kReduce:
        each([&](int r) { return r == c.root ? 0 : m; });
        break;
      default:
        break;
    }
  } else if (c.algo == kAlgoTree) {
    const algorithms::Tree t = algorithms::InOrderTree(n);
    EXPECT_EQ(total, (n - 1) * m * (c.op == OpKind::kAllReduce ? 2 : 1));
    if (c.op == OpKind::kAllReduce) {
      // Each tree carries half: a rank sends its half up (unless root) and to each child.
      const auto halves = SplitEven(0, cnt, 2);
      std::vector<uint64_t> want(n, 0);
      for (int tr = 0; tr < 2; ++tr) {
        for (int pos = 0; pos < n; ++pos) {
          const int rank = tr == 0 ? pos : algorithms::SecondTreeRankAt(pos, n);
          const uint64_t sends = (pos != t.root ? 1 : 0) + t.children[pos].size();
          want[rank] += sends * halves[tr].elems * es;
        }
      }
      each([&](int r) { return want[r]; });
      for (int r = 0; r < n; ++r) EXPECT_LE(sent[r], 2 * m + es);  // ~2M: interior in one tree
    } else {
      for (int r = 0; r < n; ++r) EXPECT_LE(sent[r], 2 * m);
    }
  } else if (c.algo == kAlgoRd) {
    // Recursive doubling: every core rank sends its whole partial in each of log2(p) rounds; a
    // folded rank sends its input once, its partner the result back once.
    int p = 1, logp = 0;
    while (p * 2 <= n) {
      p *= 2;
      ++logp;
    }
    const int rem = n - p;
    for (int r = 0; r < n; ++r) {
      const bool folded = r < 2 * rem && r % 2 == 0;
      const uint64_t want = folded ? m : logp * m + (r < 2 * rem ? m : 0);
      EXPECT_EQ(sent[r], n == 1 ? 0 : want) << "rank " << r;
    }
  } else if (c.algo == kAlgoRhd) {
    int p = 1, logp = 0;
    while (p * 2 <= n) {
      p *= 2;
      ++logp;
    }
    const int rem = n - p;
    const double core = 2.0 * (p - 1) / p * static_cast<double>(m);
    for (int r = 0; r < n; ++r) {
      if (r < 2 * rem && r % 2 == 0) {
        EXPECT_EQ(sent[r], m) << "folded rank " << r;
      } else {
        const double want = core + (r < 2 * rem ? static_cast<double>(m) : 0.0);
        EXPECT_LE(std::fabs(sent[r] - want), 2.0 * logp * es) << "rank " << r;
      }
    }
    if (rem == 0 && cnt % n == 0) {
      for (int r = 0; r < n; ++r) EXPECT_EQ(sent[r], 2 * (n - 1) * (m / n));
    }
  } else if (c.algo == kAlgoDirect) {
    switch (c.op) {
      case OpKind::kAllReduce: {
        const auto blocks = SplitEven(0, cnt, n);
        each([&](int r) { return (cnt - Len(blocks, r) + (n - 1) * Len(blocks, r)) * es; });
        break;
      }
      case OpKind::kReduceScatter:
      case OpKind::kAllGather:
      case OpKind::kAllToAll:
        each([&](int) { return (n - 1) * m; });  // (N-1)/N of N*count
        break;
      case OpKind::kAllToAllv:
        each([&](int i) {
          uint64_t want = 0;
          for (int j = 0; j < n; ++j) want += j == i ? 0 : A2avCount(c, i, j) * es;
          return want;
        });
        break;
      case OpKind::kBroadcast:
        each([&](int r) { return r == c.root ? (n - 1) * m : 0; });
        break;
      case OpKind::kReduce:
        each([&](int r) { return r == c.root ? 0 : m; });
        break;
      default:
        break;
    }
  } else if (c.algo == kAlgoHier) {
    const int k = l.nnodes, g = l.ranks_per_node();
    // Rail alignment: inter-node transfers only between equal local indices, never cross-rail.
    EXPECT_EQ(st.cross_rail_bytes, 0u);
    for (const Transfer& t : o.schedule.transfers) {
      if (l.node_of_rank[t.src.rank] != l.node_of_rank[t.dst.rank]) {
        ASSERT_EQ(l.local_index_of_rank[t.src.rank], l.local_index_of_rank[t.dst.rank]);
      }
    }
    const auto shards = SplitEven(0, cnt, g);
    const int k0 = l.node_of_rank[c.root];
    for (int r = 0; r < n; ++r) {
      const int node = l.node_of_rank[r], i = l.local_index_of_rank[r];
      const uint64_t sh = shards[i].elems;
      uint64_t want = 0;
      switch (c.op) {
        case OpKind::kAllReduce: {
          if (k == 1) break;
          const auto sub = SplitEven(0, sh, k);
          want = (2 * sh - Len(sub, node) - Len(sub, (node + 1) % k)) * es;
          // PRIMER: M/G * 2(K-1)/K across nodes per rank.
          if (cnt % (g * k) == 0) {
            EXPECT_EQ(want, m / g * 2 * (k - 1) / k);
          }
          break;
        }
        case OpKind::kReduceScatter:
        case OpKind::kAllGather:
          want = (k - 1) * m;  // (K-1)/K of this local index's K blocks
          break;
        case OpKind::kBroadcast:
          want = node == (k0 + k - 1) % k ? 0 : sh * es;
          break;
        case OpKind::kReduce:
          want = node == k0 ? 0 : sh * es;
          break;
        default:
          want = net[r];  // alltoall: per node below
      }
      EXPECT_EQ(net[r], want) << "rank " << r << " net bytes";
    }
    if (c.op == OpKind::kAllToAll || c.op == OpKind::kAllToAllv) {
      const OpShape s = ShapeOf(c);
      std::vector<uint64_t> want(k, 0), got(k, 0);
      std::set<std::pair<int, int>> flows;
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
          if (l.node_of_rank[i] == l.node_of_rank[j]) continue;
          want[l.node_of_rank[i]] +=
              (c.op == OpKind::kAllToAll ? cnt : s.a2av_counts[i * n + j]) * es;
        }
      }
      for (const auto& [key, link] : st.links) {
        got[key.src_node] += link.bytes;
        flows.emplace(key.src_node, key.dst_node);
      }
      EXPECT_EQ(got, want);
      EXPECT_LE(flows.size(), static_cast<size_t>(k * (k - 1)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The matrix: every (algorithm, op) the table lists.

struct AlgoOp {
  std::string algo;
  OpKind op;
};

void PrintTo(const AlgoOp& ao, std::ostream* os) { *os << ao.algo << " " << OpName(ao.op); }

std::vector<AlgoOp> AllAlgoOps() {
  std::vector<AlgoOp> v;
  for (const auto& a : algorithms::AlgorithmTable()) {
    if (std::string(a.name) == kAlgoTorus) continue;  // needs torus_dims: TorusAlgorithm below
    for (OpKind op :
         {OpKind::kAllReduce, OpKind::kReduceScatter, OpKind::kAllGather, OpKind::kBroadcast,
          OpKind::kReduce, OpKind::kAllToAll, OpKind::kAllToAllv, OpKind::kBarrier}) {
      if (algorithms::Implements(a, op)) v.push_back({a.name, op});
    }
  }
  return v;
}

std::vector<CommLayout> Layouts(bool uniform_only) {
  std::vector<CommLayout> v;
  for (int k = 1; k <= 9; ++k) {
    for (int g = 1; g <= 4; ++g) v.push_back(CommLayout::Uniform(k, g, 2));
  }
  // Ranks interleaved over the nodes (uniform, not consecutive), and three rails.
  v.push_back(CommLayout::FromNodeOfRank({0, 1, 2, 0, 1, 2, 0, 1, 2}, 3));
  v.push_back(CommLayout::FromNodeOfRank({1, 0, 1, 0, 0, 1}, 1));
  if (!uniform_only) {
    v.push_back(CommLayout::FromNodeOfRank({0, 1, 1, 1, 2, 2}, 2));
    v.push_back(CommLayout::FromNodeOfRank({0, 0, 1, 2, 2, 2, 2, 3}, 2));
    v.push_back(CommLayout::FromNodeOfRank({0, 0, 0, 1}, 2));
  }
  return v;
}

class AlgorithmTest : public ::testing::TestWithParam<AlgoOp> {};

TEST_P(AlgorithmTest, MatchesDefinitionAndPrimerBytes) {
  const AlgoOp& ao = GetParam();
  int runs = 0;
  for (const CommLayout& layout : Layouts(ao.algo == kAlgoHier)) {
    const std::vector<uint64_t> counts =
        ao.op == OpKind::kBarrier ? std::vector<uint64_t>{0} : std::vector<uint64_t>{0, 1, 7, 1001};
    for (uint64_t count : counts) {
      for (bool in_place : {false, true}) {
        if (ao.op == OpKind::kBarrier && in_place) continue;
        Case c;
        c.algo = ao.algo;
        c.op = ao.op;
        c.layout = layout;
        c.count = count;
        c.in_place = in_place;
        c.root = HasRoot(ao.op) ? static_cast<int>((count + layout.nnodes) % layout.nranks) : 0;
        c.chunk_bytes = ChunkFor(c);
        const Outcome o = RunCase(c);
        if (HasFailure()) return;
        CheckBytes(c, o);
        if (HasFailure()) return;
        ++runs;
      }
    }
  }
  EXPECT_GT(runs, 0);
}

INSTANTIATE_TEST_SUITE_P(All, AlgorithmTest, ::testing::ValuesIn(AllAlgoOps()),
                         [](const ::testing::TestParamInfo<AlgoOp>& info) {
                           return absl::StrCat(info.param.algo, "_", OpName(info.param.op));
                         });

// The torus algorithm on torus layouts (one rank per node, rank r at x = r % X, ...): 2x2, 3x4,
// 2x3x2, counts 0, 1 and not divisible, in and out of place, sum/avg/max; each rank sends what
// the ring sends (2 (N-1)/N M for AllReduce, (N-1) count for ReduceScatter/AllGather), and every
// transfer is between torus neighbours.
TEST(TorusAlgorithm, MatchesDefinitionOnTorusLayouts) {
  for (const std::vector<int>& dims :
       {std::vector<int>{2, 2}, std::vector<int>{3, 4}, std::vector<int>{2, 3, 2}}) {
    int n = 1;
    for (int d : dims) n *= d;
    for (OpKind op : {OpKind::kAllReduce, OpKind::kReduceScatter, OpKind::kAllGather}) {
      for (uint64_t count : {0, 1, 7, 1001}) {
        for (bool in_place : {false, true}) {
          for (auto [dtype, red] : {std::pair{DataType::kInt32, RedOp::kSum},
                                    std::pair{DataType::kFloat32, RedOp::kAvg},
                                    std::pair{DataType::kInt32, RedOp::kMax}}) {
            Case c;
            c.algo = kAlgoTorus;
            c.op = op;
            c.layout = CommLayout::Uniform(n, 1, 1);
            c.layout.torus_dims = dims;
            c.count = count;
            c.in_place = in_place;
            c.dtype = dtype;
            c.red = red;
            c.chunk_bytes = ChunkFor(c);
            const Outcome o = RunCase(c);
            ASSERT_FALSE(HasFailure()) << c.Name();
            const uint64_t m = count * 4;
            for (int r = 0; r < n; ++r) {
              const uint64_t sent = o.stats.rank_bytes_sent[r];
              if (op == OpKind::kAllReduce) {
                EXPECT_LE(std::fabs(sent - 2.0 * (n - 1) / n * m), 4.0 * dims.size() * 4) << r;
              } else {
                EXPECT_EQ(sent, (n - 1) * m) << c.Name() << " rank " << r;
              }
            }
            for (const Transfer& t : o.schedule.transfers) {
              int diff = 0, stride = 1;
              for (int d : dims) {
                const int a = t.src.rank / stride % d, b = t.dst.rank / stride % d;
                if (a != b) diff += (b - a + d) % d == 1 ? 1 : 2;
                stride *= d;
              }
              EXPECT_LE(diff, 1) << "not a torus neighbour: " << t.src.rank << " -> " << t.dst.rank;
            }
          }
        }
      }
    }
  }
  // Without torus_dims, with a mismatching product or several ranks per node: refused.
  OpShape s;
  s.op = OpKind::kAllReduce;
  s.count = 8;
  CommLayout l = CommLayout::Uniform(4, 1, 1);
  EXPECT_THAT(Generate(kAlgoTorus, s, l, 0).status().message(), HasSubstr("torus_dims"));
  l.torus_dims = {2, 3};
  EXPECT_THAT(Generate(kAlgoTorus, s, l, 0).status().message(),
              HasSubstr("does not hold the 4 ranks"));
  l = CommLayout::Uniform(2, 2, 1);
  l.torus_dims = {2, 2};
  EXPECT_THAT(Generate(kAlgoTorus, s, l, 0).status().message(), HasSubstr("one rank per node"));
  s.op = OpKind::kBroadcast;
  EXPECT_EQ(Generate(kAlgoTorus, s, l, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// avg: intermediate reductions are sums, every rank's output is divided exactly once (float and
// truncating int32); max exercises a non-sum operator.
TEST(AlgorithmReductions, AvgAndMaxDivideOnceEverywhere) {
  for (const AlgoOp& ao : AllAlgoOps()) {
    if (!IsReduction(ao.op)) continue;
    for (int k : {1, 2, 3, 5}) {
      for (int g : {1, 2, 3}) {
        for (uint64_t count : {1, 7, 1001}) {
          for (bool in_place : {false, true}) {
            for (auto [dtype, red] : {std::pair{DataType::kFloat32, RedOp::kAvg},
                                      std::pair{DataType::kInt32, RedOp::kAvg},
                                      std::pair{DataType::kFloat32, RedOp::kMax}}) {
              Case c;
              c.algo = ao.algo;
              c.op = ao.op;
              c.layout = CommLayout::Uniform(k, g, 2);
              c.count = count;
              c.in_place = in_place;
              c.dtype = dtype;
              c.red = red;
              c.root = static_cast<int>(count % c.layout.nranks);
              c.chunk_bytes = ChunkFor(c);
              RunCase(c);
              if (HasFailure()) return;
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Pipelining: a chunk's step depends only on steps that touched the same bytes of one of its
// ranks (the previous steps of that chunk), never on a whole previous round.

bool Overlaps(const RankRef& a, const RankRef& b, uint64_t bytes_a, uint64_t bytes_b) {
  return a.rank == b.rank && a.offset < b.offset + bytes_b && b.offset < a.offset + bytes_a &&
         (a.space == RankRef::Space::kScratch) == (b.space == RankRef::Space::kScratch);
}

TEST(Pipelining, DepsOnlyOnTheSameChunk) {
  for (const char* algo : {kAlgoRing, kAlgoTree, kAlgoRhd, kAlgoDirect, kAlgoHier}) {
    OpShape s;
    s.op = OpKind::kAllReduce;
    s.dtype = DataType::kInt32;
    s.count = 4096;
    const CommLayout l = CommLayout::Uniform(3, 2, 2);
    auto sched = Generate(algo, s, l, 1024);
    ASSERT_TRUE(sched.ok()) << sched.status();
    size_t chunks_in_flight = 0;
    for (const Transfer& t : sched->transfers) {
      EXPECT_LE(t.bytes, 1024u);
      for (uint32_t u : t.deps) {
        const Transfer& d = sched->transfers[u];
        EXPECT_TRUE(
            Overlaps(t.src, d.src, t.bytes, d.bytes) || Overlaps(t.src, d.dst, t.bytes, d.bytes) ||
            Overlaps(t.dst, d.src, t.bytes, d.bytes) || Overlaps(t.dst, d.dst, t.bytes, d.bytes))
            << algo << ": a dep that shares no bytes";
      }
      if (t.deps.empty()) ++chunks_in_flight;
    }
    // Many chunks can start at once (not one per round).
    EXPECT_GT(chunks_in_flight, 6u) << algo;
  }
}

// ---------------------------------------------------------------------------------------------
// Generate / layouts

TEST(Generate, RejectsWhatIsNotImplemented) {
  OpShape s;
  s.op = OpKind::kAllToAll;
  s.count = 4;
  const CommLayout l = CommLayout::Uniform(2, 2, 1);
  auto r = Generate(kAlgoRhd, s, l, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("algorithm rhd does not implement op alltoall (available: direct, hier)"));
  r = Generate("bogus", s, l, 0);
  EXPECT_THAT(r.status().message(), HasSubstr("unknown algorithm 'bogus'"));
  s.op = OpKind::kSend;
  r = Generate(kAlgoDirect, s, l, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  s.op = OpKind::kBroadcast;
  s.root = 4;
  EXPECT_THAT(Generate(kAlgoRing, s, l, 0).status().message(), HasSubstr("root 4"));
  s.op = OpKind::kAllReduce;
  const CommLayout uneven = CommLayout::FromNodeOfRank({0, 0, 1}, 1);
  r = Generate(kAlgoHier, s, uneven, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("ranks per node: 2, 1"));
  // Every op except point-to-point has at least one algorithm.
  for (OpKind op :
       {OpKind::kAllReduce, OpKind::kReduceScatter, OpKind::kAllGather, OpKind::kBroadcast,
        OpKind::kReduce, OpKind::kAllToAll, OpKind::kAllToAllv, OpKind::kBarrier}) {
    EXPECT_FALSE(algorithms::AlgorithmsFor(op).empty()) << OpName(op);
  }
}

TEST(Generate, IsAPureFunction) {
  OpShape s;
  s.op = OpKind::kAllReduce;
  s.count = 12345;
  const CommLayout l = CommLayout::Uniform(3, 4, 2);
  for (const char* algo : {kAlgoRing, kAlgoTree, kAlgoRhd, kAlgoHier}) {
    auto a = Generate(algo, s, l, 4096), b = Generate(algo, s, l, 4096);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->transfers.size(), b->transfers.size());
    for (size_t i = 0; i < a->transfers.size(); ++i) {
      const Transfer &x = a->transfers[i], &y = b->transfers[i];
      EXPECT_TRUE(x.src.rank == y.src.rank && x.src.offset == y.src.offset &&
                  x.dst.rank == y.dst.rank && x.dst.offset == y.dst.offset && x.bytes == y.bytes &&
                  x.deps == y.deps && x.kind == y.kind);
    }
  }
}

TEST(CommLayout, UniformAndFromNodeOfRank) {
  const CommLayout u = CommLayout::Uniform(3, 4, 2);
  EXPECT_EQ(u.nranks, 12);
  EXPECT_EQ(u.nnodes, 3);
  EXPECT_EQ(u.ranks_per_node(), 4);
  EXPECT_EQ(u.node_of_rank[7], 1);
  EXPECT_EQ(u.local_index_of_rank[7], 3);
  EXPECT_EQ(u.rail_of_rank(7), 1);
  EXPECT_EQ(u.ranks_of_node[2], (std::vector<int>{8, 9, 10, 11}));
  const CommLayout f = CommLayout::FromNodeOfRank({1, 0, 1, 1}, 2);
  EXPECT_EQ(f.ranks_per_node(), 0);
  EXPECT_EQ(f.ranks_of_node[1], (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(f.local_index_of_rank[3], 2);
  EXPECT_EQ(f.rail_of_rank(3), 0);
}

TEST(Tree, DoubleBinaryTreeIsComplementary) {
  for (int n = 1; n <= 70; ++n) {
    const algorithms::Tree t = algorithms::InOrderTree(n);
    int roots = 0;
    std::vector<int> interior(n, 0);
    for (int p = 0; p < n; ++p) {
      EXPECT_LE(t.children[p].size(), 2u);
      if (t.parent[p] < 0) ++roots;
      for (int c : t.children[p]) EXPECT_EQ(t.parent[c], p);
      const bool inner = !t.children[p].empty();
      EXPECT_EQ(inner, p % 2 == 1 && n > 1) << n << " " << p;
      if (inner) {
        ++interior[p];
        ++interior[algorithms::SecondTreeRankAt(p, n)];
      }
    }
    EXPECT_EQ(roots, 1);
    EXPECT_EQ(t.parent[t.root], -1);
    for (int r = 0; r < n; ++r) EXPECT_LE(interior[r], 1) << "n " << n << " rank " << r;
  }
}

// ---------------------------------------------------------------------------------------------
// Project

TEST(Project, InterNodeTransfersBecomeSendRecvWithStaging) {
  OpShape s;
  s.op = OpKind::kAllReduce;
  s.dtype = DataType::kFloat32;
  s.count = 4000;
  const CommLayout l = CommLayout::Uniform(4, 2, 2);
  auto sched = Generate(kAlgoRing, s, l, 2048);
  ASSERT_TRUE(sched.ok());
  std::map<std::pair<int, int>, std::vector<uint64_t>> sent_tags, recv_tags;
  for (int k = 0; k < l.nnodes; ++k) {
    const NodeSchedule ns = Project(*sched, l, s, k);
    EXPECT_EQ(ns.node, k);
    EXPECT_GT(ns.scratch_bytes_per_rank, sched->scratch_bytes_per_rank);
    for (size_t i = 0; i < ns.steps.size(); ++i) {
      const NodeStep& st = ns.steps[i];
      for (uint32_t d : st.deps) EXPECT_LT(d, i);
      if (st.kind == NodeStep::Kind::kSend) {
        EXPECT_EQ(l.node_of_rank[st.src.rank], k);
        EXPECT_EQ(st.rail, l.rail_of_rank(st.src.rank));
        sent_tags[{k, st.peer}].push_back(st.tag);
      } else if (st.kind == NodeStep::Kind::kRecv) {
        recv_tags[{st.peer, k}].push_back(st.tag);
        // Ring reduce-scatter reductions land in scratch, then a local reduce applies them (a
        // combine with the node's own contribution, FuseCopiesIntoReduces).
        if (st.dst.space == RankRef::Space::kScratch) {
          ASSERT_LT(i + 1, ns.steps.size());
          EXPECT_THAT(ns.steps[i + 1].kind,
                      ::testing::AnyOf(NodeStep::Kind::kReduce, NodeStep::Kind::kCombine));
          EXPECT_THAT(ns.steps[i + 1].deps, ::testing::Contains(i));
        }
      } else {
        EXPECT_EQ(l.node_of_rank[st.src.rank], k);
        EXPECT_EQ(l.node_of_rank[st.dst.rank], k);
      }
    }
  }
  EXPECT_EQ(sent_tags, recv_tags);
  for (const auto& [pair, tags] : sent_tags) {
    for (size_t i = 0; i < tags.size(); ++i) EXPECT_EQ(tags[i], i);  // unique, in order
  }
}

// Each incoming stream (source rank -> destination rank) has its own staging slots: a recv waits
// at most for the reduction that emptied its slot, never for another stream's (tree children).
TEST(Project, StagingSlotsArePerStream) {
  OpShape s;
  s.op = OpKind::kAllReduce;
  s.dtype = DataType::kFloat32;
  s.count = 1 << 16;
  const CommLayout l = CommLayout::Uniform(7, 1, 1);
  auto sched = Generate(kAlgoTree, s, l, 4096);
  ASSERT_TRUE(sched.ok());
  int reused = 0;
  for (int k = 0; k < l.nnodes; ++k) {
    const NodeSchedule ns = Project(*sched, l, s, k);
    for (const NodeStep& st : ns.steps) {
      if (st.kind != NodeStep::Kind::kRecv || st.dst.space != RankRef::Space::kScratch) continue;
      ASSERT_LE(st.deps.size(), 1u);
      for (uint32_t d : st.deps) {
        const NodeStep& user = ns.steps[d];
        EXPECT_THAT(user.kind, ::testing::AnyOf(NodeStep::Kind::kReduce, NodeStep::Kind::kCombine));
        EXPECT_EQ(user.src.offset, st.dst.offset);
        // The previous user of the slot consumed a message from the same peer.
        EXPECT_EQ(ns.steps[user.deps.back()].peer, st.peer);
        ++reused;
      }
    }
  }
  EXPECT_GT(reused, 0);
}

// ---------------------------------------------------------------------------------------------
// The symbolic executor's own checks

NodeStep Step(NodeStep::Kind kind, int peer, uint64_t tag, std::vector<uint32_t> deps = {}) {
  NodeStep s;
  s.kind = kind;
  s.peer = peer;
  s.tag = tag;
  s.bytes = 4;
  s.deps.assign(deps.begin(), deps.end());
  return s;
}

// Across nodes, a node's own contribution to a reduction is read where the reduction reads its
// peer's partial (one kCombine), not first copied into place: out of place, a ring AllReduce
// over 2 nodes x 1 rank has no copy left at all, and the local bytes halve.
TEST(Project, ANodesOwnContributionIsCombinedNotCopied) {
  const CommLayout l = CommLayout::Uniform(2, 1, 1);
  for (bool in_place : {false, true}) {
    for (RedOp red : {RedOp::kSum, RedOp::kAvg}) {
      Case c;
      c.algo = kAlgoRing;
      c.layout = l;
      c.count = 1 << 12;
      c.in_place = in_place;
      c.red = red;
      c.dtype = red == RedOp::kAvg ? DataType::kFloat32 : DataType::kInt32;
      c.chunk_bytes = 2048;
      const Outcome o = RunCase(c);  // checks every rank's result against the definition
      ASSERT_FALSE(HasFailure());
      // Each node reduces its half: count / 2 elements, 4 bytes each, once (no copy first).
      EXPECT_EQ(o.stats.local_bytes, 2 * (c.count / 2) * 4);
      for (int k = 0; k < l.nnodes; ++k) {
        const NodeSchedule ns = Project(o.schedule, l, ShapeOf(c), k);
        int combines = 0;
        for (const NodeStep& st : ns.steps) {
          EXPECT_NE(st.kind, NodeStep::Kind::kReduce);
          if (st.kind == NodeStep::Kind::kCopy) {
            EXPECT_EQ(st.src.offset, st.dst.offset);
          }
          if (st.kind != NodeStep::Kind::kCombine) continue;
          ++combines;
          EXPECT_EQ(st.src2.rank, k);
          EXPECT_EQ(st.src2.space, RankRef::Space::kSend);
          EXPECT_EQ(st.src2.offset, st.dst.offset);
          EXPECT_EQ(st.src.space, RankRef::Space::kScratch);
          EXPECT_TRUE(st.finalize);
        }
        EXPECT_EQ(combines, static_cast<int>(c.count / 2 * 4 / c.chunk_bytes)) << "node " << k;
      }
    }
  }
}

// The fusion itself, on hand-made schedules: only a copy whose one dependent is a reduce of the
// same bytes into the same place goes, and the indices of what follows are renumbered.
TEST(FuseCopiesIntoReduces, OnlyACopyWhoseOnlyDependentIsTheReduceGoes) {
  const auto make = [] {
    NodeSchedule ns;
    NodeStep recv = Step(NodeStep::Kind::kRecv, 1, 0);
    recv.dst = {0, RankRef::Space::kScratch, 0};
    NodeStep copy = Step(NodeStep::Kind::kCopy, -1, 0);
    copy.src = {0, RankRef::Space::kSend, 8};
    copy.dst = {0, RankRef::Space::kRecv, 8};
    NodeStep reduce = Step(NodeStep::Kind::kReduce, -1, 0, {1, 0});
    reduce.src = recv.dst;
    reduce.dst = copy.dst;
    NodeStep send = Step(NodeStep::Kind::kSend, 1, 0, {2});
    send.src = copy.dst;
    ns.steps = {recv, copy, reduce, send};
    return ns;
  };
  NodeSchedule ns = make();
  EXPECT_EQ(FuseCopiesIntoReduces(ns), 1u);
  ASSERT_EQ(ns.steps.size(), 3u);
  EXPECT_EQ(ns.steps[0].kind, NodeStep::Kind::kRecv);
  EXPECT_EQ(ns.steps[1].kind, NodeStep::Kind::kCombine);
  EXPECT_EQ(ns.steps[1].src2.space, RankRef::Space::kSend);
  EXPECT_EQ(ns.steps[1].src2.offset, 8u);
  EXPECT_EQ(ns.steps[1].src.space, RankRef::Space::kScratch);
  EXPECT_THAT(ns.steps[1].deps, ::testing::ElementsAre(0u));
  EXPECT_EQ(ns.steps[2].kind, NodeStep::Kind::kSend);
  EXPECT_THAT(ns.steps[2].deps, ::testing::ElementsAre(1u));

  // The copy's deps move to the combine, in the copy's place.
  ns = make();
  ns.steps.insert(ns.steps.begin(), Step(NodeStep::Kind::kRecv, 1, 1));
  ns.steps[0].dst = {0, RankRef::Space::kScratch, 64};
  for (size_t i = 1; i < ns.steps.size(); ++i) {
    for (uint32_t& d : ns.steps[i].deps) ++d;
  }
  ns.steps[2].deps = {0};  // the copy waits for step 0
  EXPECT_EQ(FuseCopiesIntoReduces(ns), 1u);
  ASSERT_EQ(ns.steps.size(), 4u);
  EXPECT_THAT(ns.steps[2].deps, ::testing::ElementsAre(0u, 1u));
  EXPECT_THAT(ns.steps[3].deps, ::testing::ElementsAre(2u));

  // Left alone: the copy has another dependent (it reads what the copy wrote before the
  // reduce), the copy divides (avg), it moves other bytes, or writes elsewhere.
  std::vector<std::function<void(NodeSchedule&)>> spoil = {
      [](NodeSchedule& s) {
        NodeStep peek = Step(NodeStep::Kind::kSend, 1, 1, {1});
        peek.src = s.steps[1].dst;
        s.steps.push_back(peek);
      },
      [](NodeSchedule& s) { s.steps[1].finalize = true; },
      [](NodeSchedule& s) { s.steps[1].bytes = 8; },
      [](NodeSchedule& s) { s.steps[1].dst.offset = 12; },
      [](NodeSchedule& s) {
        s.steps[1].src.offset = 6;
        s.steps[1].src.space = RankRef::Space::kRecv;
      },
  };
  for (size_t i = 0; i < spoil.size(); ++i) {
    ns = make();
    spoil[i](ns);
    const size_t steps = ns.steps.size();
    EXPECT_EQ(FuseCopiesIntoReduces(ns), 0u) << "case " << i;
    EXPECT_EQ(ns.steps.size(), steps) << "case " << i;
    EXPECT_EQ(ns.steps[2].kind, NodeStep::Kind::kReduce) << "case " << i;
  }
}

TEST(SymbolicExecutor, DetectsDeadlockRacesAndStrays) {
  const CommLayout l = CommLayout::Uniform(2, 1, 1);
  OpShape s;
  s.op = OpKind::kAllReduce;
  s.dtype = DataType::kInt32;
  s.count = 1;
  const auto run = [&](const std::vector<NodeSchedule>& nodes) {
    SimMemory mem = SimMemory::ForOp(s, 2, false, std::byte{0});
    return RunSymbolic(nodes, l, s, &mem).status();
  };
  NodeSchedule a, b;
  a.node = 0;
  b.node = 1;
  NodeStep send0 = Step(NodeStep::Kind::kSend, 1, 0), recv0 = Step(NodeStep::Kind::kRecv, 1, 0);
  send0.src = {0, RankRef::Space::kSend, 0};
  recv0.dst = {0, RankRef::Space::kRecv, 0};
  NodeStep send1 = send0, recv1 = recv0;
  send1.peer = recv1.peer = 0;
  send1.src.rank = recv1.dst.rank = 1;
  // Each node receives before it sends: a deadlock.
  a.steps = {recv0, send0};
  a.steps[1].deps = {0};
  b.steps = {recv1, send1};
  b.steps[1].deps = {0};
  EXPECT_THAT(run({a, b}).message(), HasSubstr("deadlock"));
  // Without the deps it runs.
  a.steps[1].deps.clear();
  b.steps[1].deps.clear();
  EXPECT_TRUE(run({a, b}).ok());
  // A send without its recv.
  b.steps.pop_back();
  b.steps.pop_back();
  a.steps.pop_back();
  EXPECT_THAT(run({a, b}).message(), HasSubstr("deadlock"));
  a.steps = {send0};
  EXPECT_THAT(run({a, b}).message(), HasSubstr("without a matching recv"));
  // Two unordered writes of the same bytes: a race. Ordered: fine.
  NodeStep copy = Step(NodeStep::Kind::kCopy, -1, 0);
  copy.src = {0, RankRef::Space::kSend, 0};
  copy.dst = {0, RankRef::Space::kRecv, 0};
  a.steps = {copy, copy};
  b.steps.clear();
  EXPECT_THAT(run({a, b}).message(), HasSubstr("race"));
  a.steps[1].deps = {0};
  EXPECT_TRUE(run({a, b}).ok());
  // Out of bounds, and another node's rank.
  a.steps = {copy};
  a.steps[0].bytes = 8;
  EXPECT_THAT(run({a, b}).message(), HasSubstr("outside"));
  a.steps = {copy};
  a.steps[0].dst.rank = 1;
  EXPECT_THAT(run({a, b}).message(), HasSubstr("not one of its node"));
}

// ---------------------------------------------------------------------------------------------
// The worked example: 4 nodes x 2 ranks, 2 rails, AllReduce of 1 MiB (float32).

TEST(Example, FourNodesTwoRanksOneMiB) {
  const CommLayout l = CommLayout::Uniform(4, 2, 2);
  const uint64_t m = 1 << 20;
  for (const char* algo : {kAlgoRing, kAlgoTree, kAlgoRhd, kAlgoHier, kAlgoDirect}) {
    Case c;
    c.algo = algo;
    c.op = OpKind::kAllReduce;
    c.layout = l;
    c.count = m / 4;
    c.dtype = DataType::kFloat32;
    c.chunk_bytes = 64 * 1024;
    const Outcome o = RunCase(c);
    ASSERT_FALSE(HasFailure());
    std::string links;
    uint64_t inter = 0;
    for (const auto& [key, link] : o.stats.links) {
      absl::StrAppend(&links, " ", key.src_node, "->", key.dst_node, "/r", key.rail, ":",
                      link.bytes);
      inter += link.bytes;
    }
    std::string ranks;
    for (int r = 0; r < l.nranks; ++r) {
      absl::StrAppend(&ranks, " ", o.stats.rank_bytes_sent[r], "/", o.stats.rank_net_bytes_sent[r]);
    }
    std::printf("%-6s inter-node %8llu B, cross-rail %8llu B; links (src->dst/rail:bytes)%s\n",
                algo, static_cast<unsigned long long>(inter),
                static_cast<unsigned long long>(o.stats.cross_rail_bytes), links.c_str());
    std::printf("       per rank sent total/inter-node:%s\n", ranks.c_str());
    if (std::string(algo) == kAlgoHier) {
      // M/G * 2(K-1)/K = 768 KiB per rank across nodes, all on the rank's own rail.
      for (int r = 0; r < l.nranks; ++r) EXPECT_EQ(o.stats.rank_net_bytes_sent[r], 786432u);
      EXPECT_EQ(o.stats.cross_rail_bytes, 0u);
    }
    if (std::string(algo) == kAlgoRing) {
      for (int r = 0; r < l.nranks; ++r) EXPECT_EQ(o.stats.rank_bytes_sent[r], 2 * 7 * m / 8);
    }
  }
}

}  // namespace
}  // namespace railyard::scheduler

namespace railyard::scheduler {
namespace {

TEST(CommLayout, FewerRanksThanRailsStripeOverTheRanksRails) {
  const CommLayout one = CommLayout::Uniform(4, 1, 2);
  EXPECT_EQ(one.rail_for(0, 0), 0);
  EXPECT_EQ(one.rail_for(0, 1), 1);
  EXPECT_EQ(one.rail_for(0, 2), 0);
  EXPECT_TRUE(one.rail_serves(3, 0));
  EXPECT_TRUE(one.rail_serves(3, 1));
  const CommLayout two = CommLayout::Uniform(2, 2, 4);  // local 0: rails 0, 2; local 1: 1, 3
  EXPECT_EQ(two.rail_for(0, 0), 0);
  EXPECT_EQ(two.rail_for(0, 1), 2);
  EXPECT_EQ(two.rail_for(1, 0), 1);
  EXPECT_EQ(two.rail_for(1, 1), 3);
  EXPECT_EQ(two.rail_for(1, 2), 1);
  EXPECT_TRUE(two.rail_serves(2, 2));
  EXPECT_FALSE(two.rail_serves(2, 1));
  const CommLayout three = CommLayout::Uniform(2, 2, 3);  // local 0: 0, 2; local 1: 1
  EXPECT_EQ(three.rail_for(1, 5), 1);
  EXPECT_EQ(three.rail_for(0, 5), 2);
  // As many ranks as rails, or more: each keeps its own rail whatever the stripe.
  const CommLayout full = CommLayout::Uniform(2, 4, 2);
  for (uint64_t s = 0; s < 4; ++s) EXPECT_EQ(full.rail_for(3, s), 1);
  EXPECT_FALSE(full.rail_serves(3, 0));
}

// One rank per node on two rails: a ring AllReduce's inter-node bytes split evenly over both
// rails on every link, sender and receiver agree on each chunk's rail (the symbolic executor
// checks every message's rail), nothing crosses rails, and the result is exact.
TEST(Example, OneRankPerNodeUsesEveryRail) {
  for (int rails : {2, 3}) {
    SCOPED_TRACE(rails);
    Case c;
    c.algo = kAlgoRing;
    c.op = OpKind::kAllReduce;
    c.layout = CommLayout::Uniform(4, 1, rails);
    c.count = (6 << 20) / 4;
    c.dtype = DataType::kFloat32;
    c.chunk_bytes = 64 * 1024;
    const Outcome o = RunCase(c);
    ASSERT_FALSE(HasFailure());
    EXPECT_EQ(o.stats.cross_rail_bytes, 0u);
    std::map<int, uint64_t> by_rail;
    for (const auto& [key, link] : o.stats.links) by_rail[key.rail] += link.bytes;
    ASSERT_EQ(by_rail.size(), static_cast<size_t>(rails));
    const uint64_t total = 2 * 3 * (6ull << 20);  // 4 ranks x 2(K-1)/K M
    uint64_t sum = 0;
    for (const auto& [rail, bytes] : by_rail) {
      sum += bytes;
      EXPECT_NEAR(static_cast<double>(bytes), static_cast<double>(total) / rails, 0.02 * total)
          << "rail " << rail;
    }
    EXPECT_EQ(sum, total);
  }
}

}  // namespace
}  // namespace railyard::scheduler
