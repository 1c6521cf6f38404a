// The collectives railyard-perf measures, and how nccl-tests sizes, places and scores each one:
// a size in bytes becomes element counts, buffer offsets and a bus-bandwidth factor.
#pragma once

#include <cstddef>
#include <string_view>

namespace railyard::perf {

enum class PerfOp {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAllToAll,
  kAllToAllv,
  kSendRecv,
  kBarrier,
};

// "allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall", "alltoallv",
// "sendrecv", "barrier".
std::string_view Name(PerfOp op);
// nccl-tests' program for it ("all_reduce_perf", ...; alltoallv_perf and barrier_perf have none
// there), as its header and footer name it.
std::string_view ProgramName(PerfOp op);
// Inverse of Name(); also accepts "all_reduce", "all-reduce", ... Returns false if unknown.
bool ParsePerfOp(std::string_view name, PerfOp* out);
// Whether the op takes a reduction operator (printed in the redop column, else "none").
bool UsesRedOp(PerfOp op);
// Whether the op takes a root (printed in the root column, else -1).
bool UsesRoot(PerfOp op);

// Element counts of one operation at one benchmark size, as nccl-tests' getCollByteCount():
// the size is the largest per-rank buffer (AllReduce, Broadcast, Reduce, SendRecv: the message;
// AllGather, ReduceScatter, AllToAll(v): the whole gathered / scattered buffer).
struct OpLayout {
  size_t count = 0;       // the count argument of the call, printed in the "count" column
  size_t send_count = 0;  // elements each rank sends from its send region
  size_t recv_count = 0;  // elements of each rank's result region
  // In-place: send region = recv buffer + rank * send_inplace_offset, result region = recv
  // buffer + rank * recv_inplace_offset (elements). SendRecv is special: see RecvSlot().
  size_t send_inplace_offset = 0;
  size_t recv_inplace_offset = 0;
  size_t recv_buffer_count = 0;  // elements the recv buffer needs for both modes
};
OpLayout LayoutFor(PerfOp op, size_t bytes, size_t elem_size, int nranks);

// The "size" column: bytes of the larger of the send and result regions.
size_t PrintedBytes(const OpLayout& layout, size_t elem_size);

// Bytes that algbw divides by the time (nccl-tests' getBw): the message for AllReduce,
// Broadcast, Reduce and SendRecv; count * nranks elements for AllGather, ReduceScatter,
// AllToAll(v).
double AlgBwBytes(PerfOp op, const OpLayout& layout, size_t elem_size, int nranks);
// busbw = algbw * factor: 2(n-1)/n for AllReduce; (n-1)/n for AllGather, ReduceScatter,
// AllToAll(v); 1 for Broadcast, Reduce, SendRecv; 0 for Barrier (it moves no data).
double BusBwFactor(PerfOp op, int nranks);

// Where an operand lies: in the send or the recv buffer, at an element offset.
struct Slot {
  bool in_recv_buffer = false;
  size_t offset = 0;  // elements
};
// The send operand of `rank`; out-of-place: the send buffer; in-place: inside the recv buffer.
Slot SendSlot(PerfOp op, const OpLayout& layout, int rank, bool in_place);
// The result operand of `rank` (always in the recv buffer). In-place SendRecv receives right
// after the region it sends from, in the same buffer (send and recv of one rank run concurrently,
// so exactly the same region would race).
Slot RecvSlot(PerfOp op, const OpLayout& layout, int rank, bool in_place);

// AllToAllv: elements `from` sends to `to`, for a per-peer block of `block` elements. Uneven
// (1/4 to 4/4 of the block) and symmetric, so that in-place counts match.
size_t AllToAllvCount(size_t block, int from, int to);

// SendRecv ring: rank r sends to (r+1)%n and receives from (r-1+n)%n.
int SendPeer(int rank, int nranks);
int RecvPeer(int rank, int nranks);

}  // namespace railyard::perf
