#include "daemon/session/session_rings.h"

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

using ringproto::FutexWake;

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
      last_ns_(absl::GetCurrentTimeNanos()),
      last_entry_ns_(last_ns_),
      entry_copy_(rp::kSqEntryBytes) {
  __atomic_store_n(Word64(rp::kOffSqHead), 0, __ATOMIC_RELEASE);
  __atomic_store_n(Word64(rp::kOffCqTail), 0, __ATOMIC_RELEASE);
  __atomic_store_n(Word32(rp::kOffDaemonSleeping), 0, __ATOMIC_RELEASE);
}

SessionRings::~SessionRings() { Stop(); }

// Start() checks stop_ under start_mu_, and Stop() and Quiesce() set it before they read
// poller_ under start_mu_: either the rings start and the stopper waits the thread out, or they
// never start.
void SessionRings::Start(SubmitFn submit, std::string name, transport::Transport* poller) {
  std::lock_guard<std::mutex> lock(start_mu_);
  if (stop_.load(std::memory_order_acquire)) return;
  submit_ = std::move(submit);
  poller_ = std::make_shared<RingPoller>("session " + name, poller);
  own_poller_ = true;
  poller_->Add(shared_from_this());
}

void SessionRings::Start(SubmitFn submit, RingPollers& pollers, const std::string& job,
                         transport::Transport* poller) {
  std::lock_guard<std::mutex> lock(start_mu_);
  if (stop_.load(std::memory_order_acquire)) return;
  submit_ = std::move(submit);
  own_poller_ = pollers.mode() == RingPollers::Mode::kPerSession;
  poller_ = pollers.Serve(job, shared_from_this(), poller);
}

std::shared_ptr<RingPoller> SessionRings::Poller(bool* own) {
  std::lock_guard<std::mutex> lock(start_mu_);
  if (own != nullptr) *own = own_poller_;
  return poller_;
}

uint32_t* SessionRings::SqDoorbell() const { return Word32(rp::kOffSqDoorbell); }

void SessionRings::WakeRingThread() {
  __atomic_fetch_add(Word32(rp::kOffSqDoorbell), 1, __ATOMIC_SEQ_CST);
  FutexWake(Word32(rp::kOffSqDoorbell), INT_MAX);
}

void SessionRings::WaitOutRingThread() {
  // The ring thread takes entries holding serve_mu_ and looks at stop_ first.
  std::lock_guard<std::mutex> lock(serve_mu_);
}

void SessionRings::Stop() {
  {
    absl::MutexLock lock(&cq_mu_);
    stopped_ = true;
  }
  if (!stop_.exchange(true)) WakeRingThread();
  bool own = false;
  const std::shared_ptr<RingPoller> poller = Poller(&own);
  if (poller == nullptr || poller->OnThread()) return;  // it lets go when this call returns to it
  WaitOutRingThread();
  if (own) poller->Stop();
}

void SessionRings::Quiesce() {
  if (stop_.exchange(true)) return;  // stopped (or quiesced) already
  WakeRingThread();
  const std::shared_ptr<RingPoller> poller = Poller(nullptr);
  if (poller == nullptr || poller->OnThread()) return;
  // Once the ring thread is out, head_ and batch_ are this thread's. Bounded, so a client that
  // keeps publishing cannot hold the caller.
  std::lock_guard<std::mutex> lock(serve_mu_);
  sweeping_ = true;
  bool blocked = false;
  Drain(&blocked, sq_entries_);
  sweeping_ = false;
}

size_t SessionRings::ServeOnce(size_t limit, bool learn) {
  // How soon this client submits again once its operations have completed: an average of the
  // gaps shorter than kLearnGapNs. With nothing in flight its ring thread spins up to twice
  // that (at least spin_, at most poll_) after the last completion, so a client that comes back
  // within tens of microseconds (a Python loop spends 30-60 us between operations) finds it
  // awake, and one that computes for milliseconds in between costs only spin_.
  constexpr int64_t kLearnGapNs = 1000000;
  const bool idle_before = !InFlight();
  // Both before Drain, which may complete what it takes.
  const int64_t completed = last_completion_ns_.load(std::memory_order_relaxed);
  const int64_t drain_ns = absl::GetCurrentTimeNanos();
  blocked_ = false;
  const size_t taken = Drain(&blocked_, limit);
  if (taken == 0) return 0;
  if (learn && idle_before && completed > last_entry_ns_ && drain_ns - completed < kLearnGapNs) {
    const int64_t gap = std::max<int64_t>(0, drain_ns - completed);
    gap_ns_ = gap_ns_ == 0 ? gap : (7 * gap_ns_ + gap) / 8;
  }
  last_entry_ns_ = drain_ns;
  last_ns_ = absl::GetCurrentTimeNanos();
  return taken;
}

int64_t SessionRings::AwakeUntil(bool has_transport) const {
  const int64_t spin_ns = absl::ToInt64Nanoseconds(spin_);
  const int64_t poll_ns = absl::ToInt64Nanoseconds(poll_);
  const int64_t since = std::max(last_ns_, last_completion_ns_.load(std::memory_order_relaxed));
  if (InFlight()) return since + (has_transport ? poll_ns : spin_ns);
  if (blocked_) return since;
  return since + std::clamp(2 * gap_ns_, spin_ns, std::max(spin_ns, poll_ns));
}

uint32_t SessionRings::PrepareToSleep() {
  __atomic_store_n(Word32(rp::kOffDaemonSleeping), 1, __ATOMIC_SEQ_CST);
  return __atomic_load_n(Word32(rp::kOffSqDoorbell), __ATOMIC_SEQ_CST);
}

void SessionRings::Woken(bool slept) {
  __atomic_store_n(Word32(rp::kOffDaemonSleeping), 0, __ATOMIC_RELAXED);
  if (!slept) return;
  last_ns_ = absl::GetCurrentTimeNanos();
  absl::MutexLock lock(&cq_mu_);
  ++stats_.wakeups;
}

RingStats SessionRings::stats() const {
  absl::MutexLock lock(&cq_mu_);
  return stats_;
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
  const uint32_t flags = IsMoved(status) ? rp::kCqFlagMoved : 0;
  std::memcpy(e + rp::kCqFlags, &flags, 4);
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
