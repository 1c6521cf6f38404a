#include "daemon/scheduler/algorithms/algorithms.h"

#include "absl/strings/str_join.h"
#include "daemon/scheduler/algorithms/direct.h"
#include "daemon/scheduler/algorithms/hier.h"
#include "daemon/scheduler/algorithms/rhd.h"
#include "daemon/scheduler/algorithms/ring.h"
#include "daemon/scheduler/algorithms/torus.h"
#include "daemon/scheduler/algorithms/tree.h"

namespace railyard::scheduler::algorithms {
namespace {

constexpr uint32_t kAllGather = OpBit(OpKind::kAllGather);
constexpr uint32_t kAllReduce = OpBit(OpKind::kAllReduce);
constexpr uint32_t kAllToAll = OpBit(OpKind::kAllToAll) | OpBit(OpKind::kAllToAllv);
constexpr uint32_t kBarrier = OpBit(OpKind::kBarrier);
constexpr uint32_t kBroadcast = OpBit(OpKind::kBroadcast);
constexpr uint32_t kReduce = OpBit(OpKind::kReduce);
constexpr uint32_t kReduceScatter = OpBit(OpKind::kReduceScatter);

}  // namespace

const std::vector<AlgorithmInfo>& AlgorithmTable() {
  static const auto* table = new std::vector<AlgorithmInfo>{
      {kAlgoRing,
       "ring in rank order, chunked and pipelined: allreduce = reducescatter + allgather; "
       "broadcast/reduce as a pipelined chain; barrier as a token ring over the nodes",
       kAllReduce | kReduceScatter | kAllGather | kBroadcast | kReduce | kBarrier, &GenerateRing},
      {kAlgoTree,
       "double binary tree allreduce (two complementary trees, half the data each); pipelined "
       "binary tree broadcast/reduce; barrier up and down a tree of nodes",
       kAllReduce | kBroadcast | kReduce | kBarrier, &GenerateTree},
      {kAlgoRhd,
       "recursive halving-doubling allreduce, non-powers of two folded into a neighbour first; "
       "dissemination barrier over the nodes",
       kAllReduce | kBarrier, &GenerateRhd},
      {kAlgoRd,
       "recursive doubling allreduce for short messages (partners swap whole partial sums: "
       "half rhd's message steps), non-powers of two folded into a neighbour first",
       kAllReduce, &GenerateRd},
      {kAlgoDirect,
       "every rank talks to every rank: pairwise alltoall(v), reduce-to-owner + copy-to-all for "
       "the others; all-pairs barrier over the nodes",
       kAllReduce | kReduceScatter | kAllGather | kBroadcast | kReduce | kAllToAll | kBarrier,
       &GenerateDirect},
      {kAlgoHier,
       "hierarchical rail-aligned: intra-node phase, inter-node ring of each shard among the "
       "ranks of one local index (one rail each), intra-node phase; alltoall(v) aggregated per "
       "destination node; uniform layouts only",
       kAllReduce | kReduceScatter | kAllGather | kBroadcast | kReduce | kAllToAll | kBarrier,
       &GenerateHier},
      {kAlgoTorus,
       "dimension-ordered rings on a torus (one rank per node, layout.torus_dims): reducescatter "
       "along each dimension in turn, allgather back in reverse order",
       kAllReduce | kReduceScatter | kAllGather, &GenerateTorus},
  };
  return *table;
}

const AlgorithmInfo* FindAlgorithm(absl::string_view name) {
  for (const AlgorithmInfo& a : AlgorithmTable()) {
    if (name == a.name) return &a;
  }
  return nullptr;
}

bool IsAlgorithmName(absl::string_view name) {
  return name == kAlgoLocal || FindAlgorithm(name) != nullptr;
}

std::string AlgorithmNames() {
  std::vector<std::string> names = {kAlgoLocal};
  for (const AlgorithmInfo& a : AlgorithmTable()) names.emplace_back(a.name);
  return absl::StrJoin(names, "|");
}

std::string AlgorithmsFor(OpKind op) {
  std::vector<std::string> names;
  for (const AlgorithmInfo& a : AlgorithmTable()) {
    if (Implements(a, op)) names.emplace_back(a.name);
  }
  return absl::StrJoin(names, ", ");
}

}  // namespace railyard::scheduler::algorithms
