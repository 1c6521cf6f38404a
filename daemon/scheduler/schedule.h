// The schedule IR: what every rank of a communicator does for one collective, as transfers
// between ranks with explicit dependencies, and its projection onto the daemons (nodes) that
// execute it.
//
// An algorithm is a generator: from (op shape, comm layout, chunk size) it emits the same
// RankSchedule on every daemon (pure function of its inputs, no I/O). Project() then cuts it into
// one NodeSchedule per daemon: a transfer between two ranks of the same node becomes a memory
// step; a transfer between nodes becomes a Send on the source daemon (on the source rank's rail)
// and a Recv (plus a Reduce when the transfer reduces) on the destination daemon. The executor
// runs any NodeSchedule; algorithms never touch sockets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "daemon/kernels/types.h"
#include "daemon/scheduler/op.h"

namespace railyard::scheduler {

// Which ranks live where. Node order and local indices are fixed by the coordinator at
// communicator bootstrap and are the same on every daemon.
struct CommLayout {
  int nranks = 0;
  int nnodes = 0;
  int rails = 1;                                // NICs per node (the minimum over the nodes)
  std::vector<int> node_of_rank;                // global rank -> node index
  std::vector<int> local_index_of_rank;         // global rank -> index among its node's ranks
  std::vector<std::vector<int>> ranks_of_node;  // node -> global ranks by local index
  // Torus fabrics: dimension sizes (rank r at x = r % X, y = (r / X) % Y, ...); empty when the
  // communicator does not sit on a torus. The "torus" algorithm needs it.
  std::vector<int> torus_dims;

  // G for uniform layouts; 0 when nodes hold different numbers of ranks.
  int ranks_per_node() const;
  // Rail a rank sends and receives on: its local index modulo rails (rail alignment).
  int rail_of_rank(int rank) const;
  // The rail of the stripe-th inter-node transfer of a stream from `rank` (Project counts them
  // per source and destination rank, so both ends agree). A node with at least as many ranks as
  // rails keeps each rank on its own rail (rail_of_rank); one with fewer gives each rank every
  // rail r with r mod G = its local index, in turn: one rank per node uses all of them (as NCCL
  // spreads a GPU's channels over the NICs it reaches).
  int rail_for(int rank, uint64_t stripe) const;
  // Whether rail_for can give `rank` this rail (a transfer into it on another rail crosses rails).
  bool rail_serves(int rank, int rail) const;
  // K nodes x G ranks, rank r on node r / G (the layout tests and the simulator use).
  static CommLayout Uniform(int nnodes, int ranks_per_node, int rails);
  // Any layout: rank r on node node_of_rank[r], local indices in rank order within a node.
  static CommLayout FromNodeOfRank(const std::vector<int>& node_of_rank, int rails);
};

// The collective, identical on every rank (after the merge), plus AllToAllv's count matrix.
struct OpShape {
  OpKind op = OpKind::kAllReduce;
  kernels::DataType dtype = kernels::DataType::kFloat32;
  kernels::RedOp red_op = kernels::RedOp::kSum;
  uint64_t count = 0;  // NCCL semantics, docs/local-api.md
  int root = 0;
  // AllToAllv only: counts[i * nranks + j] elements from rank i to rank j, and each rank's
  // send/recv displacements (elements) in the same layout: send_displs[i * nranks + j] is where
  // rank i's block for j starts in its send region, recv_displs[j * nranks + i] where rank j puts
  // the block it receives from i (row = the rank whose buffer it is).
  std::vector<uint64_t> a2av_counts;
  std::vector<uint64_t> a2av_send_displs;
  std::vector<uint64_t> a2av_recv_displs;
};

// A byte range of one rank's memory: its send region, its recv region, or scratch the daemon
// provides for that rank (Schedule::scratch_bytes_per_rank of it).
struct RankRef {
  enum class Space : uint8_t { kSend, kRecv, kScratch };
  int rank = 0;
  Space space = Space::kSend;
  uint64_t offset = 0;  // bytes
  // The same first byte of the same rank's memory.
  friend bool operator==(const RankRef&, const RankRef&) = default;
};

// A step's dependencies. Most transfers have one to four (a chunk's previous step, the last
// writer and readers of its destination): inline, so a 17M-transfer schedule (hier at 1024 x 8)
// makes no heap allocation per transfer. Four fit in the 24 bytes a std::vector would take.
using Deps = absl::InlinedVector<uint32_t, 4>;

// One step of the rank-level schedule.
struct Transfer {
  enum class Kind : uint8_t {
    kCopy,    // dst <- src (bytes)
    kReduce,  // dst <- dst (op) src, elementwise (bytes / element size elements)
  };
  Kind kind = Kind::kCopy;
  RankRef src;
  RankRef dst;
  uint64_t bytes = 0;
  // For RedOp::kAvg: this reduction produces a final value; divide by nranks when storing.
  // A kCopy with finalize divides while copying (for ranks whose value is final on arrival).
  bool finalize = false;
  // Transfers (indices into RankSchedule::transfers) that must complete first.
  Deps deps;
};

// Contract every generator keeps (checked by CheckRankSchedule in symbolic_executor.h):
//  - transfers are in a valid sequential order: every dep is an earlier index;
//  - every dep of a transfer involves (as source or destination rank) a rank on the node of the
//    transfer's source or destination rank, so Project can enforce it locally;
//  - the schedule is right whether or not each rank's send and recv alias in the op's in-place
//    layout (docs/local-api.md): deps order every write of a recv byte after the reads of the
//    send byte it may alias, and data that would be overwritten is staged in scratch first.
//  - Transfers between two ranks of one node, and a rank's copies onto itself, are memory steps.
struct RankSchedule {
  std::string algorithm;
  std::vector<Transfer> transfers;
  uint64_t scratch_bytes_per_rank = 0;
};

// One daemon's share of a RankSchedule.
struct NodeStep {
  enum class Kind : uint8_t {
    kCopy,    // local: dst <- src
    kReduce,  // local: dst <- dst (op) src
    // local: dst <- src2 (op) src. A copy of src2 into dst fused with the reduce that followed
    // it (FuseCopiesIntoReduces): dst is written once instead of twice.
    kCombine,
    kSend,  // src bytes to node `peer` on `rail`, matched by (this node, peer, tag)
    kRecv,  // bytes from node `peer` on `rail` into dst
    // Compressed inter-node steps (compressed.h); `bytes` counts the float32 side, the wire side
    // is kernels::EncodedBytes(codec, bytes / 4).
    kEncode,     // local: dst (wire) <- C(src + residual), residual updated (error feedback)
    kDecode,     // local: dst <- D(src (wire)); a peer's bytes: checked
    kDecodeAdd,  // local: dst <- dst + D(src (wire)); checked
    // The float32 partial of float16/bfloat16 data; `bytes` counts the float32 side, the data
    // side is bytes / 4 elements of the operation's dtype.
    kWiden,     // local: dst (float32) <- src (dtype)
    kWidenAdd,  // local: dst (float32) <- dst + src (dtype)
    kNarrow,    // local: dst (dtype) <- src (float32), divided by nranks when finalize and avg
  };
  Kind kind = Kind::kCopy;
  RankRef src;   // kCopy, kReduce, kCombine, kSend
  RankRef dst;   // kCopy, kReduce, kCombine, kRecv
  RankRef src2;  // kCombine: the left operand
  uint64_t bytes = 0;
  bool finalize = false;
  int peer = -1;
  int rail = 0;
  uint64_t tag = 0;  // unique per (sender node, receiver node) within one operation
  Deps deps;         // indices into NodeSchedule::steps
  // kEncode: the first element of src in the operation's residual (the error-feedback state of
  // its key): every element is encoded by exactly one step of a node, so the residual holds one
  // float per element of the operation. kSend/kRecv of encoded data: the bytes of the
  // operation's dtype it stands for, what the exact path would carry (0 for uncompressed
  // messages).
  uint64_t aux = 0;
};

struct NodeSchedule {
  int node = 0;
  std::vector<NodeStep> steps;
  // The rank schedule's scratch plus this node's staging slots for inter-node reductions.
  uint64_t scratch_bytes_per_rank = 0;
  // Only the node's first rank (layout.ranks_of_node[node][0]) has scratch: the compressed
  // schedules keep one float32 partial per node, not per local rank.
  bool scratch_first_rank_only = false;
  // Compressed schedules (compressed.h): elements of the residual its kEncode steps index (0:
  // the schedule compresses nothing).
  uint64_t residual_elems = 0;
};

// Cuts a rank schedule into node `node`'s steps. Inter-node reductions receive into scratch
// staging slots placed after the rank schedule's scratch (NodeSchedule::scratch_bytes_per_rank
// covers both) and then reduce. Tags count the transfers of each (sender node, receiver node)
// pair in schedule order, so both sides derive the same tag without talking. The result has
// been through FuseCopiesIntoReduces.
NodeSchedule Project(const RankSchedule& schedule, const CommLayout& layout, const OpShape& shape,
                     int node);

// Replaces each local copy `dst <- x` whose only dependent is a reduce `dst <- dst (op) y` of the
// same bytes by one kCombine `dst <- x (op) y`, and drops the copy: a node's own contribution is
// then read once, where the reduction reads it anyway, instead of first being copied into place
// (half the data of a ring AllReduce across nodes). Safe because every step ordered after the
// copy is ordered after the reduce (the copy has no other dependent), so no step can read dst,
// or write x, in between; dst (op) y and x (op) y apply the operands in the same order, so
// results are bit for bit the same. Returns the number of copies fused.
size_t FuseCopiesIntoReduces(NodeSchedule& schedule);

// Algorithms. Names are what RAILYARD_ALGO and --algo take.
inline constexpr const char* kAlgoRing = "ring";
inline constexpr const char* kAlgoTree = "tree";  // double binary tree / pipelined tree
inline constexpr const char* kAlgoRhd = "rhd";    // recursive halving-doubling
inline constexpr const char* kAlgoRd = "rd";      // recursive doubling (short messages)
inline constexpr const char* kAlgoHier = "hier";  // hierarchical rail-aligned
inline constexpr const char* kAlgoDirect = "direct";
inline constexpr const char* kAlgoTorus = "torus";  // dimension-ordered rings on a torus
// Not a schedule: the one-node lowering to single-pass multi-input kernels (local_plan.h), which
// the tuner picks on one node and RAILYARD_ALGO=local forces there.
inline constexpr const char* kAlgoLocal = "local";

// Builds the rank schedule of `algo` for shape on layout, pipelined in chunks of chunk_bytes
// (0: unchunked). INVALID_ARGUMENT when the algorithm does not implement the op (e.g. rhd for
// AllToAll; the message lists the algorithms that do), for point-to-point ops, an unknown name,
// an inconsistent layout or shape, and hier on a non-uniform layout. The table of algorithms and
// what each implements: algorithms/algorithms.cc.
absl::StatusOr<RankSchedule> Generate(const std::string& algo, const OpShape& shape,
                                      const CommLayout& layout, size_t chunk_bytes);

// Which algorithm runs when none is forced is the cost model's call: cost::Tuner
// (daemon/scheduler/cost/tuner.h) predicts every candidate on the schedule IR.

}  // namespace railyard::scheduler
