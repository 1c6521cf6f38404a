#include "daemon/comm/collective_queue.h"

#include "absl/time/clock.h"

namespace railyard {

CollectiveQueue::CollectiveQueue(const std::vector<int>* local_ranks)
    : local_ranks_(local_ranks), next_seq_(local_ranks->size(), 0) {}

size_t CollectiveQueue::CompletePrefix() const {
  size_t n = 0;
  while (n < entries_.size() && entries_[n].merge.complete()) ++n;
  return n;
}

void CollectiveQueue::Rebase(uint64_t seq) {
  if (!entries_.empty()) return;
  base_seq_ = seq;
  std::fill(next_seq_.begin(), next_seq_.end(), seq);
}

absl::Status CollectiveQueue::Add(int li, std::unique_ptr<PendingRequest> request, Added* added) {
  const uint64_t seq = next_seq_[li];
  added->seq = seq;
  const uint64_t idx = seq - base_seq_;
  while (entries_.size() <= idx) {
    entries_.emplace_back();
    entries_.back().merge.Reset(static_cast<int>(local_ranks_->size()), local_ranks_);
    entries_.back().requests.resize(local_ranks_->size());
  }
  Entry& e = entries_[idx];
  if (absl::Status s = e.merge.Add(li, &request->req); !s.ok()) return s;
  ++next_seq_[li];
  added->entry = &e;
  added->first = e.merge.arrived() == 1;
  if (added->first) e.first_at = absl::Now();
  added->complete = e.merge.complete();
  e.requests[li] = std::move(request);
  return absl::OkStatus();
}

bool CollectiveQueue::CompletesNext(int li) const {
  const int nlocal = static_cast<int>(local_ranks_->size());
  const uint64_t idx = next_seq_[li] - base_seq_;
  if (idx >= entries_.size()) return nlocal == 1;
  return entries_[idx].merge.arrived() == nlocal - 1;
}

void CollectiveQueue::PopFront() {
  entries_.pop_front();
  ++base_seq_;
}

CollectiveQueue::Entry* CollectiveQueue::Find(uint64_t seq) {
  if (seq < base_seq_ || seq - base_seq_ >= entries_.size()) return nullptr;
  return &entries_[seq - base_seq_];
}

CollectiveQueue::Drained CollectiveQueue::DrainFrom(size_t keep) {
  Drained out;
  for (size_t i = keep; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    out.timers.push_back(e.timer);
    for (auto& r : e.requests) {
      if (r != nullptr) out.requests.emplace_back(base_seq_ + i, std::move(r));
    }
    ++out.entries;
  }
  entries_.resize(std::min(entries_.size(), keep));
  return out;
}

}  // namespace railyard
