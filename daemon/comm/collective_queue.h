// The collectives of one communicator on this daemon, in sequence order: each local rank's k-th
// collective is sequence number k, and an entry is complete when every local rank's request for
// it has arrived and all agree (scheduler::OpMerge). The communicator runs complete entries from
// the front, one at a time. No lock, no timer of its own: the communicator holds its lock around
// every call and keeps the entry's deadline timer in it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/comm/pending_request.h"
#include "daemon/scheduler/merge.h"
#include "daemon/util/deadline_timer.h"

namespace railyard {

class CollectiveQueue {
 public:
  struct Entry {
    scheduler::OpMerge merge;
    std::vector<std::unique_ptr<PendingRequest>> requests;  // by local index; null: not yet
    DeadlineTimer::Id timer = 0;                            // the first arrival's deadline
    absl::Time first_at;                                    // when the first local rank submitted
  };

  // local_ranks: the global rank of each local index (outlives the queue).
  explicit CollectiveQueue(const std::vector<int>* local_ranks);

  struct Added {
    uint64_t seq = 0;        // the request's sequence number (set on error too)
    Entry* entry = nullptr;  // its entry
    bool first = false;      // the first of the local ranks to arrive for seq
    bool complete = false;   // the last: every local rank's request is in
  };
  // Adds local rank li's next collective. A request that disagrees with the ones already in for
  // its sequence number is refused (INVALID_ARGUMENT saying what differs, dropped, and the rank's
  // sequence does not advance); `added` says which sequence number it was for.
  absl::Status Add(int li, std::unique_ptr<PendingRequest> request, Added* added);

  // True when local rank li's next collective will be the last of its sequence number to arrive
  // (every other local rank submitted it, or li is the only local rank): nobody here waits on
  // anything after it for that sequence number.
  bool CompletesNext(int li) const;

  // Starts every local rank's sequence at seq (a communicator rejoined after a restart, before
  // anything was added).
  void Rebase(uint64_t seq);
  bool empty() const { return entries_.empty(); }
  // How many entries from the front are complete (every local rank's request is in).
  size_t CompletePrefix() const;
  size_t size() const { return entries_.size(); }
  // Sequence number of the front entry (the next to run).
  uint64_t front_seq() const { return base_seq_; }
  Entry& front() { return entries_.front(); }
  const Entry& front() const { return entries_.front(); }
  // Collectives local rank li submitted (its next one gets this sequence number).
  uint64_t submitted(int li) const { return next_seq_[static_cast<size_t>(li)]; }
  bool front_complete() const { return !entries_.empty() && entries_.front().merge.complete(); }
  void PopFront();
  // The entry of seq, or null when it ran already or nobody submitted it yet.
  Entry* Find(uint64_t seq);
  // Removes the entries from position `keep` (0: all) on and returns their requests with their
  // sequence numbers (to fail them) and their timers (to cancel).
  struct Drained {
    std::vector<std::pair<uint64_t, std::unique_ptr<PendingRequest>>> requests;
    std::vector<DeadlineTimer::Id> timers;
    size_t entries = 0;
  };
  Drained DrainFrom(size_t keep);

 private:
  const std::vector<int>* const local_ranks_;
  std::vector<uint64_t> next_seq_;  // per local index
  std::deque<Entry> entries_;       // entries_[i] holds sequence number base_seq_ + i
  uint64_t base_seq_ = 0;
};

}  // namespace railyard
