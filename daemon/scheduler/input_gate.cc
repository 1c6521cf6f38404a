#include "daemon/scheduler/input_gate.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace railyard::scheduler {

FillGate::FillGate(std::vector<Region> regions)
    : regions_(std::move(regions)), filled_(regions_.size(), 0) {}

bool FillGate::FilledLocked(const std::byte* p, uint64_t n) const {
  for (size_t i = 0; i < regions_.size(); ++i) {
    const Region& r = regions_[i];
    const std::byte* end = r.begin + r.bytes;
    if (n == 0 || p >= end || p + n <= r.begin) continue;  // no overlap
    const std::byte* need = std::min(p + n, end);
    if (r.begin + filled_[i] < need) return false;
  }
  return true;
}

bool FillGate::AllFilledLocked() const {
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (filled_[i] < regions_[i].bytes) return false;
  }
  return true;
}

bool FillGate::Admit(const std::byte* p, uint64_t n, std::function<void(absl::Status)>& wake) {
  absl::Status failed;
  {
    absl::MutexLock lock(&mu_);
    if (FilledLocked(p, n)) return true;
    if (error_.ok()) {
      waiters_.push_back({p, n, std::move(wake)});
      return false;
    }
    failed = error_;
  }
  std::function<void(absl::Status)> w = std::move(wake);
  w(failed);
  return false;
}

void FillGate::Advance(size_t region, uint64_t filled) {
  std::vector<std::function<void(absl::Status)>> ready;
  {
    absl::MutexLock lock(&mu_);
    if (region >= regions_.size()) return;
    filled_[region] = std::max(filled_[region], std::min(filled, regions_[region].bytes));
    auto keep = std::partition(
        waiters_.begin(), waiters_.end(),
        [this](const Waiter& w) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !FilledLocked(w.p, w.n); });
    for (auto it = keep; it != waiters_.end(); ++it) ready.push_back(std::move(it->wake));
    waiters_.erase(keep, waiters_.end());
    if (AllFilledLocked()) {
      for (auto& f : when_filled_) ready.push_back(std::move(f));
      when_filled_.clear();
    }
  }
  for (auto& wake : ready) wake(absl::OkStatus());
}

void FillGate::Fail(const absl::Status& error) {
  std::vector<std::function<void(absl::Status)>> woken;
  absl::Status stored;  // never OK: a waiter woken with OK would touch unfilled bytes
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return;
    error_ = error.ok() ? absl::InternalError("filling the memory stopped") : error;
    stored = error_;
    for (auto& w : waiters_) woken.push_back(std::move(w.wake));
    waiters_.clear();
    for (auto& f : when_filled_) woken.push_back(std::move(f));
    when_filled_.clear();
  }
  for (auto& wake : woken) wake(stored);
}

void FillGate::WhenFilled(std::function<void(absl::Status)> then) {
  absl::Status now;
  {
    absl::MutexLock lock(&mu_);
    if (error_.ok() && !AllFilledLocked()) {
      when_filled_.push_back(std::move(then));
      return;
    }
    now = error_;
  }
  then(now);
}

std::pair<uint64_t, uint64_t> AddRun(std::map<uint64_t, uint64_t>& runs, uint64_t begin,
                                     uint64_t end) {
  auto first = runs.upper_bound(begin);
  if (first != runs.begin() && std::prev(first)->second >= begin) --first;
  auto last = first;
  for (; last != runs.end() && last->first <= end; ++last) {
    begin = std::min(begin, last->first);
    end = std::max(end, last->second);
  }
  runs.erase(first, last);
  runs.emplace(begin, end);
  return {begin, end};
}

bool Covers(const std::map<uint64_t, uint64_t>& runs, uint64_t begin, uint64_t end) {
  auto it = runs.upper_bound(begin);
  return it != runs.begin() && std::prev(it)->second >= end;
}

}  // namespace railyard::scheduler
