// The tag namespace of the data plane. Every rail's transport worker is shared by all the
// communicators of a daemon and matches tags exactly (64-bit mask), so a tag must say which
// communicator a message belongs to without any chance of collision. It does so by construction:
// each receiving daemon gives every multi-node communicator it is part of a slot of its own
// (TagSlotTable, allocated at bootstrap and announced in the layout); senders tag each message
// with the receiver's slot. No hash is involved: two live communicators never share a slot on
// one daemon, and a slot index that is reused carries a new generation, so messages left in
// flight by a failed communicator never match its successor.
//
// Layout (bit 63 first):
//   collective      0 | slot:16 | sender node:12 | seq:15 | step:20
//   point-to-point  1 | slot:16 | src rank:16    | dst rank:16 | seq:15
// slot = index:12 | generation:4 (index in the receiver's TagSlotTable).
//
// Field limits, enforced where the values are made:
//   nodes per communicator   <= kMaxNodes (4096)      CommBootstrap refuses more
//   ranks per communicator   <= kMaxRanks (65536)     InitComm and CommBootstrap refuse more
//   live multi-node comms    <= kMaxSlots (4096)      per daemon; InitComm: RESOURCE_EXHAUSTED
//   messages per node pair   <  kDigestStep (2^20-1)  per operation; the op fails, INVALID_ARGUMENT
//   sends/recvs in flight    <  kMaxP2pInFlight       per (src, dst) channel: RESOURCE_EXHAUSTED
//   sequence numbers         mod 2^15                 see below
// A daemon runs one collective of a communicator at a time, and every message of (slot, sender,
// step) is sent in sequence order over one endpoint, which the transports match in posting order
// (UCX's tag matching keeps MPI's non-overtaking order per endpoint), so the 15 sequence bits are
// a second guard, exact while no sender runs 32768 operations ahead of a receiver.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/transport/transport.h"

namespace railyard::scheduler::tags {

inline constexpr int kSlotIndexBits = 12;
inline constexpr int kSlotGenerationBits = 4;
inline constexpr int kSlotBits = kSlotIndexBits + kSlotGenerationBits;
inline constexpr int kNodeBits = 12;
inline constexpr int kSeqBits = 15;
inline constexpr int kStepBits = 20;
inline constexpr int kRankBits = 16;
static_assert(1 + kSlotBits + kNodeBits + kSeqBits + kStepBits == 64);
static_assert(1 + kSlotBits + 2 * kRankBits + kSeqBits == 64);

inline constexpr int kMaxSlots = 1 << kSlotIndexBits;
inline constexpr int kMaxNodes = 1 << kNodeBits;
inline constexpr int kMaxRanks = 1 << kRankBits;
inline constexpr uint64_t kMaxStepTags = uint64_t{1} << kStepBits;
// The last step value is no schedule's: it tags each daemon's operation digest to each peer
// (daemon/comm/op_digest.h). Schedules number their messages below it.
inline constexpr uint64_t kDigestStep = kMaxStepTags - 1;
inline constexpr uint64_t kMaxP2pInFlight = uint64_t{1} << kSeqBits;

// A slot value as it travels in the layout: index << kSlotGenerationBits | generation.
using SlotValue = uint16_t;

// Tag of collective message number `step` (the schedule's per node pair numbering) of sequence
// number seq, from node sender_node to the daemon whose slot for the communicator is `slot`.
// Arguments past their limits are a caller bug (checked in debug builds).
transport::Tag CollectiveTag(SlotValue slot, int sender_node, uint64_t seq, uint64_t step);
// Tag of the seq-th message on the point-to-point channel src rank -> dst rank, to the daemon
// whose slot is `slot` (the receiving rank's daemon).
transport::Tag PointToPointTag(SlotValue slot, int src_rank, int dst_rank, uint64_t seq);

// A tag taken apart (tests, error messages).
struct Fields {
  bool point_to_point = false;
  SlotValue slot = 0;
  uint32_t sender_node = 0;  // collective
  uint32_t src_rank = 0;     // point-to-point
  uint32_t dst_rank = 0;     // point-to-point
  uint32_t seq = 0;          // low kSeqBits bits
  uint32_t step = 0;         // collective
};
Fields Decode(transport::Tag tag);
std::string Describe(transport::Tag tag);

// One slot of a TagSlotTable; the slot returns to the table when the last reference goes.
class Slot {
 public:
  struct Table;
  Slot(std::shared_ptr<Table> table, int index, int generation);
  ~Slot();
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
  SlotValue value() const { return value_; }

 private:
  std::shared_ptr<Table> table_;
  const int index_;
  const SlotValue value_;
};

// A daemon's slots, one per multi-node communicator it is part of. Freed indices are reused
// last (FIFO) and with the next generation, so a value recurs only after kMaxSlots x 16 other
// allocations of its index's turn. Thread-safe; slots may outlive the table object.
class TagSlotTable {
 public:
  explicit TagSlotTable(int capacity = kMaxSlots);
  // RESOURCE_EXHAUSTED when every slot is held.
  absl::StatusOr<std::shared_ptr<const Slot>> Acquire();
  int in_use() const;

 private:
  std::shared_ptr<Slot::Table> table_;
};

}  // namespace railyard::scheduler::tags
