#include "daemon/scheduler/op.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace railyard::scheduler {

absl::string_view OpName(OpKind op) {
  switch (op) {
    case OpKind::kAllReduce:
      return "allreduce";
    case OpKind::kReduceScatter:
      return "reducescatter";
    case OpKind::kAllGather:
      return "allgather";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kAllToAll:
      return "alltoall";
    case OpKind::kAllToAllv:
      return "alltoallv";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kBarrier:
      return "barrier";
  }
  return "unknown";
}

bool ParseOpName(absl::string_view name, OpKind* op) {
  std::string n;
  for (char c : name) {
    if (c == '_' || c == '-') continue;
    n.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  for (OpKind k : {OpKind::kAllReduce, OpKind::kReduceScatter, OpKind::kAllGather,
                   OpKind::kBroadcast, OpKind::kReduce, OpKind::kAllToAll, OpKind::kAllToAllv,
                   OpKind::kSend, OpKind::kRecv, OpKind::kBarrier}) {
    if (n == OpName(k)) {
      *op = k;
      return true;
    }
  }
  return false;
}

bool IsPointToPoint(OpKind op) { return op == OpKind::kSend || op == OpKind::kRecv; }

bool IsReduction(OpKind op) {
  return op == OpKind::kAllReduce || op == OpKind::kReduceScatter || op == OpKind::kReduce;
}

bool HasRoot(OpKind op) {
  return op == OpKind::kBroadcast || op == OpKind::kReduce || IsPointToPoint(op);
}

namespace {
bool WholeBuffer(OpKind op) {
  return op == OpKind::kReduceScatter || op == OpKind::kAllGather || op == OpKind::kAllToAll;
}
}  // namespace

double MessageBytes(OpKind op, kernels::DataType dtype, uint64_t count, int nranks,
                    const std::vector<uint64_t>* a2av_counts) {
  const double esize = static_cast<double>(kernels::ElementSize(dtype));
  const int n = std::max(1, nranks);
  switch (op) {
    case OpKind::kBarrier:
      return 0;
    case OpKind::kAllToAllv: {
      if (a2av_counts == nullptr) return 0;
      double elems = 0;
      for (uint64_t c : *a2av_counts) elems += static_cast<double>(c);
      return elems * esize / n;
    }
    default:
      return static_cast<double>(count) * esize * (WholeBuffer(op) ? n : 1);
  }
}

uint64_t CountForMessageBytes(OpKind op, kernels::DataType dtype, double bytes, int nranks) {
  if (op == OpKind::kBarrier) return 0;
  double elems = std::floor(bytes / static_cast<double>(kernels::ElementSize(dtype)));
  if (WholeBuffer(op)) elems = std::floor(elems / std::max(1, nranks));
  if (bytes > 0 && elems < 1) elems = 1;
  return static_cast<uint64_t>(elems);
}

namespace {

// Largest operation we accept, in bytes: keeps every offset and size the scheduler derives from a
// request (count x nranks x element size, displacement + count, sums of blocks) far from 2^64.
constexpr uint64_t kMaxBytes = uint64_t{1} << 48;

// count x multiple x esize in *bytes, or INVALID_ARGUMENT naming `field` and saying by how much
// it passes the limit (or that it overflows 64 bits).
absl::Status CheckBytes(const char* field, uint64_t count, uint64_t multiple, size_t esize,
                        uint64_t* bytes) {
  uint64_t elems = 0;
  uint64_t b = 0;
  const std::string what =
      multiple == 1
          ? absl::StrCat(field, " ", count, " x ", esize, "-byte elements")
          : absl::StrCat(field, " ", count, " x ", multiple, " ranks x ", esize, "-byte elements");
  if (__builtin_mul_overflow(count, multiple, &elems) ||
      __builtin_mul_overflow(elems, uint64_t{esize}, &b)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " overflows 64 bits (the 2^48-byte limit of one operation)"));
  }
  if (b > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " = ", b,
                                                   " bytes exceeds the 2^48-byte limit of one "
                                                   "operation by ",
                                                   b - kMaxBytes, " bytes"));
  }
  *bytes = b;
  return absl::OkStatus();
}

// Bytes spanned by per-peer blocks (counts[i] elements at displs[i]). Every block's end
// (displacement + count, in bytes) and the sum of the counts must stay within kMaxBytes;
// non-empty blocks of the receive side must not overlap (several peers would write the same
// elements, and the daemon would stage more than the buffer holds).
absl::Status SpanOfBlocks(const std::vector<uint64_t>& counts, const std::vector<uint64_t>& displs,
                          int nranks, size_t esize, const char* what, bool disjoint,
                          uint64_t* bytes) {
  if (counts.size() != static_cast<size_t>(nranks) ||
      displs.size() != static_cast<size_t>(nranks)) {
    return absl::InvalidArgumentError(absl::StrCat(what, "_counts and ", what, "_displs need ",
                                                   nranks, " entries (one per rank), got ",
                                                   counts.size(), " and ", displs.size()));
  }
  uint64_t end = 0;
  uint64_t total = 0;  // elements, all blocks
  for (int i = 0; i < nranks; ++i) {
    uint64_t elems = 0;
    uint64_t block_end = 0;
    if (__builtin_add_overflow(displs[i], counts[i], &elems) ||
        __builtin_mul_overflow(elems, uint64_t{esize}, &block_end)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " block for rank ", i, ": ", what, "_displs[", i, "] ", displs[i],
                       " + ", what, "_counts[", i, "] ", counts[i], " elements of ", esize,
                       " bytes overflows 64 bits (the 2^48-byte limit of one operation)"));
    }
    if (block_end > kMaxBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " block for rank ", i, ": ", what, "_displs[", i, "] ", displs[i], " + ", what,
          "_counts[", i, "] ", counts[i], " elements of ", esize, " bytes ends at byte ", block_end,
          ", past the 2^48-byte limit of one operation by ", block_end - kMaxBytes, " bytes"));
    }
    uint64_t total_bytes = 0;
    if (__builtin_add_overflow(total, counts[i], &total) ||
        __builtin_mul_overflow(total, uint64_t{esize}, &total_bytes) || total_bytes > kMaxBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, "_counts[0..", i, "] sum to more than the 2^48-byte limit of one operation (",
          esize, "-byte elements)"));
    }
    if (counts[i] > 0) end = std::max(end, block_end);
  }
  if (disjoint) {
    std::vector<std::pair<uint64_t, int>> blocks;  // (displacement, rank), non-empty ones
    for (int i = 0; i < nranks; ++i) {
      if (counts[i] > 0) blocks.emplace_back(displs[i], i);
    }
    std::sort(blocks.begin(), blocks.end());
    for (size_t k = 1; k < blocks.size(); ++k) {
      const int a = blocks[k - 1].second;
      const int b = blocks[k].second;
      if (displs[a] + counts[a] > displs[b]) {  // both within kMaxBytes: no overflow
        return absl::InvalidArgumentError(absl::StrCat(
            what, " blocks overlap: the block for rank ", a, " (", what, "_displs[", a, "] ",
            displs[a], ", ", counts[a], " elements) and the block for rank ", b, " (", what,
            "_displs[", b, "] ", displs[b], ", ", counts[b], " elements) share ",
            std::min(displs[a] + counts[a], displs[b] + counts[b]) - displs[b], " elements"));
      }
    }
  }
  *bytes = end;
  return absl::OkStatus();
}

}  // namespace

std::string MemoryName(int device) {
  return device < 0 ? std::string("host memory") : absl::StrCat("memory of device ", device);
}

absl::StatusOr<Extents> ComputeExtents(const RankRequest& req, int rank, int nranks) {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " not in [0, ", nranks, ")"));
  }
  if (HasRoot(req.op) && (req.root < 0 || req.root >= nranks)) {
    return absl::InvalidArgumentError(absl::StrCat(IsPointToPoint(req.op) ? "peer " : "root ",
                                                   req.root, " not in [0, ", nranks, ")"));
  }
  if (IsPointToPoint(req.op) && req.root == rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpName(req.op), " to itself (peer ", rank, ") is not allowed"));
  }
  const size_t esize = kernels::ElementSize(req.dtype);
  const uint64_t n = static_cast<uint64_t>(nranks);
  Extents e;
  switch (req.op) {
    case OpKind::kAllReduce:
      if (auto s = CheckBytes("count", req.count, 1, esize, &e.send_bytes); !s.ok()) return s;
      e.recv_bytes = e.send_bytes;
      e.needs_send = e.needs_recv = true;
      break;
    case OpKind::kReduceScatter:
      if (auto s = CheckBytes("count", req.count, n, esize, &e.send_bytes); !s.ok()) return s;
      e.recv_bytes = req.count * esize;
      e.needs_send = e.needs_recv = true;
      break;
    case OpKind::kAllGather:
      if (auto s = CheckBytes("count", req.count, n, esize, &e.recv_bytes); !s.ok()) return s;
      e.send_bytes = req.count * esize;
      e.needs_send = e.needs_recv = true;
      break;
    case OpKind::kBroadcast:
      if (auto s = CheckBytes("count", req.count, 1, esize, &e.recv_bytes); !s.ok()) return s;
      e.send_bytes = e.recv_bytes;
      e.needs_send = rank == req.root;
      e.needs_recv = true;
      break;
    case OpKind::kReduce:
      if (auto s = CheckBytes("count", req.count, 1, esize, &e.send_bytes); !s.ok()) return s;
      e.recv_bytes = e.send_bytes;
      e.needs_send = true;
      e.needs_recv = rank == req.root;
      break;
    case OpKind::kAllToAll:
      if (auto s = CheckBytes("count", req.count, n, esize, &e.send_bytes); !s.ok()) return s;
      e.recv_bytes = e.send_bytes;
      e.needs_send = e.needs_recv = true;
      break;
    case OpKind::kAllToAllv:
      // Send blocks may overlap (several peers get the same elements); receive blocks may not.
      if (auto s = SpanOfBlocks(req.send_counts, req.send_displs, nranks, esize, "send",
                                /*disjoint=*/false, &e.send_bytes);
          !s.ok()) {
        return s;
      }
      if (auto s = SpanOfBlocks(req.recv_counts, req.recv_displs, nranks, esize, "recv",
                                /*disjoint=*/true, &e.recv_bytes);
          !s.ok()) {
        return s;
      }
      e.needs_send = e.needs_recv = true;
      break;
    case OpKind::kSend:
      if (auto s = CheckBytes("count", req.count, 1, esize, &e.send_bytes); !s.ok()) return s;
      e.needs_send = true;
      break;
    case OpKind::kRecv:
      if (auto s = CheckBytes("count", req.count, 1, esize, &e.recv_bytes); !s.ok()) return s;
      e.needs_recv = true;
      break;
    case OpKind::kBarrier:
      break;
  }
  return e;
}

}  // namespace railyard::scheduler

namespace railyard::scheduler {

bool IsInPlace(const RankRequest& req, int rank) {
  if (req.send == nullptr || req.recv == nullptr) return false;
  // Rank's slot of the whole buffer (ReduceScatter, AllGather): within the count x nranks x
  // element size that ComputeExtents bounded.
  auto slot = [&] {
    return req.count * kernels::ElementSize(req.dtype) * static_cast<uint64_t>(rank);
  };
  switch (req.op) {
    case OpKind::kReduceScatter:
      return req.recv == req.send + slot();
    case OpKind::kAllGather:
      return req.send == req.recv + slot();
    case OpKind::kAllReduce:
    case OpKind::kBroadcast:
    case OpKind::kReduce:
    case OpKind::kAllToAll:
    case OpKind::kAllToAllv:
      return req.send == req.recv;
    default:
      return false;
  }
}

absl::Status CheckInPlaceLayout(const RankRequest& req, int rank, const Extents& e) {
  if (!e.needs_send || !e.needs_recv || req.send == nullptr || req.recv == nullptr) {
    return absl::OkStatus();
  }
  if (IsInPlace(req, rank)) {
    if (req.op != OpKind::kAllToAllv) return absl::OkStatus();
    if (req.send_counts != req.recv_counts || req.send_displs != req.recv_displs) {
      return absl::InvalidArgumentError(
          "in-place alltoallv needs send_counts == recv_counts and send_displs == recv_displs");
    }
    // Blocks of one buffer are read and written in place: they must not overlap each other.
    std::vector<std::pair<uint64_t, uint64_t>> blocks;
    for (size_t i = 0; i < req.recv_counts.size(); ++i) {
      if (req.recv_counts[i] > 0) blocks.emplace_back(req.recv_displs[i], req.recv_counts[i]);
    }
    std::sort(blocks.begin(), blocks.end());
    for (size_t i = 1; i < blocks.size(); ++i) {
      if (blocks[i - 1].first + blocks[i - 1].second > blocks[i].first) {
        return absl::InvalidArgumentError(
            "in-place alltoallv blocks overlap: each peer's block must be disjoint");
      }
    }
    return absl::OkStatus();
  }
  const std::byte* s0 = req.send;
  const std::byte* s1 = req.send + e.send_bytes;
  const std::byte* r0 = req.recv;
  const std::byte* r1 = req.recv + e.recv_bytes;
  if (e.send_bytes > 0 && e.recv_bytes > 0 && s0 < r1 && r0 < s1) {
    return absl::InvalidArgumentError(
        absl::StrCat("send and recv regions overlap but are not the in-place layout of ",
                     OpName(req.op), " (see docs/local-api.md)"));
  }
  return absl::OkStatus();
}

}  // namespace railyard::scheduler
