// The threads that serve session rings (session_rings.h). A RingPoller is one thread serving up to
// kMaxRings sessions' rings round-robin: each pass takes at most kPerPass entries from each, so
// one session's stream of submissions delays the others by a bounded amount; it spins while any
// of them wants it awake (SessionRings::AwakeUntil), then sleeps on all their doorbells at once
// (futex_waitv, Linux 5.16+) and its own wake word.
//
// RingPollers decides which sessions share a thread: the sessions of one job on this node
// (--ring_threads=job, the default), or every session its own (--ring_threads=session, and
// wherever the kernel or a seccomp profile refuses futex_waitv). Sharing within a job costs no
// tenant anything: a job's local ranks take part in the same collectives, so they wait for each
// other anyway. What it saves is CPU: two ranks of a job on two cores otherwise have two ring
// threads spinning beside them; with one, the ranks keep more of the cores.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/transport/transport.h"

namespace railyard {

class SessionRings;

class RingPoller : public std::enable_shared_from_this<RingPoller> {
 public:
  // Sessions one thread serves at most (and doorbells it sleeps on: futex_waitv takes 128).
  static constexpr size_t kMaxRings = 64;
  // Entries taken from one session per pass.
  static constexpr size_t kPerPass = 64;

  // `transport`, when not null, is polled while operations are in flight; it must outlive the
  // thread (Stop()).
  RingPoller(std::string name, transport::Transport* transport);
  ~RingPoller();
  RingPoller(const RingPoller&) = delete;
  RingPoller& operator=(const RingPoller&) = delete;

  // Serves `rings` from now on, starting the thread with the first. False when this poller is
  // full, stopped, or has ended because its last session stopped: use another.
  bool Add(std::shared_ptr<SessionRings> rings);
  // Ends the thread and joins it (unless called on it). Sessions it served are no longer taken
  // from. Idempotent.
  void Stop();
  bool OnThread() const { return tid_.load() == std::this_thread::get_id(); }
  // Whether the thread has ended (Stop(), or its last session stopped).
  bool ended() const;

  // Whether this kernel (and its seccomp profile) lets a thread wait on several futexes.
  static bool CanWaitOnMany();

 private:
  // Wakes the thread if it sleeps on its wake word (a session added, or Stop()).
  void Wake();
  void Loop();
  // Sleeps until a doorbell of `rings`, or the wake word, moves from the value read, or
  // `limit_ns` passes.
  void Sleep(const std::vector<std::shared_ptr<SessionRings>>& rings,
             const std::vector<uint32_t>& seen, uint32_t wake_seen, int64_t limit_ns);

  const std::string name_;
  transport::Transport* const transport_;
  std::atomic<std::thread::id> tid_{};
  std::atomic<bool> stop_{false};
  std::atomic<bool> added_pending_{false};
  alignas(4) uint32_t wake_word_ = 0;  // futex word, private to this process
  std::mutex join_mu_;                 // one joiner at a time
  std::thread thread_;                 // set under mu_ (started_)

  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<SessionRings>> added_ ABSL_GUARDED_BY(mu_);
  size_t serving_ ABSL_GUARDED_BY(mu_) = 0;  // sessions the thread holds
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
};

// The daemon's ring threads, by job.
class RingPollers {
 public:
  enum class Mode { kPerJob, kPerSession };
  // kPerJob falls back to kPerSession where CanWaitOnMany() is false.
  explicit RingPollers(Mode mode);
  ~RingPollers();
  RingPollers(const RingPollers&) = delete;
  RingPollers& operator=(const RingPollers&) = delete;

  // Serves `rings` (a session of `job`) on a thread of the job's, or a new one. `transport` as
  // for RingPoller (the daemon's, set before any session opens rings). Returns the thread's
  // poller; false-free: a stopped registry still starts a thread, which Stop()ing the rings ends.
  std::shared_ptr<RingPoller> Serve(const std::string& job, std::shared_ptr<SessionRings> rings,
                                    transport::Transport* transport);
  // Ends every thread (daemon shutdown: after the sessions' rings are stopped or quiesced).
  void StopAll();
  // Threads running now.
  size_t threads() const;
  // Pollers held: the running ones, and ended ones not yet joined (until the next Serve()).
  size_t held() const;
  Mode mode() const { return mode_; }

 private:
  const Mode mode_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::vector<std::shared_ptr<RingPoller>>> by_job_ ABSL_GUARDED_BY(mu_);
};

}  // namespace railyard
