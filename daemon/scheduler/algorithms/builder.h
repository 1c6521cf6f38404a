// ScheduleBuilder: the one way algorithm generators write a RankSchedule.
//
// A generator describes its algorithm as a sequential program of whole-block transfers ("member
// p reduces block b of member p-1 into its accumulator"), listed in an order that is correct when
// the transfers run one at a time. The builder turns that program into a pipelined schedule:
//  - It cuts every transfer into chunks of at most chunk_bytes, counted from the start of the
//    transfer, so the same block gets the same chunk boundaries on every rank it visits.
//  - It derives every dependency from memory, per rank and per byte: a chunk waits for the
//    earlier transfers that wrote what it reads (RAW) and that read or wrote what it writes (WAR,
//    WAW), nothing else. A chunk's next step therefore depends only on that chunk's previous
//    steps (plus the ones that last used its destination bytes), and every dependency involves
//    the source or the destination rank of the dependent transfer, which is what Project needs.
//  - In place: it tracks send and recv as ONE address space per rank laid out as the op's
//    in-place layout (docs/local-api.md: send == recv; ReduceScatter recv = send + rank*count;
//    AllGather send = recv + rank*count). Every write to recv is thus ordered after every earlier
//    read of the send bytes it may alias, so the same schedule is correct in place and out of
//    place. Generators must only make the sequential program itself right under aliasing: never
//    write a recv byte whose aliased send byte a LATER transfer still reads (stage such data in
//    scratch instead: see direct.cc's pairwise exchange).
//  - It drops zero-byte transfers and copies of a region onto itself, and grows
//    scratch_bytes_per_rank to cover every scratch byte a transfer touches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "daemon/scheduler/schedule.h"

namespace railyard::scheduler::algorithms {

// An element range [offset, offset + elems).
struct Block {
  uint64_t offset = 0;
  uint64_t elems = 0;
};

// Splits [base, base + elems) into n contiguous blocks whose sizes differ by at most one (the
// larger ones last), so that block i starts at base + floor(i * elems / n).
std::vector<Block> SplitEven(uint64_t base, uint64_t elems, int n);
// The elems of each block.
std::vector<uint64_t> Lengths(const std::vector<Block>& blocks);

class ScheduleBuilder {
 public:
  // chunk_bytes 0 means "do not cut" (one chunk per transfer).
  ScheduleBuilder(const OpShape& shape, const CommLayout& layout, size_t chunk_bytes);

  const OpShape& shape() const { return shape_; }
  const CommLayout& layout() const { return layout_; }
  int nranks() const { return layout_.nranks; }
  size_t esize() const { return esize_; }

  // References element `elem` of a rank's send, recv or scratch region.
  RankRef Send(int rank, uint64_t elem = 0) const { return Ref(rank, RankRef::Space::kSend, elem); }
  RankRef Recv(int rank, uint64_t elem = 0) const { return Ref(rank, RankRef::Space::kRecv, elem); }
  RankRef Scratch(int rank, uint64_t elem = 0) const {
    return Ref(rank, RankRef::Space::kScratch, elem);
  }
  // ref moved `elems` elements further.
  RankRef Advance(RankRef ref, uint64_t elems) const;

  // dst <- src (elems elements), chunked. finalize: divide by nranks while copying (avg).
  void Copy(const RankRef& src, const RankRef& dst, uint64_t elems, bool finalize = false);
  // dst <- dst (op) src, chunked. finalize: this reduction produces the final value.
  void Reduce(const RankRef& src, const RankRef& dst, uint64_t elems, bool finalize = false);
  // A zero-byte message from src_rank to dst_rank after `deps` (barriers); returns its index.
  // Deps must involve src_rank's or dst_rank's node (see RankSchedule).
  uint32_t Signal(int src_rank, int dst_rank, std::vector<uint32_t> deps);

  RankSchedule Finish(std::string algorithm) &&;

 private:
  // Last writer and readers (since that write) of a run of bytes of one rank's address space.
  struct Segment {
    uint64_t end = 0;
    int64_t writer = -1;
    std::vector<uint32_t> readers;
  };
  using AccessMap = std::map<uint64_t, Segment>;  // keyed by start, non-overlapping

  RankRef Ref(int rank, RankRef::Space space, uint64_t elem) const;
  void Emit(Transfer::Kind kind, const RankRef& src, const RankRef& dst, uint64_t elems,
            bool finalize);
  // The map and address of ref's first byte (send and recv share one map per rank).
  AccessMap& MapOf(const RankRef& ref, uint64_t* addr);
  static void Collect(const AccessMap& map, uint64_t lo, uint64_t hi, bool write,
                      std::vector<uint32_t>* deps);
  static void Record(AccessMap* map, uint64_t lo, uint64_t hi, bool write, uint32_t id);
  static AccessMap::iterator SplitAt(AccessMap* map, uint64_t at);

  const OpShape& shape_;
  const CommLayout& layout_;
  size_t esize_ = 1;
  uint64_t chunk_elems_ = 0;  // 0: no cutting
  std::vector<uint64_t> send_base_, recv_base_;
  std::vector<AccessMap> user_, scratch_;
  RankSchedule schedule_;
};

}  // namespace railyard::scheduler::algorithms
