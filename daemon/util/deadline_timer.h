// One thread running callbacks at deadlines. Sleeps when nothing is due (no idle CPU). Unit tests
// make it without a thread on a fake clock and run what is due themselves (RunDue).
//
// Only a deadline earlier than the one the thread sleeps until wakes it. Every collective
// schedules its timeout and cancels it when it completes; waking the thread for those (as this
// did when a Cancel emptied the set, and at the next Schedule) cost each operation two futex
// wake-ups on the submitting thread and two context switches of this one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/util/clock.h"

namespace railyard {

class DeadlineTimer {
 public:
  using Id = uint64_t;

  DeadlineTimer();  // the real clock, its own thread
  // Manual mode: no thread; callbacks run only when RunDue is called (tests, with a fake clock).
  explicit DeadlineTimer(const Clock* clock);
  ~DeadlineTimer();  // Stop()
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // Runs fn on the timer thread at deadline (or soon after). fn must not call Cancel on itself.
  Id Schedule(absl::Time deadline, std::function<void()> fn);
  // Waits for a callback that is running, joins the thread and drops (without running) every
  // pending callback; later Schedules are dropped too. The owner of objects the callbacks use
  // calls it before destroying them: Cancel cannot, since it does not wait for a running one.
  // Idempotent.
  void Stop();
  // Removes a pending callback; a no-op when it already ran or is running.
  void Cancel(Id id);
  // The time deadlines are measured against.
  absl::Time Now() const { return clock_->Now(); }
  // Manual mode: runs, on the caller's thread, every callback due by Now() (including those the
  // callbacks schedule for no later than Now()); returns how many ran.
  int RunDue();
  // How many times the thread has woken from a wait (for tests of what wakes it).
  uint64_t Wakeups() const;

 private:
  void Loop();

  const Clock* const clock_;
  mutable absl::Mutex mu_;
  // (deadline, id) -> callback, ordered by deadline.
  std::map<std::pair<absl::Time, Id>, std::function<void()>> pending_ ABSL_GUARDED_BY(mu_);
  std::map<Id, absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);
  Id next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t wakeups_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace railyard
