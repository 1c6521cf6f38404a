// What a rank asks of a collective, in the scheduler's terms: no gRPC, no sessions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/kernels/codec.h"
#include "daemon/kernels/types.h"

namespace railyard::scheduler {

enum class OpKind : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAllToAll,
  kAllToAllv,
  kSend,
  kRecv,
  kBarrier,
};

absl::string_view OpName(OpKind op);
// The inverse of OpName; also accepts "all_reduce"/"all-reduce" style and any case. False when
// the name is unknown.
bool ParseOpName(absl::string_view name, OpKind* op);
bool IsPointToPoint(OpKind op);
// True for ops whose result combines elements with a RedOp.
bool IsReduction(OpKind op);
// True when `root` names a rank that must be in range (Broadcast, Reduce, Send, Recv peer).
bool HasRoot(OpKind op);

// The message size M of an operation, as PRIMER's cost models and nccl-tests' algbw count it:
// count x element size, times nranks for ReduceScatter, AllGather and AllToAll (the whole
// gathered or scattered buffer); AllToAllv: the mean per rank of its count matrix (a2av_counts,
// nranks x nranks; 0 without it); Barrier: 0. The one definition the metrics, the tuner, the
// simulator and railctl use.
double MessageBytes(OpKind op, kernels::DataType dtype, uint64_t count, int nranks,
                    const std::vector<uint64_t>* a2av_counts = nullptr);
// The inverse: the per-rank count of a message of `bytes` (floor, at least 1 element when
// bytes > 0; 0 for Barrier).
uint64_t CountForMessageBytes(OpKind op, kernels::DataType dtype, double bytes, int nranks);

// One rank's request with its buffers already resolved to daemon addresses.
struct RankRequest {
  OpKind op = OpKind::kBarrier;
  kernels::DataType dtype = kernels::DataType::kFloat32;
  kernels::RedOp red_op = kernels::RedOp::kSum;
  uint64_t count = 0;  // elements, NCCL semantics (docs/local-api.md)
  int root = 0;        // root for Broadcast/Reduce, peer for Send/Recv
  std::string algo;    // forced algorithm, empty = daemon's choice
  // Compression of the inter-node steps (docs/compression.md): the codec (none: exact), or
  // codec_auto: the tuner's choice. error_feedback: a residual per (communicator, feedback_key).
  kernels::Codec codec;
  bool codec_auto = false;
  bool error_feedback = false;
  uint64_t feedback_key = 0;
  std::byte* send = nullptr;
  std::byte* recv = nullptr;
  // The CUDA device send and recv are memory of; -1: host memory (the daemon may read them).
  int device = -1;
  // AllToAllv only: elements per peer rank.
  std::vector<uint64_t> send_counts, send_displs, recv_counts, recv_displs;
};

// Byte extents a rank's send and recv regions must have for its request.
struct Extents {
  uint64_t send_bytes = 0;
  uint64_t recv_bytes = 0;
  bool needs_send = false;
  bool needs_recv = false;
};

// Checks a request's own shape (root/peer in range, alltoallv vectors of nranks entries, sizes
// that do not overflow) and computes the regions it touches. INVALID_ARGUMENT says what is wrong.
absl::StatusOr<Extents> ComputeExtents(const RankRequest& req, int rank, int nranks);

// Where RankRequest::device says a buffer is, for messages: "host memory" or "memory of device 2".
std::string MemoryName(int device);

}  // namespace railyard::scheduler

namespace railyard::scheduler {

// A rank's send and recv regions must either be the op's in-place layout (docs/local-api.md) or
// not overlap at all. INVALID_ARGUMENT otherwise.
absl::Status CheckInPlaceLayout(const RankRequest& req, int rank, const Extents& extents);

// True when the request is in place (send and recv are the op's in-place layout).
bool IsInPlace(const RankRequest& req, int rank);

}  // namespace railyard::scheduler
