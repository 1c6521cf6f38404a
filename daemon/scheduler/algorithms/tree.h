// Tree algorithms: double binary tree AllReduce, pipelined binary tree Broadcast/Reduce, and the
// tree primitives (positions 0..n-1; the caller maps positions to ranks through its RankRefs).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "daemon/scheduler/algorithms/builder.h"
#include "daemon/scheduler/algorithms/ring.h"

namespace railyard::scheduler::algorithms {

struct Tree {
  int root = 0;
  std::vector<int> parent;                 // -1 for the root
  std::vector<std::vector<int>> children;  // at most two each
};

// In-order binary tree over positions 0..n-1 (NCCL's btree): position x-1 with lowest set bit b
// of x has children x-1 -/+ b/2 (the right one pulled left when past n); the root is the highest
// power of two <= n, minus one. Leaves are exactly the even positions; depth <= log2(n) + 1.
Tree InOrderTree(int n);
// Rank at `pos` in the second tree of the double binary tree (the first has rank == position):
// mirrored for even n, shifted by one for odd n, so that no rank is interior in both trees.
int SecondTreeRankAt(int pos, int n);

// Pipelined reduction up the tree: every in(p) reduced into acc(t.root). Interior members
// accumulate into acc(p) (may be in(p)); leaves send in(p) as is.
void TreeReduce(ScheduleBuilder& b, const Tree& t, uint64_t elems, const MemberRefFn& in,
                const MemberRefFn& acc, bool finalize);
// Pipelined broadcast down the tree: src (the root's data) ends in out(p) on every member.
void TreeBroadcast(ScheduleBuilder& b, const Tree& t, uint64_t elems, const RankRef& src,
                   const MemberRefFn& out);

absl::Status GenerateTree(ScheduleBuilder& b);

}  // namespace railyard::scheduler::algorithms
