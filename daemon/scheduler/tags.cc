#include "daemon/scheduler/tags.h"

#include <cassert>

#include "absl/strings/str_cat.h"

namespace railyard::scheduler::tags {
namespace {

constexpr uint64_t Mask(int bits) { return (uint64_t{1} << bits) - 1; }

// Bit offsets, from the low end.
constexpr int kStepShift = 0;
constexpr int kSeqShift = kStepShift + kStepBits;
constexpr int kNodeShift = kSeqShift + kSeqBits;
constexpr int kCollSlotShift = kNodeShift + kNodeBits;
constexpr int kP2pSeqShift = 0;
constexpr int kDstShift = kP2pSeqShift + kSeqBits;
constexpr int kSrcShift = kDstShift + kRankBits;
constexpr int kP2pSlotShift = kSrcShift + kRankBits;
static_assert(kCollSlotShift + kSlotBits == 63 && kP2pSlotShift + kSlotBits == 63);
constexpr uint64_t kP2pBit = uint64_t{1} << 63;

}  // namespace

transport::Tag CollectiveTag(SlotValue slot, int sender_node, uint64_t seq, uint64_t step) {
  assert(sender_node >= 0 && sender_node < kMaxNodes);
  assert(step < kMaxStepTags);
  return (uint64_t{slot} << kCollSlotShift) |
         ((static_cast<uint64_t>(sender_node) & Mask(kNodeBits)) << kNodeShift) |
         ((seq & Mask(kSeqBits)) << kSeqShift) | ((step & Mask(kStepBits)) << kStepShift);
}

transport::Tag PointToPointTag(SlotValue slot, int src_rank, int dst_rank, uint64_t seq) {
  assert(src_rank >= 0 && src_rank < kMaxRanks && dst_rank >= 0 && dst_rank < kMaxRanks);
  return kP2pBit | (uint64_t{slot} << kP2pSlotShift) |
         ((static_cast<uint64_t>(src_rank) & Mask(kRankBits)) << kSrcShift) |
         ((static_cast<uint64_t>(dst_rank) & Mask(kRankBits)) << kDstShift) |
         ((seq & Mask(kSeqBits)) << kP2pSeqShift);
}

Fields Decode(transport::Tag tag) {
  Fields f;
  f.point_to_point = (tag & kP2pBit) != 0;
  if (f.point_to_point) {
    f.slot = static_cast<SlotValue>((tag >> kP2pSlotShift) & Mask(kSlotBits));
    f.src_rank = static_cast<uint32_t>((tag >> kSrcShift) & Mask(kRankBits));
    f.dst_rank = static_cast<uint32_t>((tag >> kDstShift) & Mask(kRankBits));
    f.seq = static_cast<uint32_t>((tag >> kP2pSeqShift) & Mask(kSeqBits));
  } else {
    f.slot = static_cast<SlotValue>((tag >> kCollSlotShift) & Mask(kSlotBits));
    f.sender_node = static_cast<uint32_t>((tag >> kNodeShift) & Mask(kNodeBits));
    f.seq = static_cast<uint32_t>((tag >> kSeqShift) & Mask(kSeqBits));
    f.step = static_cast<uint32_t>((tag >> kStepShift) & Mask(kStepBits));
  }
  return f;
}

std::string Describe(transport::Tag tag) {
  const Fields f = Decode(tag);
  const std::string slot =
      absl::StrCat("slot ", f.slot >> kSlotGenerationBits, ".", f.slot & Mask(kSlotGenerationBits));
  if (f.point_to_point) {
    return absl::StrCat("p2p ", slot, " rank ", f.src_rank, "->", f.dst_rank, " seq ", f.seq);
  }
  return absl::StrCat("collective ", slot, " from node ", f.sender_node, " seq ", f.seq, " step ",
                      f.step);
}

struct Slot::Table {
  absl::Mutex mu;
  std::deque<int> free ABSL_GUARDED_BY(mu);
  std::vector<uint8_t> generation ABSL_GUARDED_BY(mu);
  int in_use ABSL_GUARDED_BY(mu) = 0;
};

Slot::Slot(std::shared_ptr<Table> table, int index, int generation)
    : table_(std::move(table)),
      index_(index),
      value_(static_cast<SlotValue>((index << kSlotGenerationBits) | generation)) {}

Slot::~Slot() {
  absl::MutexLock lock(&table_->mu);
  uint8_t& gen = table_->generation[index_];
  gen = static_cast<uint8_t>((gen + 1) & Mask(kSlotGenerationBits));
  table_->free.push_back(index_);
  --table_->in_use;
}

TagSlotTable::TagSlotTable(int capacity) : table_(std::make_shared<Slot::Table>()) {
  if (capacity < 1 || capacity > kMaxSlots) capacity = kMaxSlots;
  absl::MutexLock lock(&table_->mu);
  table_->generation.assign(capacity, 0);
  for (int i = 0; i < capacity; ++i) table_->free.push_back(i);
}

absl::StatusOr<std::shared_ptr<const Slot>> TagSlotTable::Acquire() {
  int index;
  int generation;
  {
    absl::MutexLock lock(&table_->mu);
    if (table_->free.empty()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this daemon already takes part in ", table_->generation.size(),
          " multi-node communicators, the most its tag namespace holds; destroy unused ones"));
    }
    index = table_->free.front();
    table_->free.pop_front();
    generation = table_->generation[index];
    ++table_->in_use;
  }
  return std::make_shared<const Slot>(table_, index, generation);
}

int TagSlotTable::in_use() const {
  absl::MutexLock lock(&table_->mu);
  return table_->in_use;
}

}  // namespace railyard::scheduler::tags
