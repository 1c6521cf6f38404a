// One thread running callbacks at deadlines. Sleeps when nothing is due (no idle CPU).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace railyard {

class DeadlineTimer {
 public:
  using Id = uint64_t;

  DeadlineTimer();
  ~DeadlineTimer();  // cancels everything pending, joins the thread
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // Runs fn on the timer thread at deadline (or soon after). fn must not call Cancel on itself.
  Id Schedule(absl::Time deadline, std::function<void()> fn);
  // Removes a pending callback; a no-op when it already ran or is running.
  void Cancel(Id id);

 private:
  void Loop();

  absl::Mutex mu_;
  // (deadline, id) -> callback, ordered by deadline.
  std::map<std::pair<absl::Time, Id>, std::function<void()>> pending_ ABSL_GUARDED_BY(mu_);
  std::map<Id, absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);
  Id next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace railyard
