// Test helpers for the session rings (session_rings_test, ring_poller_test): both ends of one
// set of rings over a real sealed memfd (the client's ClientRings, the daemon's SessionRings),
// with a fake in place of SubmitPath::Submit.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/cpp/client_rings.h"
#include "daemon/session/ring_entry.h"
#include "daemon/session/ring_poller.h"
#include "daemon/session/session_rings.h"
#include "gtest/gtest.h"
#include "proto/railyard/v1/ring.h"

namespace railyard::ring_testing {

namespace rp = ringproto;
using Clock = std::chrono::steady_clock;

// Stands in for SubmitPath::Submit: records what it was given, and completes it at once, later
// (Complete) or refuses it.
class FakeSubmit {
 public:
  enum class Mode { kCompleteNow, kHold, kRefuse };
  explicit FakeSubmit(Mode mode) : mode_(mode) {}

  absl::StatusOr<uint64_t> operator()(const RingSubmission& entry,
                                      const std::shared_ptr<CompletionSink>& sink) {
    uint64_t seq;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++entered_;
      gate_cv_.wait_for(lock, std::chrono::seconds(10), [&] { return !gated_; });
      seq = next_seq_++;
      seen_.push_back(entry);
      if (mode_ == Mode::kHold) held_.push_back({entry.request.request_id(), seq, sink});
    }
    if (mode_ == Mode::kRefuse) return absl::InvalidArgumentError("refused by the fake");
    if (mode_ == Mode::kCompleteNow) sink->PostCompletion(entry.request.request_id(), {}, seq);
    return seq;
  }
  // Calls from now on wait (10 s at most) until Open().
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    gated_ = true;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      gated_ = false;
    }
    gate_cv_.notify_all();
  }
  // Calls that have begun, including those waiting at the gate.
  size_t entered() {
    std::lock_guard<std::mutex> lock(mu_);
    return entered_;
  }
  // Completes every held request.
  void CompleteHeld() {
    std::vector<Held> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      held.swap(held_);
    }
    for (auto& h : held) {
      if (auto s = h.sink.lock()) s->PostCompletion(h.request_id, absl::OkStatus(), h.seq);
    }
  }
  size_t seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_.size();
  }
  RingSubmission seen_at(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_.at(i);
  }

 private:
  struct Held {
    uint64_t request_id;
    uint64_t seq;
    std::weak_ptr<CompletionSink> sink;
  };
  const Mode mode_;
  std::mutex mu_;
  std::condition_variable gate_cv_;
  bool gated_ = false;
  size_t entered_ = 0;
  uint64_t next_seq_ = 0;
  std::vector<RingSubmission> seen_;
  std::vector<Held> held_;
};

struct Outcome {
  absl::Status status;
  uint64_t seq = 0;
  uint32_t flags = 0;  // ringproto::kCqFlag*
  int times = 0;
};

// Sizes of the batches the ring threads handed over, in order.
inline std::mutex batches_mu;
inline std::vector<size_t> batches_seen;

// The fake's stand-in for SubmitPath::Submit, as the daemon gives it to SessionRings::Start.
inline SessionRings::SubmitFn SubmitTo(std::shared_ptr<FakeSubmit> fake) {
  return [f = std::move(fake)](const std::vector<RingSubmission>& entries,
                               const std::shared_ptr<CompletionSink>& sink) {
    std::vector<absl::StatusOr<uint64_t>> out;
    for (const RingSubmission& e : entries) out.push_back((*f)(e, sink));
    std::lock_guard<std::mutex> lock(batches_mu);
    batches_seen.push_back(entries.size());
    return out;
  };
}

// Both ends of one set of rings.
class RingPair {
 public:
  // Served by a ring thread of their own.
  RingPair(uint32_t sq, uint32_t cq, std::shared_ptr<FakeSubmit> fake,
           std::chrono::microseconds spin = std::chrono::microseconds(50),
           transport::Transport* poller = nullptr, absl::Duration poll = absl::ZeroDuration())
      : fake_(std::move(fake)) {
    Open(sq, cq, spin, poll);
    daemon_->Start(SubmitTo(fake_), "unit", poller);
  }
  // Served by a thread of `pollers`, as a session of `job`.
  RingPair(uint32_t sq, uint32_t cq, std::shared_ptr<FakeSubmit> fake, RingPollers& pollers,
           const std::string& job)
      : fake_(std::move(fake)) {
    Open(sq, cq, std::chrono::microseconds(50), absl::ZeroDuration());
    daemon_->Start(SubmitTo(fake_), pollers, job, nullptr);
  }
  // Not served yet: the test calls daemon_->Start() (SubmitTo(fake_)) itself.
  struct NotStarted {};
  RingPair(uint32_t sq, uint32_t cq, std::shared_ptr<FakeSubmit> fake, NotStarted)
      : fake_(std::move(fake)) {
    Open(sq, cq, std::chrono::microseconds(50), absl::ZeroDuration());
  }
  void Open(uint32_t sq, uint32_t cq, std::chrono::microseconds spin, absl::Duration poll) {
    int fd = -1;
    auto client = internal::ClientRings::Create("unit", sq, cq, spin, &fd);
    EXPECT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    client_->SetOnCompletion([this](uint64_t id, absl::Status st, uint64_t seq, uint32_t flags) {
      std::lock_guard<std::mutex> lock(mu_);
      Outcome& o = outcomes_[id];
      o.status = std::move(st);
      o.seq = seq;
      o.flags = flags;
      ++o.times;
    });
    auto seg = MappedSegment::MapMemfd(UniqueFd(fd), rp::RingBytes(sq, cq));
    EXPECT_TRUE(seg.ok()) << seg.status();
    segment_ = *seg;
    auto rings = SessionRings::Create(segment_, sq, cq,
                                      absl::FromChrono(std::chrono::microseconds(spin)), poll);
    EXPECT_TRUE(rings.ok()) << rings.status();
    daemon_ = *std::move(rings);
  }
  ~RingPair() {
    daemon_->Stop();
    client_->Close();
  }

  // Appends the ring entry of an AllReduce with request_id id (and count id) to *bytes.
  static absl::Status EncodeAllReduce(uint64_t id, bool group_next, std::vector<std::byte>* bytes) {
    v1::SubmitRequest r;
    r.set_request_id(id);
    r.set_comm_handle(7);
    r.set_op(v1::COLLECTIVE_OP_ALL_REDUCE);
    r.set_dtype(v1::DATA_TYPE_FLOAT32);
    r.set_red_op(v1::RED_OP_SUM);
    r.set_count(id);
    return internal::ClientRings::Encode(r, group_next, bytes);
  }
  // Publishes one AllReduce entry with request_id id.
  absl::Status Submit(uint64_t id, bool group_next = false) {
    std::vector<std::byte> bytes;
    if (absl::Status s = EncodeAllReduce(id, group_next, &bytes); !s.ok()) return s;
    return client_->Publish(bytes);
  }
  bool WaitFor(uint64_t id, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    return client_->WaitUntil([&] { return Has(id); }, Clock::now() + limit);
  }
  bool Has(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return outcomes_.count(id) > 0;
  }
  Outcome Get(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return outcomes_[id];
  }
  size_t CompletionCount() {
    std::lock_guard<std::mutex> lock(mu_);
    return outcomes_.size();
  }
  // The shared memory as the client sees it (to write what a hostile client would).
  std::byte* base() const { return segment_->data(); }
  uint64_t& Word64(size_t off) const { return *reinterpret_cast<uint64_t*>(base() + off); }
  uint32_t& Word32(size_t off) const { return *reinterpret_cast<uint32_t*>(base() + off); }
  // Publishes raw slots at the tail, bypassing the client library (it is not told).
  void PublishRaw(const std::vector<std::byte>& slots, uint32_t sq) {
    uint64_t tail = __atomic_load_n(&Word64(rp::kOffSqTail), __ATOMIC_ACQUIRE);
    for (size_t i = 0; i < slots.size() / rp::kSqEntryBytes; ++i) {
      std::memcpy(base() + rp::SqOffset() + ((tail + i) & (sq - 1)) * rp::kSqEntryBytes,
                  slots.data() + i * rp::kSqEntryBytes, rp::kSqEntryBytes);
    }
    __atomic_store_n(&Word64(rp::kOffSqTail), tail + slots.size() / rp::kSqEntryBytes,
                     __ATOMIC_RELEASE);
    __atomic_fetch_add(&Word32(rp::kOffSqDoorbell), 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &Word32(rp::kOffSqDoorbell), 1 /*FUTEX_WAKE*/, 1, nullptr, nullptr, 0);
  }

  std::shared_ptr<FakeSubmit> fake_;
  std::unique_ptr<internal::ClientRings> client_;
  std::shared_ptr<MappedSegment> segment_;
  std::shared_ptr<SessionRings> daemon_;
  std::mutex mu_;
  std::map<uint64_t, Outcome> outcomes_;
};

inline bool Eventually(const std::function<bool()>& pred,
                       std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

}  // namespace railyard::ring_testing
