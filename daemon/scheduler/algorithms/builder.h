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
//  - Fan-out reads: when a range whose bytes have many writers (at least fence_min_writers,
//    e.g. a hier shard assembled from K ring pieces) is read again with nothing written to that
//    rank in between (a copy-to-all), it emits a FENCE once: a zero-byte copy of the range's
//    first byte onto itself that depends on those writers, and the later reads depend on the
//    fence instead of on each writer. Same happens-before, deps O(writers + readers) instead of
//    O(writers x readers); the fence is a no-op memory step on the reader's node.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/inlined_vector.h"
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
  // Reads of ranges with at least this many writers get a fence (see above) when repeated.
  static constexpr uint32_t kDefaultFenceMinWriters = 32;

  // chunk_bytes 0 means "do not cut" (one chunk per transfer). fence_min_writers 0: no fences
  // (tests compare both forms).
  ScheduleBuilder(const OpShape& shape, const CommLayout& layout, size_t chunk_bytes,
                  uint32_t fence_min_writers = kDefaultFenceMinWriters);

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

  // Transfers an Emit of `elems` elements produces (its chunks).
  uint64_t Chunks(uint64_t elems) const {
    if (elems == 0) return 0;
    return chunk_elems_ == 0 ? 1 : (elems + chunk_elems_ - 1) / chunk_elems_;
  }
  // Capacity for `transfers` (a generator's upper estimate): at 1024 x 8 a growing vector of 17M
  // transfers would hold the old and the new copy at once (~1.3 GB more at its peak).
  void Reserve(uint64_t transfers) { schedule_.transfers.reserve(transfers); }

  RankSchedule Finish(std::string algorithm) &&;

 private:
  static constexpr uint32_t kNoWriter = UINT32_MAX;
  static constexpr uint32_t kNone = UINT32_MAX;  // no readers list
  // Last writer and readers (since that write) of a run of bytes of one rank's address space.
  // The readers live in pool_ (`readers` indexes it; kNone: none) so that a B-tree slot is 24
  // bytes and a node holds ~10 of them: the trees stay shallow.
  struct Segment {
    uint64_t end = 0;
    uint32_t writer = kNoWriter;
    uint32_t readers = kNone;
  };
  // Most runs have a reader or two; hier's shards have G - 1 (its copy-to-all, G = 8 usually):
  // inline up to 7, no allocation per list.
  using Readers = absl::InlinedVector<uint32_t, 7>;
  // One rank's send+recv address space or its scratch: segments keyed by start, non-overlapping.
  // A B-tree, not std::map: at 1024 x 8 ranks there are ~10M segments and the lookups of every
  // transfer are cache misses in a node-per-segment tree.
  struct AccessMap {
    absl::btree_map<uint64_t, Segment> segs;
    uint64_t writes = 0;  // bumped by every write: invalidates ReadCache
  };
  // The sorted writers of the last read range collected: one-to-many copies (copy-to-all) read
  // the same many-segment range G - 1 times in a row.
  struct ReadCache {
    const AccessMap* map = nullptr;
    uint64_t lo = 0, hi = 0, writes = 0;
    std::vector<uint32_t> writers;
    uint32_t fence = kNoWriter;  // the fence standing for `writers`, once emitted
    bool hit = false;            // the last Writers() call was served from the cache
  };

  RankRef Ref(int rank, RankRef::Space space, uint64_t elem) const;
  void Emit(Transfer::Kind kind, const RankRef& src, const RankRef& dst, uint64_t elems,
            bool finalize);
  // The map and address of ref's first byte (send and recv share one map per rank).
  AccessMap& MapOf(const RankRef& ref, uint64_t* addr);
  // Sorted, unique writers of [lo, hi) (what a read of it waits for), cached.
  const std::vector<uint32_t>& Writers(const AccessMap& map, uint64_t lo, uint64_t hi);
  // Writers and readers of [lo, hi) appended to deps (what a write of it waits for).
  void Collect(const AccessMap& map, uint64_t lo, uint64_t hi, std::vector<uint32_t>* deps) const;
  void RecordRead(AccessMap* map, uint64_t lo, uint64_t hi, uint32_t id);
  void RecordWrite(AccessMap* map, uint64_t lo, uint64_t hi, uint32_t id);
  // Makes `at` a segment boundary.
  void SplitAt(AccessMap* map, uint64_t at);
  // pool_ entries: a new empty list, a copy, and giving one back (kNone is ignored).
  uint32_t NewReaders();
  void FreeReaders(uint32_t list);

  const OpShape& shape_;
  const CommLayout& layout_;
  size_t esize_ = 1;
  uint64_t chunk_elems_ = 0;  // 0: no cutting
  uint32_t fence_min_writers_ = kDefaultFenceMinWriters;
  std::vector<uint64_t> send_base_, recv_base_;
  std::vector<AccessMap> user_, scratch_;
  ReadCache read_cache_;
  std::vector<uint32_t> write_deps_;   // scratch of Emit
  std::vector<uint32_t> merged_deps_;  // scratch of Emit
  std::vector<uint32_t> fence_deps_;   // {the current fence}
  std::vector<Readers> pool_;
  std::vector<uint32_t> free_;  // unused pool_ entries
  uint32_t Append(Transfer t);  // returns its index
  RankSchedule schedule_;
};

}  // namespace railyard::scheduler::algorithms
