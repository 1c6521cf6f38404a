#include "tools/perf/perf_op.h"

#include <algorithm>

namespace railyard::perf {
namespace {

struct OpName {
  std::string_view name;
  PerfOp op;
  std::string_view program;  // nccl-tests' binary for it
};

constexpr OpName kOpNames[] = {
    {"allreduce", PerfOp::kAllReduce, "all_reduce_perf"},
    {"reducescatter", PerfOp::kReduceScatter, "reduce_scatter_perf"},
    {"allgather", PerfOp::kAllGather, "all_gather_perf"},
    {"broadcast", PerfOp::kBroadcast, "broadcast_perf"},
    {"reduce", PerfOp::kReduce, "reduce_perf"},
    {"alltoall", PerfOp::kAllToAll, "alltoall_perf"},
    {"alltoallv", PerfOp::kAllToAllv, "alltoallv_perf"},
    {"sendrecv", PerfOp::kSendRecv, "sendrecv_perf"},
    {"barrier", PerfOp::kBarrier, "barrier_perf"},
};

// Lower case without '_' and '-': "All_Reduce" -> "allreduce".
bool SameOpName(std::string_view given, std::string_view canonical) {
  size_t j = 0;
  for (char c : given) {
    if (c == '_' || c == '-') continue;
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (j >= canonical.size() || canonical[j] != c) return false;
    ++j;
  }
  return j == canonical.size();
}

}  // namespace

std::string_view Name(PerfOp op) {
  for (const OpName& entry : kOpNames) {
    if (entry.op == op) return entry.name;
  }
  return "unknown";
}

std::string_view ProgramName(PerfOp op) {
  for (const OpName& entry : kOpNames) {
    if (entry.op == op) return entry.program;
  }
  return "unknown";
}

bool ParsePerfOp(std::string_view name, PerfOp* out) {
  for (const OpName& entry : kOpNames) {
    if (SameOpName(name, entry.name)) {
      *out = entry.op;
      return true;
    }
  }
  return false;
}

bool UsesRedOp(PerfOp op) {
  return op == PerfOp::kAllReduce || op == PerfOp::kReduceScatter || op == PerfOp::kReduce;
}

bool UsesRoot(PerfOp op) { return op == PerfOp::kBroadcast || op == PerfOp::kReduce; }

OpLayout LayoutFor(PerfOp op, size_t bytes, size_t elem_size, int nranks) {
  const size_t n = static_cast<size_t>(nranks);
  const size_t count = bytes / elem_size;
  OpLayout layout;
  switch (op) {
    case PerfOp::kAllReduce:
    case PerfOp::kBroadcast:
    case PerfOp::kReduce:
    case PerfOp::kSendRecv:
      layout.count = layout.send_count = layout.recv_count = count;
      break;
    case PerfOp::kReduceScatter:
      layout.count = count / n;
      layout.send_count = layout.count * n;
      layout.recv_count = layout.count;
      layout.recv_inplace_offset = layout.count;
      break;
    case PerfOp::kAllGather:
      layout.count = count / n;
      layout.send_count = layout.count;
      layout.recv_count = layout.count * n;
      layout.send_inplace_offset = layout.count;
      break;
    case PerfOp::kAllToAll:
    case PerfOp::kAllToAllv:
      layout.count = count / n;
      layout.send_count = layout.recv_count = layout.count * n;
      break;
    case PerfOp::kBarrier:
      break;
  }
  layout.recv_buffer_count =
      op == PerfOp::kSendRecv ? 2 * layout.count : std::max(layout.send_count, layout.recv_count);
  return layout;
}

size_t PrintedBytes(const OpLayout& layout, size_t elem_size) {
  return std::max(layout.send_count, layout.recv_count) * elem_size;
}

double AlgBwBytes(PerfOp op, const OpLayout& layout, size_t elem_size, int nranks) {
  const double bytes = static_cast<double>(layout.count) * static_cast<double>(elem_size);
  switch (op) {
    case PerfOp::kReduceScatter:
    case PerfOp::kAllGather:
    case PerfOp::kAllToAll:
    case PerfOp::kAllToAllv:
      return bytes * nranks;
    default:
      return bytes;
  }
}

double BusBwFactor(PerfOp op, int nranks) {
  const double n = nranks;
  switch (op) {
    case PerfOp::kAllReduce:
      return 2.0 * (n - 1) / n;
    case PerfOp::kReduceScatter:
    case PerfOp::kAllGather:
    case PerfOp::kAllToAll:
    case PerfOp::kAllToAllv:
      return (n - 1) / n;
    case PerfOp::kBroadcast:
    case PerfOp::kReduce:
    case PerfOp::kSendRecv:
      return 1.0;
    case PerfOp::kBarrier:
      return 0.0;
  }
  return 0.0;
}

Slot SendSlot(PerfOp op, const OpLayout& layout, int rank, bool in_place) {
  if (!in_place) return Slot{false, 0};
  if (op == PerfOp::kSendRecv) return Slot{true, 0};
  return Slot{true, static_cast<size_t>(rank) * layout.send_inplace_offset};
}

Slot RecvSlot(PerfOp op, const OpLayout& layout, int rank, bool in_place) {
  if (!in_place) return Slot{true, 0};
  if (op == PerfOp::kSendRecv) return Slot{true, layout.count};
  return Slot{true, static_cast<size_t>(rank) * layout.recv_inplace_offset};
}

size_t AllToAllvCount(size_t block, int from, int to) {
  return block * static_cast<size_t>(1 + (from + to) % 4) / 4;
}

int SendPeer(int rank, int nranks) { return (rank + 1) % nranks; }

int RecvPeer(int rank, int nranks) { return (rank - 1 + nranks) % nranks; }

}  // namespace railyard::perf
