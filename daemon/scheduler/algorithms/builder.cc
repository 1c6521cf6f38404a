#include "daemon/scheduler/algorithms/builder.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace railyard::scheduler::algorithms {

std::vector<Block> SplitEven(uint64_t base, uint64_t elems, int n) {
  std::vector<Block> blocks(n);
  const auto start = [&](int i) {
    return static_cast<uint64_t>(static_cast<unsigned __int128>(elems) * i / n);
  };
  for (int i = 0; i < n; ++i) {
    blocks[i].offset = base + start(i);
    blocks[i].elems = start(i + 1) - start(i);
  }
  return blocks;
}

std::vector<uint64_t> Lengths(const std::vector<Block>& blocks) {
  std::vector<uint64_t> lens;
  lens.reserve(blocks.size());
  for (const Block& b : blocks) lens.push_back(b.elems);
  return lens;
}

ScheduleBuilder::ScheduleBuilder(const OpShape& shape, const CommLayout& layout, size_t chunk_bytes,
                                 uint32_t fence_min_writers)
    : shape_(shape),
      layout_(layout),
      esize_(kernels::ElementSize(shape.dtype)),
      fence_min_writers_(fence_min_writers) {
  chunk_elems_ = chunk_bytes == 0 ? 0 : std::max<uint64_t>(1, chunk_bytes / esize_);
  const int n = layout.nranks;
  send_base_.assign(n, 0);
  recv_base_.assign(n, 0);
  for (int r = 0; r < n; ++r) {
    const uint64_t seg = shape.count * esize_ * static_cast<uint64_t>(r);
    if (shape.op == OpKind::kReduceScatter) recv_base_[r] = seg;
    if (shape.op == OpKind::kAllGather) send_base_[r] = seg;
  }
  user_.resize(n);
  scratch_.resize(n);
}

RankRef ScheduleBuilder::Ref(int rank, RankRef::Space space, uint64_t elem) const {
  RankRef ref;
  ref.rank = rank;
  ref.space = space;
  ref.offset = elem * esize_;
  return ref;
}

RankRef ScheduleBuilder::Advance(RankRef ref, uint64_t elems) const {
  ref.offset += elems * esize_;
  return ref;
}

void ScheduleBuilder::Copy(const RankRef& src, const RankRef& dst, uint64_t elems, bool finalize) {
  if (src == dst && !finalize) return;  // a copy onto itself
  Emit(Transfer::Kind::kCopy, src, dst, elems, finalize);
}

void ScheduleBuilder::Reduce(const RankRef& src, const RankRef& dst, uint64_t elems,
                             bool finalize) {
  Emit(Transfer::Kind::kReduce, src, dst, elems, finalize);
}

uint32_t ScheduleBuilder::Signal(int src_rank, int dst_rank, std::vector<uint32_t> deps) {
  Transfer t;
  t.kind = Transfer::Kind::kCopy;
  t.src = Scratch(src_rank);
  t.dst = Scratch(dst_rank);
  t.bytes = 0;
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  t.deps.assign(deps.begin(), deps.end());
  return Append(std::move(t));
}

ScheduleBuilder::AccessMap& ScheduleBuilder::MapOf(const RankRef& ref, uint64_t* addr) {
  switch (ref.space) {
    case RankRef::Space::kSend:
      *addr = send_base_[ref.rank] + ref.offset;
      return user_[ref.rank];
    case RankRef::Space::kRecv:
      *addr = recv_base_[ref.rank] + ref.offset;
      return user_[ref.rank];
    case RankRef::Space::kScratch:
      break;
  }
  *addr = ref.offset;
  return scratch_[ref.rank];
}

void ScheduleBuilder::Emit(Transfer::Kind kind, const RankRef& src, const RankRef& dst,
                           uint64_t elems, bool finalize) {
  if (elems == 0) return;
  const uint64_t step = chunk_elems_ == 0 ? elems : chunk_elems_;
  for (uint64_t done = 0; done < elems; done += step) {
    const uint64_t n = std::min(step, elems - done);
    Transfer t;
    t.kind = kind;
    t.src = Advance(src, done);
    t.dst = Advance(dst, done);
    t.bytes = n * esize_;
    t.finalize = finalize;
    uint64_t src_addr = 0, dst_addr = 0;
    AccessMap& src_map = MapOf(t.src, &src_addr);
    AccessMap& dst_map = MapOf(t.dst, &dst_addr);
    // deps = writers of the source (sorted, unique) united with the writers and readers of the
    // destination.
    const std::vector<uint32_t>* raw = &Writers(src_map, src_addr, src_addr + t.bytes);
    ReadCache& c = read_cache_;
    if (c.hit && fence_min_writers_ > 0 && c.writers.size() >= fence_min_writers_) {
      if (c.fence == kNoWriter) {
        Transfer fence;
        fence.kind = Transfer::Kind::kCopy;
        fence.src = t.src;
        fence.dst = t.src;
        fence.bytes = 0;
        fence.deps.assign(c.writers.begin(), c.writers.end());
        c.fence = Append(std::move(fence));
        fence_deps_.assign(1, c.fence);
      }
      raw = &fence_deps_;
    }
    const auto id = static_cast<uint32_t>(schedule_.transfers.size());
    write_deps_.clear();
    Collect(dst_map, dst_addr, dst_addr + t.bytes, &write_deps_);
    // One segment's writer and readers come sorted (ids grow): skip the sort then.
    if (!std::is_sorted(write_deps_.begin(), write_deps_.end())) {
      std::sort(write_deps_.begin(), write_deps_.end());
    }
    write_deps_.erase(std::unique(write_deps_.begin(), write_deps_.end()), write_deps_.end());
    // Merged in scratch, then copied: the inline deps get the union's exact size, not a heap
    // block sized for both inputs when they overlap.
    merged_deps_.clear();
    std::set_union(raw->begin(), raw->end(), write_deps_.begin(), write_deps_.end(),
                   std::back_inserter(merged_deps_));
    t.deps.assign(merged_deps_.begin(), merged_deps_.end());
    RecordRead(&src_map, src_addr, src_addr + t.bytes, id);
    RecordWrite(&dst_map, dst_addr, dst_addr + t.bytes, id);
    if (t.src.space == RankRef::Space::kScratch) {
      schedule_.scratch_bytes_per_rank =
          std::max(schedule_.scratch_bytes_per_rank, t.src.offset + t.bytes);
    }
    if (t.dst.space == RankRef::Space::kScratch) {
      schedule_.scratch_bytes_per_rank =
          std::max(schedule_.scratch_bytes_per_rank, t.dst.offset + t.bytes);
    }
    Append(std::move(t));
  }
}

uint32_t ScheduleBuilder::Append(Transfer t) {
  schedule_.transfers.push_back(std::move(t));
  return static_cast<uint32_t>(schedule_.transfers.size() - 1);
}
const std::vector<uint32_t>& ScheduleBuilder::Writers(const AccessMap& map, uint64_t lo,
                                                      uint64_t hi) {
  ReadCache& c = read_cache_;
  c.hit = c.map == &map && c.lo == lo && c.hi == hi && c.writes == map.writes;
  if (c.hit) return c.writers;
  c.fence = kNoWriter;
  c.map = &map;
  c.lo = lo;
  c.hi = hi;
  c.writes = map.writes;
  c.writers.clear();
  auto it = map.segs.upper_bound(lo);
  if (it != map.segs.begin() && std::prev(it)->second.end > lo) --it;
  for (; it != map.segs.end() && it->first < hi; ++it) {
    if (it->second.writer != kNoWriter) c.writers.push_back(it->second.writer);
  }
  if (!std::is_sorted(c.writers.begin(), c.writers.end())) {
    std::sort(c.writers.begin(), c.writers.end());
  }
  c.writers.erase(std::unique(c.writers.begin(), c.writers.end()), c.writers.end());
  return c.writers;
}

void ScheduleBuilder::Collect(const AccessMap& map, uint64_t lo, uint64_t hi,
                              std::vector<uint32_t>* deps) const {
  auto it = map.segs.upper_bound(lo);
  if (it != map.segs.begin() && std::prev(it)->second.end > lo) --it;
  for (; it != map.segs.end() && it->first < hi; ++it) {
    const Segment& seg = it->second;
    if (seg.writer != kNoWriter) deps->push_back(seg.writer);
    if (seg.readers != kNone) {
      const Readers& r = pool_[seg.readers];
      deps->insert(deps->end(), r.begin(), r.end());
    }
  }
}

uint32_t ScheduleBuilder::NewReaders() {
  if (!free_.empty()) {
    const uint32_t list = free_.back();
    free_.pop_back();
    return list;
  }
  pool_.emplace_back();
  return static_cast<uint32_t>(pool_.size() - 1);
}

void ScheduleBuilder::FreeReaders(uint32_t list) {
  if (list == kNone) return;
  pool_[list].clear();
  free_.push_back(list);
}

void ScheduleBuilder::SplitAt(AccessMap* map, uint64_t at) {
  auto it = map->segs.lower_bound(at);
  if (it != map->segs.end() && it->first == at) return;
  if (it == map->segs.begin()) return;
  auto prev = std::prev(it);
  if (prev->second.end <= at) return;
  Segment tail = prev->second;
  prev->second.end = at;
  if (tail.readers != kNone) {
    const uint32_t copy = NewReaders();  // may grow pool_: copy by index
    pool_[copy] = pool_[tail.readers];
    tail.readers = copy;
  }
  map->segs.emplace_hint(it, at, tail);
}

void ScheduleBuilder::RecordWrite(AccessMap* map, uint64_t lo, uint64_t hi, uint32_t id) {
  ++map->writes;
  auto& segs = map->segs;
  // The common case: the write covers exactly one existing segment.
  if (auto it = segs.find(lo); it != segs.end() && it->second.end == hi) {
    it->second.writer = id;
    FreeReaders(it->second.readers);
    it->second.readers = kNone;
    return;
  }
  // One segment written by id replaces whatever was there.
  SplitAt(map, lo);
  SplitAt(map, hi);
  auto first = segs.lower_bound(lo);
  auto last = segs.lower_bound(hi);
  for (auto it = first; it != last; ++it) FreeReaders(it->second.readers);
  if (first != last) first = segs.erase(first, last);
  Segment seg;
  seg.end = hi;
  seg.writer = id;
  segs.emplace_hint(first, lo, seg);
}

void ScheduleBuilder::RecordRead(AccessMap* map, uint64_t lo, uint64_t hi, uint32_t id) {
  auto& segs = map->segs;
  const auto add = [&](Segment& seg) {
    if (seg.readers == kNone) seg.readers = NewReaders();
    pool_[seg.readers].push_back(id);
  };
  if (auto it = segs.find(lo); it != segs.end() && it->second.end == hi) {
    add(it->second);
    return;
  }
  SplitAt(map, lo);
  SplitAt(map, hi);
  // Add id to every segment in [lo, hi), creating segments for the gaps.
  uint64_t pos = lo;
  auto it = segs.lower_bound(lo);
  while (pos < hi) {
    if (it == segs.end() || it->first > pos) {
      Segment gap;
      gap.end = it == segs.end() ? hi : std::min(hi, it->first);
      add(gap);
      it = segs.emplace_hint(it, pos, gap);
      ++it;
      pos = gap.end;
      continue;
    }
    add(it->second);
    pos = it->second.end;
    ++it;
  }
}

RankSchedule ScheduleBuilder::Finish(std::string algorithm) && {
  schedule_.algorithm = std::move(algorithm);
  return std::move(schedule_);
}

}  // namespace railyard::scheduler::algorithms
