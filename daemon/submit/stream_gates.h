// Submissions held until their stream reaches them (SubmitRequest.stream_sync, stream_sync.h).
// Holding keeps order: per queue (a session's ranks on one communicator) nothing passes an item
// held before it, so sequence numbers are assigned in the order the rank submitted. One thread
// polls the ready word of each queue's front item: it spins for `spin` after the last item it
// let go, then sleeps between polls, 20 us doubling up to `longest_sleep`, and longer while nothing
// opens (up to 1/64 of the time since the last item went, at most 10 ms: a gate that stays
// closed costs a poll every 10 ms, not a core); with nothing held it sleeps until something is
// (no CPU). Each round lets go of at most one item per queue, so the queues take turns. An item
// whose deadline passes first expires (DEADLINE_EXCEEDED saying what its ready word holds); the
// ones behind it go on. Held items are bounded per queue, per session, per job and in all
// (Limits): each costs the daemon about a kilobyte for as long as its deadline.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/comm/stream_sync.h"

namespace railyard {

// How many operations may be held at once.
struct StreamGateLimits {
  size_t per_queue = 4096;    // one rank's, on one communicator
  size_t per_session = 8192;  // --max_held_ops_per_session
  size_t per_job = 16384;     // --max_held_ops_per_job
  size_t total = 65536;       // the daemon's backstop
};

class StreamGates {
 public:
  struct Key {
    const void* owner = nullptr;  // the session
    uint64_t handle = 0;          // its communicator
    bool operator<(const Key& o) const {
      return owner != o.owner ? owner < o.owner : handle < o.handle;
    }
  };
  struct Item {
    std::optional<StreamSync> gate;  // none: it waits only for the items before it
    absl::Time deadline = absl::InfiniteFuture();
    // The gate opened: submit it now, then call done (once, from any thread: the queue lets
    // nothing behind it go until then, so a release may hand its work to another thread).
    std::function<void(std::function<void()> done)> release;
    std::function<void(const absl::Status&)> fail;  // it expired or was dropped
  };

  using Limits = StreamGateLimits;
  explicit StreamGates(absl::Duration spin, absl::Duration longest_sleep = absl::Microseconds(100),
                       Limits limits = Limits());
  // Stop()s.
  ~StreamGates();
  // Stops the poller thread, waits for releases still running elsewhere to call done; items
  // still held fail with UNAVAILABLE, and so does every Hold from then on. Idempotent.
  void Stop();
  StreamGates(const StreamGates&) = delete;
  StreamGates& operator=(const StreamGates&) = delete;

  // Whether a submission on `key` with this gate must be held: something is held there, or the
  // gate is closed.
  bool MustHold(const Key& key, const std::optional<StreamSync>& gate) const;
  // RESOURCE_EXHAUSTED naming the limit (and its flag) when `key`, its session, `job` or the
  // daemon already holds as many items as Limits allows (the item is not taken).
  absl::Status Hold(const Key& key, const std::string& job, Item item);
  // Fails every item `owner` has held with `why` (one being let go at the time goes on); the
  // second, those of one queue.
  void Drop(const void* owner, const absl::Status& why);
  void Drop(const Key& key, const absl::Status& why);

  size_t held() const;
  uint64_t polls() const;  // rounds of polling so far (tests: the poller sleeps when idle)

 private:
  struct Queue {
    std::deque<Item> items;
    bool busy = false;  // its front item's release or fail is running
    std::string job;    // of the session that holds it
  };
  // Counts n items of queue `it` (its session and job) as no longer held.
  void ForgetLocked(const Key& key, const Queue& q, size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();
  // The front item of `key` is done with: the queue's next may go.
  void Finish(const Key& key);
  std::map<Key, Queue>::iterator EraseLocked(std::map<Key, Queue>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the items of queue `it` but a busy front, erasing it when nothing is left.
  std::map<Key, Queue>::iterator TakeLocked(std::map<Key, Queue>::iterator it,
                                            std::vector<Item>* taken)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration spin_;
  const absl::Duration longest_sleep_;
  const Limits limits_;
  mutable absl::Mutex mu_;
  std::map<Key, Queue> queues_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> queue_count_{0};  // queues_.size(), read without the lock by MustHold
  size_t held_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<const void*, size_t> held_by_session_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> held_by_job_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t polls_ ABSL_GUARDED_BY(mu_) = 0;
  size_t releasing_ ABSL_GUARDED_BY(mu_) = 0;  // releases whose done has not come yet
  std::thread thread_;
};

}  // namespace railyard
