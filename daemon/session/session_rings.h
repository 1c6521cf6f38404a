// The daemon's end of a session's rings (proto/railyard/v1/ring.h): a ring thread (ring_poller.h:
// one per job on this node by default, one per session with --ring_threads=session) takes
// entries off the submission ring, validates each exactly as a gRPC Submit (it calls the same
// SubmitPath::Submit) and writes every outcome to the completion ring, from whichever thread
// completes the operation.
//
// The thread spins for `spin` after a session's last entry or completion (longer, up to `poll`,
// for a client that comes back soon: twice the average time it takes to submit again after a
// completion), then sleeps on the submission doorbell (a futex): an idle session costs no CPU.
// Given a transport to poll (a multi-node daemon), it also keeps going while the session has
// operations in flight, until `poll` has passed since its last entry or completion, and makes
// the transport's progress itself meanwhile (transport::Transport::Poll): a small inter-node
// operation then runs from submission to completion on this one thread, with no progress thread
// to wake on either side.
//
// Everything in the shared memory is the client's to scribble on: indices are bounded, entries
// are copied before they are read, and a client that writes garbage gets error completions (or,
// for a garbage tail, one error completion naming it and nothing taken until it is sane again),
// never a crash or another session's data.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/session/completion_sink.h"
#include "daemon/session/ring_entry.h"
#include "daemon/session/ring_poller.h"
#include "daemon/session/shm_segment.h"
#include "daemon/transport/transport.h"

namespace railyard {

struct RingStats {
  uint64_t submitted = 0;     // entries taken off the submission ring
  uint64_t refused = 0;       // of them, failed at once (malformed or refused by Submit)
  uint64_t completed = 0;     // completions written
  uint64_t wakeups = 0;       // times the thread slept and woke
  uint64_t client_wakes = 0;  // completions that woke a client thread asleep on the doorbell
};

class SessionRings : public CompletionSink, public std::enable_shared_from_this<SessionRings> {
 public:
  // Accepts decoded entries (one, or the consecutive entries of a group, in order): for each, its
  // sequence number or the error its completion carries. Runs on the ring thread; `sink` is where
  // the requests' completions must go (this).
  using SubmitFn = std::function<std::vector<absl::StatusOr<uint64_t>>(
      const std::vector<RingSubmission>& entries, const std::shared_ptr<CompletionSink>& sink)>;

  // Checks that the segment is big enough for the geometry and that its header says so (magic,
  // version, sq_entries, cq_entries: the client wrote them): INVALID_ARGUMENT saying what
  // differs. Resets the daemon-written indices to 0.
  static absl::StatusOr<std::shared_ptr<SessionRings>> Create(
      std::shared_ptr<MappedSegment> segment, uint32_t sq_entries, uint32_t cq_entries,
      absl::Duration spin, absl::Duration poll = absl::ZeroDuration());
  ~SessionRings() override;
  SessionRings(const SessionRings&) = delete;
  SessionRings& operator=(const SessionRings&) = delete;

  // Starts a ring thread of its own. `name` is for logs. `poller`, when not null, is the
  // transport the thread polls while operations are in flight; it must outlive the thread
  // (Stop() or Quiesce()). Either Start() does nothing once Stop() or Quiesce() has begun: rings
  // stopped before they started are never served.
  void Start(SubmitFn submit, std::string name, transport::Transport* poller = nullptr);
  // Serves the rings on a thread of `pollers` shared with the other sessions of `job` (or one of
  // their own, as `pollers` decides).
  void Start(SubmitFn submit, RingPollers& pollers, const std::string& job,
             transport::Transport* poller);
  // Stops taking entries and waits until its ring thread is out of them, joining a thread of its
  // own (from any thread but the ring thread, where it only stops them); later completions are
  // dropped. Idempotent.
  void Stop();
  // Stops taking entries: waits until the ring thread is out of them, then takes once more what
  // the client had published (at most one ring's worth), so every entry published before the
  // call is accepted or refused with a completion. Completions are still written until Stop().
  // Not from the ring thread; a no-op after Stop() or a first Quiesce().
  void Quiesce();

  // CompletionSink: writes the completion to the completion ring and wakes waiting client
  // threads. Each accepted request holds a slot promised to it when it was taken.
  void PostCompletion(uint64_t request_id, const absl::Status& status, uint64_t seq) override;

  uint32_t sq_entries() const { return sq_entries_; }
  uint32_t cq_entries() const { return cq_entries_; }
  RingStats stats() const;

 private:
  friend class RingPoller;
  SessionRings(std::shared_ptr<MappedSegment> segment, uint32_t sq_entries, uint32_t cq_entries,
               absl::Duration spin, absl::Duration poll);
  // Rings the submission doorbell, so that a sleeping ring thread sees stop_.
  void WakeRingThread();
  // Waits until the ring thread is out of these rings (it checks stop_ before it goes in again).
  void WaitOutRingThread();

  // For the ring thread (RingPoller), holding serve_mu_: takes up to `limit` entries; `learn`:
  // counts towards how soon the client submits again after a completion.
  size_t ServeOnce(size_t limit, bool learn);
  // Without serve_mu_ (the ring thread's own state, and atomics):
  bool InFlight() const { return outstanding_.load(std::memory_order_relaxed) > 0; }
  // Until when (absl::GetCurrentTimeNanos) this session wants its ring thread awake: `poll` after
  // its last entry or completion while operations are in flight (given a transport; else
  // `spin`), up to twice the client's usual gap between a completion and its next entry
  // otherwise, not at all while the completion ring is full.
  int64_t AwakeUntil(bool has_transport) const;
  // Says the ring thread sleeps (the client rings the doorbell from now on) and returns the
  // doorbell as read after that; Woken() says it no longer sleeps (`slept`: it did).
  uint32_t PrepareToSleep();
  void Woken(bool slept);
  uint32_t* SqDoorbell() const;
  // Takes what the client published, while the completion ring has room; returns the entries
  // taken. Sets *blocked when entries wait but completions would not fit.
  // Takes at most `limit` entries.
  size_t Drain(bool* blocked, size_t limit = SIZE_MAX);
  // Whether Drain should stop: the ring is stopping, and this is not Quiesce()'s last sweep.
  bool Stopping() const { return stop_.load(std::memory_order_acquire) && !sweeping_; }
  // Takes one entry at head_ of which `avail` slots are published: into batch_ when it decodes,
  // else its refusal is written at once. Returns whether it said the group goes on.
  bool TakeOne(uint64_t avail);
  // Hands batch_ to submit_ and writes the refusals it returns.
  void SubmitBatch();
  bool HasCqRoom();
  void PostLocked(uint64_t request_id, const absl::Status& status, uint64_t seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cq_mu_);
  // Shared-memory words.
  uint64_t* Word64(size_t offset) const;
  uint32_t* Word32(size_t offset) const;

  const std::shared_ptr<MappedSegment> segment_;
  std::byte* const base_;
  const uint32_t sq_entries_;
  const uint32_t cq_entries_;
  const absl::Duration spin_;
  const absl::Duration poll_;
  SubmitFn submit_;
  // The thread serving these rings (null until Start(), and for good when Stop() or Quiesce()
  // came first); own_poller_: started for these alone. Under start_mu_, which orders Start()
  // against a Stop() or Quiesce() on another thread (a session closing while its rings open).
  std::mutex start_mu_;
  std::shared_ptr<RingPoller> poller_;
  bool own_poller_ = false;
  // poller_ and own_poller_ as they are now.
  std::shared_ptr<RingPoller> Poller(bool* own);
  // Held by the ring thread while it takes entries, and through Quiesce()'s sweep.
  std::mutex serve_mu_;
  std::atomic<bool> stop_{false};

  // Ring thread only (or Quiesce()'s sweep, holding serve_mu_).
  int64_t last_ns_ = 0;        // last entry taken, or wake-up
  int64_t last_entry_ns_ = 0;  // last entry taken
  int64_t gap_ns_ = 0;         // average time from a completion to the client's next entry
  bool blocked_ = false;       // entries wait, but their completions would not fit
  uint64_t head_ = 0;          // next submission slot to take
  bool bad_tail_reported_ = false;
  bool sweeping_ = false;  // Quiesce()'s last sweep, on its caller's thread once ours has ended
  std::vector<std::byte> entry_copy_;
  std::vector<std::byte> ext_copy_;
  std::vector<RingSubmission> batch_;

  mutable absl::Mutex cq_mu_;
  bool stopped_ ABSL_GUARDED_BY(cq_mu_) = false;
  uint64_t cq_tail_ ABSL_GUARDED_BY(cq_mu_) = 0;
  // Completions promised a slot: accepted requests (and refusals) not yet written.
  uint64_t reserved_ ABSL_GUARDED_BY(cq_mu_) = 0;
  // reserved_ as the spinning ring thread reads it without the lock, and when the last
  // completion was written (absl::GetCurrentTimeNanos).
  std::atomic<uint64_t> outstanding_{0};
  std::atomic<int64_t> last_completion_ns_{0};
  RingStats stats_ ABSL_GUARDED_BY(cq_mu_);
};

}  // namespace railyard
