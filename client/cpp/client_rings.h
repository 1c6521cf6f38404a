// The client's end of the session rings (proto/railyard/v1/ring.h): publishes submissions as ring
// entries and reads completions off the completion ring, on the threads that submit and wait (no
// reader thread in between). Thread-safe: any number of threads may submit and wait at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "railyard/v1/local.pb.h"

namespace railyard::internal {

// How many fork()s separate this process from the program's first one (a pthread_atfork child
// handler counts them): an object that recorded another value was inherited from a parent. Its
// session, rings and buffers are the parent's, shared with the daemon: a child must not touch
// them, nor take their locks (a parent's thread may have held one at the fork).
uint64_t ForkGeneration();

class ClientRings {
 public:
  // Called for every completion read, with the ring's lock held (it must not submit). flags:
  // ringproto::kCqFlag* (kCqFlagMoved: handed back untaken, not an outcome).
  using OnCompletion =
      std::function<void(uint64_t request_id, absl::Status status, uint64_t seq, uint32_t flags)>;

  // Creates the rings memfd (sealed like a buffer) and writes its header. *memfd is the
  // descriptor to PUT on the side channel (the caller closes it afterwards).
  static absl::StatusOr<std::unique_ptr<ClientRings>> Create(const std::string& job,
                                                             uint32_t sq_entries,
                                                             uint32_t cq_entries,
                                                             std::chrono::microseconds spin,
                                                             int* memfd);
  ~ClientRings();
  ClientRings(const ClientRings&) = delete;
  ClientRings& operator=(const ClientRings&) = delete;

  void SetOnCompletion(OnCompletion fn) { on_completion_ = std::move(fn); }

  // One entry of a SubmitRequest (request_id and all fields but session_id). group_next: the
  // next entry published belongs to the same group.
  static absl::Status Encode(const v1::SubmitRequest& req, bool group_next,
                             std::vector<std::byte>* out);
  // Publishes encoded entries (whole groups at once), waiting for room while reading completions.
  // FAILED_PRECONDITION once closed; INVALID_ARGUMENT when they could never fit the ring.
  // on_slot, if set, hears the first entry's slot index before the daemon can see the entries.
  absl::Status Publish(const std::vector<std::byte>& entries,
                       const std::function<void(uint64_t first_slot)>& on_slot = nullptr);
  // After Close(): returns once no Publish is writing entries; every entry published has had its
  // on_slot, every later Publish fails.
  void FenceSubmissions() { std::lock_guard<std::mutex> lock(sq_mu_); }
  // The daemon's head: entries at slots below it were taken by the daemon; the rest never were
  // (it copies an entry out, and moves its head past it, before it acts on it). Clamped to what
  // this client published.
  uint64_t ConsumedHead() const;

  // Reads the completions there are; returns how many.
  size_t Drain();
  // Waits until done() (checked after every completion read) or until deadline: spins for the
  // spin time, then sleeps on the completion doorbell. Returns done().
  bool WaitUntil(const std::function<bool()>& done, std::chrono::steady_clock::time_point deadline);
  // Wakes every waiter and makes later Publish calls fail (the session has ended).
  void Close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  // In a child forked after the rings were made: Publish fails (FAILED_PRECONDITION), Drain reads
  // nothing and WaitUntil returns at once.
  bool forked() const { return ForkGeneration() != fork_generation_; }

  uint32_t sq_entries() const { return sq_entries_; }
  uint32_t cq_entries() const { return cq_entries_; }

 private:
  ClientRings(std::byte* base, size_t bytes, uint32_t sq, uint32_t cq,
              std::chrono::microseconds spin)
      : base_(base), bytes_(bytes), sq_entries_(sq), cq_entries_(cq), spin_(spin) {}
  size_t DrainLocked();
  void WakeDaemonIfWaiting();
  // One wait for room in a full submission ring (Publish, without sq_mu_): reads completions,
  // else spins up to spin_ after `started`, else sleeps on the completion doorbell (bounded).
  void AwaitRoom(std::chrono::steady_clock::time_point started);
  uint64_t* Word64(size_t off) const { return reinterpret_cast<uint64_t*>(base_ + off); }
  uint32_t* Word32(size_t off) const { return reinterpret_cast<uint32_t*>(base_ + off); }

  std::byte* const base_;
  const size_t bytes_;
  const uint32_t sq_entries_;
  const uint32_t cq_entries_;
  const std::chrono::microseconds spin_;
  OnCompletion on_completion_;
  std::atomic<bool> closed_{false};
  const uint64_t fork_generation_ = ForkGeneration();

  mutable std::mutex sq_mu_;
  uint64_t sq_tail_ = 0;  // guarded by sq_mu_
  std::mutex cq_mu_;
  uint64_t cq_head_ = 0;  // guarded by cq_mu_
};

}  // namespace railyard::internal
