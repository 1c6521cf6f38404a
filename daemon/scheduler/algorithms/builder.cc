#include "daemon/scheduler/algorithms/builder.h"

#include <algorithm>
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

ScheduleBuilder::ScheduleBuilder(const OpShape& shape, const CommLayout& layout, size_t chunk_bytes)
    : shape_(shape), layout_(layout), esize_(kernels::ElementSize(shape.dtype)) {
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
  const bool self = src.rank == dst.rank && src.space == dst.space && src.offset == dst.offset;
  if (self && !finalize) return;
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
  t.deps = std::move(deps);
  schedule_.transfers.push_back(std::move(t));
  return static_cast<uint32_t>(schedule_.transfers.size() - 1);
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
    const auto id = static_cast<uint32_t>(schedule_.transfers.size());
    uint64_t src_addr = 0, dst_addr = 0;
    AccessMap& src_map = MapOf(t.src, &src_addr);
    AccessMap& dst_map = MapOf(t.dst, &dst_addr);
    Collect(src_map, src_addr, src_addr + t.bytes, /*write=*/false, &t.deps);
    Collect(dst_map, dst_addr, dst_addr + t.bytes, /*write=*/true, &t.deps);
    std::sort(t.deps.begin(), t.deps.end());
    t.deps.erase(std::unique(t.deps.begin(), t.deps.end()), t.deps.end());
    Record(&src_map, src_addr, src_addr + t.bytes, /*write=*/false, id);
    Record(&dst_map, dst_addr, dst_addr + t.bytes, /*write=*/true, id);
    if (t.src.space == RankRef::Space::kScratch) {
      schedule_.scratch_bytes_per_rank =
          std::max(schedule_.scratch_bytes_per_rank, t.src.offset + t.bytes);
    }
    if (t.dst.space == RankRef::Space::kScratch) {
      schedule_.scratch_bytes_per_rank =
          std::max(schedule_.scratch_bytes_per_rank, t.dst.offset + t.bytes);
    }
    schedule_.transfers.push_back(std::move(t));
  }
}

void ScheduleBuilder::Collect(const AccessMap& map, uint64_t lo, uint64_t hi, bool write,
                              std::vector<uint32_t>* deps) {
  auto it = map.upper_bound(lo);
  if (it != map.begin() && std::prev(it)->second.end > lo) --it;
  for (; it != map.end() && it->first < hi; ++it) {
    const Segment& seg = it->second;
    if (seg.writer >= 0) deps->push_back(static_cast<uint32_t>(seg.writer));
    if (write) deps->insert(deps->end(), seg.readers.begin(), seg.readers.end());
  }
}

// Makes `at` a segment boundary; returns the first segment starting at or after `at`.
ScheduleBuilder::AccessMap::iterator ScheduleBuilder::SplitAt(AccessMap* map, uint64_t at) {
  auto it = map->lower_bound(at);
  if (it != map->end() && it->first == at) return it;
  if (it == map->begin()) return it;
  auto prev = std::prev(it);
  if (prev->second.end <= at) return it;
  Segment tail = prev->second;
  prev->second.end = at;
  return map->emplace_hint(it, at, std::move(tail));
}

void ScheduleBuilder::Record(AccessMap* map, uint64_t lo, uint64_t hi, bool write, uint32_t id) {
  auto first = SplitAt(map, lo);
  SplitAt(map, hi);
  first = map->lower_bound(lo);
  if (write) {
    // One segment written by id replaces whatever was there.
    auto last = map->lower_bound(hi);
    map->erase(first, last);
    Segment seg;
    seg.end = hi;
    seg.writer = id;
    map->emplace(lo, std::move(seg));
    return;
  }
  // Reads: add id to every segment in [lo, hi), creating segments for the gaps.
  uint64_t pos = lo;
  auto it = first;
  while (pos < hi) {
    if (it == map->end() || it->first > pos) {
      const uint64_t gap_end = it == map->end() ? hi : std::min(hi, it->first);
      Segment gap;
      gap.end = gap_end;
      gap.readers.push_back(id);
      map->emplace_hint(it, pos, std::move(gap));
      pos = gap_end;
      continue;
    }
    it->second.readers.push_back(id);
    pos = it->second.end;
    ++it;
  }
}

RankSchedule ScheduleBuilder::Finish(std::string algorithm) && {
  schedule_.algorithm = std::move(algorithm);
  return std::move(schedule_);
}

}  // namespace railyard::scheduler::algorithms
