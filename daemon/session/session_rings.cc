#include "daemon/session/session_rings.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/util/log.h"
#include "daemon/util/thread_name.h"
#include "proto/railyard/v1/ring.h"
#include "proto/railyard/v1/ring_futex.h"

namespace railyard {

namespace rp = ringproto;

namespace {

// The longest the thread sleeps without looking (a lost wake-up, or a client that rewrote a
// doorbell, costs at most this).
constexpr absl::Duration kMaxSleep = absl::Seconds(1);

using ringproto::CpuRelax;
using ringproto::FutexWake;

void FutexWait(uint32_t* word, uint32_t expected, absl::Duration limit) {
  ringproto::FutexWait(word, expected, absl::ToInt64Nanoseconds(limit));
}

template <typename T>
T LoadRelaxed(const T* p) {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}

}  // namespace

uint64_t* SessionRings::Word64(size_t offset) const {
  return reinterpret_cast<uint64_t*>(base_ + offset);
}
uint32_t* SessionRings::Word32(size_t offset) const {
  return reinterpret_cast<uint32_t*>(base_ + offset);
}

absl::StatusOr<std::shared_ptr<SessionRings>> SessionRings::Create(
    std::shared_ptr<MappedSegment> segment, uint32_t sq_entries, uint32_t cq_entries,
    absl::Duration spin, absl::Duration poll) {
  if (!rp::ValidEntries(sq_entries) || !rp::ValidEntries(cq_entries)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring entries must be powers of two in [", rp::kMinEntries, ", ", rp::kMaxEntries,
        "], not sq_entries ", sq_entries, " cq_entries ", cq_entries));
  }
  const uint64_t need = rp::RingBytes(sq_entries, cq_entries);
  if (segment == nullptr || segment->size() != need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rings of ", sq_entries, " submission and ", cq_entries, " completion entries take ", need,
        " bytes, the memfd maps ", segment == nullptr ? 0 : segment->size()));
  }
  const std::byte* h = segment->data();
  uint32_t magic, version, sq, cq;
  std::memcpy(&magic, h + rp::kOffMagic, 4);
  std::memcpy(&version, h + rp::kOffVersion, 4);
  std::memcpy(&sq, h + rp::kOffSqEntries, 4);
  std::memcpy(&cq, h + rp::kOffCqEntries, 4);
  if (magic != rp::kMagic) {
    return absl::InvalidArgumentError(absl::StrCat("ring header magic 0x", absl::Hex(magic),
                                                   " is not 0x", absl::Hex(rp::kMagic), " (RYRG)"));
  }
  if (version != rp::kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("ring layout version ", version,
                                                   " is not supported (this daemon speaks ",
                                                   rp::kVersion, ")"));
  }
  if (sq != sq_entries || cq != cq_entries) {
    return absl::InvalidArgumentError(absl::StrCat("ring header says ", sq, " submission and ", cq,
                                                   " completion entries, the request ", sq_entries,
                                                   " and ", cq_entries));
  }
  std::shared_ptr<SessionRings> rings(
      new SessionRings(std::move(segment), sq_entries, cq_entries, spin, poll));
  return rings;
}

SessionRings::SessionRings(std::shared_ptr<MappedSegment> segment, uint32_t sq_entries,
                           uint32_t cq_entries, absl::Duration spin, absl::Duration poll)
    : segment_(std::move(segment)),
      base_(segment_->data()),
      sq_entries_(sq_entries),
      cq_entries_(cq_entries),
      spin_(spin),
      poll_(std::max(spin, poll)),
      entry_copy_(rp::kSqEntryBytes) {
  __atomic_store_n(Word64(rp::kOffSqHead), 0, __ATOMIC_RELEASE);
  __atomic_store_n(Word64(rp::kOffCqTail), 0, __ATOMIC_RELEASE);
  __atomic_store_n(Word32(rp::kOffDaemonSleeping), 0, __ATOMIC_RELEASE);
}

SessionRings::~SessionRings() {
  Stop();
  if (thread_.joinable()) thread_.detach();  // only when the thread itself let go last
}

void SessionRings::Start(SubmitFn submit, std::string name, transport::Transport* poller) {
  submit_ = std::move(submit);
  poller_ = poller;
  // The thread keeps the rings (and their mapping) alive until it has stopped.
  thread_ = std::thread([self = shared_from_this(), name = std::move(name)] {
    self->ring_tid_.store(std::this_thread::get_id());
    NameThisThread("ry-rings");
    Log(LogLevel::kDebug, "rings", "serving", {F("session", name)});
    self->Loop();
  });
}

void SessionRings::WakeRingThread() {
  __atomic_fetch_add(Word32(rp::kOffSqDoorbell), 1, __ATOMIC_SEQ_CST);
  FutexWake(Word32(rp::kOffSqDoorbell), INT_MAX);
}

void SessionRings::Stop() {
  {
    absl::MutexLock lock(&cq_mu_);
    stopped_ = true;
  }
  if (!stop_.exchange(true)) WakeRingThread();
  if (OnRingThread()) return;                  // it ends when this call returns to its loop
  std::lock_guard<std::mutex> lock(join_mu_);  // after a Quiesce() sweeping now, too
  if (thread_.joinable()) thread_.join();
}

void SessionRings::Quiesce() {
  if (stop_.exchange(true)) return;  // stopped (or quiesced) already
  WakeRingThread();
  if (OnRingThread()) return;
  std::lock_guard<std::mutex> lock(join_mu_);
  if (!thread_.joinable()) return;
  thread_.join();
  // The ring thread has ended: head_ and batch_ are this thread's now. Bounded, so a client that
  // keeps publishing cannot hold the caller.
  sweeping_ = true;
  bool blocked = false;
  Drain(&blocked, sq_entries_);
  sweeping_ = false;
}

RingStats SessionRings::stats() const {
  absl::MutexLock lock(&cq_mu_);
  return stats_;
}

void SessionRings::Loop() {
  // Last entry taken (or wake-up); completions count too, through last_completion_ns_.
  int64_t last_ns = absl::GetCurrentTimeNanos();
  uint32_t spins = 0;
  // Registered with the transport as a poller: from every wake-up to the next sleep, so that the
  // transfers this thread starts are not handed to a progress thread that must be woken.
  bool polling = false;
  auto begin_polling = [&] {
    if (poller_ != nullptr && !polling) {
      poller_->BeginPolling();
      polling = true;
    }
  };
  auto end_polling = [&] {
    if (polling) {
      poller_->EndPolling();
      polling = false;
    }
  };
  const int64_t spin_ns = absl::ToInt64Nanoseconds(spin_);
  const int64_t poll_ns = poller_ != nullptr ? absl::ToInt64Nanoseconds(poll_) : spin_ns;
  // How soon this client submits again once its operations have completed: an average of the
  // gaps shorter than kLearnGapNs. With nothing in flight the thread spins up to twice that (at
  // least spin_, at most poll_) after the last completion, so a client that comes back within
  // tens of microseconds (a Python loop spends 30-60 us between operations) finds it awake,
  // and one that computes for milliseconds in between costs only spin_.
  constexpr int64_t kLearnGapNs = 1000000;
  const int64_t idle_cap_ns = std::max(spin_ns, absl::ToInt64Nanoseconds(poll_));
  int64_t gap_ns = 0;
  int64_t last_entry_ns = last_ns;
  begin_polling();
  while (!stop_.load(std::memory_order_acquire)) {
    bool blocked = false;
    const bool idle_before = outstanding_.load(std::memory_order_relaxed) == 0;
    // Both before Drain, which may complete what it takes.
    const int64_t completed = last_completion_ns_.load(std::memory_order_relaxed);
    const int64_t drain_ns = absl::GetCurrentTimeNanos();
    if (Drain(&blocked) > 0) {
      if (idle_before && completed > last_entry_ns && drain_ns - completed < kLearnGapNs) {
        const int64_t gap = std::max<int64_t>(0, drain_ns - completed);
        gap_ns = gap_ns == 0 ? gap : (7 * gap_ns + gap) / 8;
      }
      last_entry_ns = drain_ns;
      last_ns = absl::GetCurrentTimeNanos();
      spins = 0;
      continue;
    }
    // Nothing to take (or no room for its completion: the client reads completions, and its
    // operations in flight make more). With operations in flight, make their progress here
    // (a client that queues many keeps both daemons' ring threads polling, so no message waits
    // for a progress thread to wake); either way spin a while, yielding the CPU to the threads
    // we wait for (on a small host they share our core), then sleep.
    const bool in_flight = outstanding_.load(std::memory_order_relaxed) > 0;
    const bool poll = polling && in_flight;
    if (poll && poller_->Poll()) spins = 0;
    if (!poll && (++spins & 63) != 0) {
      CpuRelax();
      continue;
    }
    const int64_t since = absl::GetCurrentTimeNanos() -
                          std::max(last_ns, last_completion_ns_.load(std::memory_order_relaxed));
    const int64_t idle_ns = std::clamp(2 * gap_ns, spin_ns, idle_cap_ns);
    if (since < (in_flight ? poll_ns : (blocked ? 0 : idle_ns))) {
      // Polling is a system call already (the transport's epoll); yielding after each would
      // double what a poll costs where system calls are dear (a paravirtualised guest).
      if (!poll || (++spins & 7) == 0) sched_yield();
      continue;
    }
    uint32_t* doorbell = Word32(rp::kOffSqDoorbell);
    __atomic_store_n(Word32(rp::kOffDaemonSleeping), 1, __ATOMIC_SEQ_CST);
    const uint32_t ring = __atomic_load_n(doorbell, __ATOMIC_SEQ_CST);
    blocked = false;
    if (stop_.load(std::memory_order_acquire)) break;
    if (Drain(&blocked) > 0) {
      __atomic_store_n(Word32(rp::kOffDaemonSleeping), 0, __ATOMIC_RELAXED);
      last_ns = absl::GetCurrentTimeNanos();
      continue;
    }
    end_polling();
    FutexWait(doorbell, ring, kMaxSleep);
    __atomic_store_n(Word32(rp::kOffDaemonSleeping), 0, __ATOMIC_RELAXED);
    {
      absl::MutexLock lock(&cq_mu_);
      ++stats_.wakeups;
    }
    spins = 0;
    last_ns = absl::GetCurrentTimeNanos();
    begin_polling();
  }
  end_polling();
}

bool SessionRings::HasCqRoom() {
  absl::MutexLock lock(&cq_mu_);
  // The client's head, bounded to what can be true: unread completions are in [0, cq_entries].
  uint64_t head = LoadRelaxed(Word64(rp::kOffCqHead));
  if (head > cq_tail_) head = cq_tail_;
  const uint64_t unread = cq_tail_ - head > cq_entries_ ? cq_entries_ : cq_tail_ - head;
  return reserved_ + unread < cq_entries_;
}

size_t SessionRings::Drain(bool* blocked, size_t limit) {
  size_t taken = 0;
  while (!Stopping() && taken < limit) {
    const uint64_t tail = __atomic_load_n(Word64(rp::kOffSqTail), __ATOMIC_ACQUIRE);
    const uint64_t avail = tail - head_;
    if (avail == 0) return taken;
    if (avail > sq_entries_) {
      // Not a tail the client can have written honestly: nothing is taken until it is sane.
      if (!bad_tail_reported_ && HasCqRoom()) {
        bad_tail_reported_ = true;
        absl::MutexLock lock(&cq_mu_);
        ++reserved_;
        outstanding_.store(reserved_, std::memory_order_relaxed);
        ++stats_.refused;
        PostLocked(0,
                   absl::InvalidArgumentError(absl::StrCat(
                       "submission ring tail ", tail, " is ", avail, " slots ahead of head ", head_,
                       " (the ring holds ", sq_entries_,
                       "): the client corrupted its ring; no entry is taken until the tail is "
                       "within the ring")),
                   0);
      }
      return taken;
    }
    bad_tail_reported_ = false;
    // One entry, or a whole group as far as it is published (its last rank's entries then run
    // fused): each with a completion slot promised.
    constexpr size_t kMaxBatch = 64;
    bool more = true;
    while (more && batch_.size() < kMaxBatch && taken < limit && !Stopping()) {
      const uint64_t now_avail = __atomic_load_n(Word64(rp::kOffSqTail), __ATOMIC_ACQUIRE) - head_;
      if (now_avail == 0 || now_avail > sq_entries_) break;
      if (!HasCqRoom()) {
        *blocked = batch_.empty();
        break;
      }
      more = TakeOne(now_avail);
      ++taken;
    }
    if (!batch_.empty()) SubmitBatch();
    if (*blocked) return taken;
  }
  return taken;
}

void SessionRings::SubmitBatch() {
  std::vector<absl::StatusOr<uint64_t>> results = submit_(batch_, shared_from_this());
  for (size_t i = 0; i < batch_.size(); ++i) {
    const absl::Status s =
        i < results.size() ? results[i].status() : absl::InternalError("no outcome for the entry");
    if (s.ok()) continue;
    absl::MutexLock lock(&cq_mu_);
    ++stats_.refused;
    PostLocked(batch_[i].request.request_id(), s, 0);
  }
  batch_.clear();
}

bool SessionRings::TakeOne(uint64_t avail) {
  const std::byte* sq = base_ + rp::SqOffset();
  auto slot = [&](uint64_t i) { return sq + (i & (sq_entries_ - 1)) * rp::kSqEntryBytes; };
  std::memcpy(entry_copy_.data(), slot(head_), rp::kSqEntryBytes);
  const uint64_t request_id = RingEntryRequestId(entry_copy_);
  const uint32_t ext_slots = RingEntryExtSlots(entry_copy_);
  absl::StatusOr<RingSubmission> decoded;
  uint64_t used = 1;
  if (ext_slots >= avail) {
    decoded = absl::InvalidArgumentError(
        absl::StrCat("ring entry at slot ", head_, " says ", ext_slots,
                     " extension slots follow, but only ", avail - 1, " are published"));
  } else {
    ext_copy_.resize(static_cast<size_t>(ext_slots) * rp::kSqEntryBytes);
    for (uint32_t i = 0; i < ext_slots; ++i) {
      std::memcpy(ext_copy_.data() + static_cast<size_t>(i) * rp::kSqEntryBytes,
                  slot(head_ + 1 + i), rp::kSqEntryBytes);
    }
    used += ext_slots;
    decoded = DecodeRingEntry(entry_copy_, ext_copy_);
  }
  {
    absl::MutexLock lock(&cq_mu_);
    ++reserved_;  // promised before anything can complete it
    outstanding_.store(reserved_, std::memory_order_relaxed);
    ++stats_.submitted;
  }
  // The slots are ours now (copied): the client may reuse them.
  head_ += used;
  __atomic_store_n(Word64(rp::kOffSqHead), head_, __ATOMIC_RELEASE);
  if (!decoded.ok()) {
    absl::MutexLock lock(&cq_mu_);
    ++stats_.refused;
    PostLocked(request_id, decoded.status(), 0);
    return false;
  }
  const bool group_next = decoded->group_next;
  batch_.push_back(*std::move(decoded));
  return group_next;
}

void SessionRings::PostCompletion(uint64_t request_id, const absl::Status& status, uint64_t seq) {
  absl::MutexLock lock(&cq_mu_);
  PostLocked(request_id, status, seq);
}

void SessionRings::PostLocked(uint64_t request_id, const absl::Status& status, uint64_t seq) {
  if (stopped_) return;
  if (reserved_ > 0) --reserved_;
  outstanding_.store(reserved_, std::memory_order_relaxed);
  last_completion_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
  std::byte* e =
      base_ + rp::CqOffset(sq_entries_) + (cq_tail_ & (cq_entries_ - 1)) * rp::kCqEntryBytes;
  const int32_t code = static_cast<int32_t>(status.code());
  const absl::string_view msg = status.message();
  const uint32_t len =
      static_cast<uint32_t>(msg.size() < rp::kCqMessageBytes ? msg.size() : rp::kCqMessageBytes);
  std::memcpy(e + rp::kCqRequestId, &request_id, 8);
  std::memcpy(e + rp::kCqSeq, &seq, 8);
  std::memcpy(e + rp::kCqCode, &code, 4);
  std::memcpy(e + rp::kCqMessageLen, &len, 4);
  if (len > 0) std::memcpy(e + rp::kCqMessageOffset, msg.data(), len);
  ++cq_tail_;
  ++stats_.completed;
  __atomic_store_n(Word64(rp::kOffCqTail), cq_tail_, __ATOMIC_RELEASE);
  uint32_t* doorbell = Word32(rp::kOffCqDoorbell);
  __atomic_fetch_add(doorbell, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(Word32(rp::kOffClientWaiters), __ATOMIC_SEQ_CST) != 0) {
    ++stats_.client_wakes;
    FutexWake(doorbell, INT_MAX);
  }
}

}  // namespace railyard
