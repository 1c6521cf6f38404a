#include "daemon/util/deadline_timer.h"

#include "daemon/util/thread_name.h"

namespace railyard {

DeadlineTimer::DeadlineTimer()
    : clock_(Clock::Real()), thread_([this] {
        NameThisThread("ry-timer");
        Loop();
      }) {}

DeadlineTimer::DeadlineTimer(const Clock* clock) : clock_(clock) {}

DeadlineTimer::~DeadlineTimer() { Stop(); }

void DeadlineTimer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  std::map<std::pair<absl::Time, Id>, std::function<void()>> dropped;
  {
    absl::MutexLock lock(&mu_);
    dropped.swap(pending_);
    deadlines_.clear();
  }
  // The callbacks' captures are destroyed here, outside the lock (they may hold objects whose
  // destructors schedule or cancel).
}

int DeadlineTimer::RunDue() {
  int ran = 0;
  absl::MutexLock lock(&mu_);
  while (!pending_.empty() && pending_.begin()->first.first <= clock_->Now()) {
    auto first = pending_.begin();
    std::function<void()> fn = std::move(first->second);
    deadlines_.erase(first->first.second);
    pending_.erase(first);
    mu_.Unlock();
    fn();
    ++ran;
    mu_.Lock();
  }
  return ran;
}

DeadlineTimer::Id DeadlineTimer::Schedule(absl::Time deadline, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  const Id id = next_id_++;
  if (stopping_) return id;  // after Stop: never runs
  pending_.emplace(std::make_pair(deadline, id), std::move(fn));
  deadlines_.emplace(id, deadline);
  return id;
}

uint64_t DeadlineTimer::Wakeups() const {
  absl::MutexLock lock(&mu_);
  return wakeups_;
}

void DeadlineTimer::Cancel(Id id) {
  absl::MutexLock lock(&mu_);
  auto it = deadlines_.find(id);
  if (it == deadlines_.end()) return;
  pending_.erase(std::make_pair(it->second, id));
  deadlines_.erase(it);
}

void DeadlineTimer::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (pending_.empty()) {
      mu_.Await(absl::Condition(
          +[](DeadlineTimer* t)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return t->stopping_ || !t->pending_.empty(); },
          this));
      ++wakeups_;
      continue;
    }
    auto first = pending_.begin();
    const absl::Time due = first->first.first;
    if (clock_->Now() < due) {
      // Wake at the deadline, or earlier when an earlier deadline is scheduled or we stop. A
      // Cancel never wakes us (not even of the earliest, nor of the last one): we wake at its
      // deadline at most, find nothing due, and sleep again.
      struct WakeArg {
        DeadlineTimer* timer;
        std::pair<absl::Time, Id> earliest;
      };
      WakeArg arg{this, first->first};
      mu_.AwaitWithDeadline(absl::Condition(
                                +[](WakeArg* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                  DeadlineTimer* t = a->timer;
                                  return t->stopping_ || (!t->pending_.empty() &&
                                                          t->pending_.begin()->first < a->earliest);
                                },
                                &arg),
                            due);
      ++wakeups_;
      continue;
    }
    std::function<void()> fn = std::move(first->second);
    deadlines_.erase(first->first.second);
    pending_.erase(first);
    mu_.Unlock();
    fn();
    mu_.Lock();
  }
}

}  // namespace railyard
