// The symbolic executor: runs every node's NodeSchedule of one operation in one process, over
// simulated per-rank memory, with the real reduction kernels. Sends and receives are matched by
// (sender node, receiver node, tag); a step runs once its deps are done (and, for a receive, its
// message was sent). It checks what a real run could only get wrong by chance:
//  - deadlock (steps that can never run), unmatched or duplicate tags, size or rail mismatches;
//  - steps touching memory out of their region, of another node's rank, or partially
//    overlapping their own source;
//  - data races: two steps accessing overlapping bytes (one of them writing) with neither
//    ordered before the other by deps and send->recv matching (the order a real executor may
//    pick differently);
// and counts the bytes on every inter-node link and of every rank. Unit tests use it to check
// generators against the collectives' definitions; the simulator replays schedules with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/kernels/codec.h"
#include "daemon/scheduler/schedule.h"

namespace railyard::scheduler {

struct SimRankMemory {
  std::vector<std::byte> user;  // holds the send and recv regions (aliased when in place)
  uint64_t send_offset = 0, send_bytes = 0;
  uint64_t recv_offset = 0, recv_bytes = 0;
  std::vector<std::byte> scratch;  // sized and filled by RunSymbolic
};

struct SimMemory {
  std::vector<SimRankMemory> ranks;

  // Regions of docs/local-api.md for `shape` on nranks ranks: in the op's in-place layout when
  // in_place, else disjoint (send first). A region the rank does not need (Broadcast send of a
  // non-root, Reduce recv of a non-root) is empty. Every byte is set to `fill`.
  static SimMemory ForOp(const OpShape& shape, int nranks, bool in_place, std::byte fill);
  std::byte* send(int rank) { return ranks[rank].user.data() + ranks[rank].send_offset; }
  std::byte* recv(int rank) { return ranks[rank].user.data() + ranks[rank].recv_offset; }
};

struct LinkKey {
  int src_node = 0;
  int dst_node = 0;
  int rail = 0;
  bool operator<(const LinkKey& o) const {
    return std::tie(src_node, dst_node, rail) < std::tie(o.src_node, o.dst_node, o.rail);
  }
  bool operator==(const LinkKey& o) const {
    return src_node == o.src_node && dst_node == o.dst_node && rail == o.rail;
  }
};

struct LinkStats {
  uint64_t bytes = 0;
  uint64_t messages = 0;
};

struct SimStats {
  std::map<LinkKey, LinkStats> links;             // inter-node links only
  std::vector<uint64_t> rank_bytes_sent;          // to other ranks, same node or not
  std::vector<uint64_t> rank_net_bytes_sent;      // to ranks of other nodes
  std::vector<uint64_t> rank_net_bytes_received;  // from ranks of other nodes
  // Inter-node bytes whose receiving rank sits on another rail than the one they travelled on.
  uint64_t cross_rail_bytes = 0;
  uint64_t local_bytes = 0;  // bytes moved by memory steps (copies and reductions)
  uint64_t steps = 0;
  bool races_checked = false;
  // reached[a][b]: some step of node b happens before some step of node a, so node a cannot
  // finish before node b has started (what a barrier needs for every pair).
  std::vector<std::vector<bool>> reached;
};

struct SimOptions {
  bool check_races = true;
  // The race check keeps steps^2 bits; above this many steps it is skipped (races_checked false).
  uint64_t max_race_steps = 40000;
  // Compressed schedules (compressed.h): the codec of their encode and decode steps, and per node
  // the error-feedback residual (residual_elems floats, zeroed when missing); null: no feedback.
  kernels::Codec codec;
  std::vector<std::vector<float>>* residuals = nullptr;
};

// Runs nodes[k] (the NodeSchedule of node k, for every node of layout) over memory. scratch is
// (re)allocated per rank from its node's scratch_bytes_per_rank and filled with garbage.
// INTERNAL with a description of the first problem found (see above).
absl::StatusOr<SimStats> RunSymbolic(const std::vector<NodeSchedule>& nodes,
                                     const CommLayout& layout, const OpShape& shape,
                                     SimMemory* memory, const SimOptions& options = {});
// Checks the schedule's contract (CheckRankSchedule), projects it onto every node and runs it.
absl::StatusOr<SimStats> RunSymbolic(const RankSchedule& schedule, const CommLayout& layout,
                                     const OpShape& shape, SimMemory* memory,
                                     const SimOptions& options = {});

// The RankSchedule contract of schedule.h: ranks in range, deps pointing backwards and each
// involving the source or destination node of its dependent. INTERNAL naming the transfer.
absl::Status CheckRankSchedule(const RankSchedule& schedule, const CommLayout& layout);

}  // namespace railyard::scheduler
