#include "client_rings.h"

#include <pthread.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "memfd_buffer.h"
#include "proto/railyard/v1/ring.h"
#include "proto/railyard/v1/ring_futex.h"
#include "proto/railyard/v1/spin_yield.h"

namespace railyard::internal {

namespace rp = ringproto;

namespace {
std::atomic<uint64_t> fork_generation{0};
void CountFork() { fork_generation.fetch_add(1, std::memory_order_relaxed); }
[[maybe_unused]] const int fork_handler = pthread_atfork(nullptr, nullptr, &CountFork);
}  // namespace

uint64_t ForkGeneration() { return fork_generation.load(std::memory_order_relaxed); }

namespace {

// The longest one sleep lasts before the waiter looks again (and at its deadline).
constexpr auto kMaxSleep = std::chrono::milliseconds(100);

using ringproto::CpuRelax;
using ringproto::FutexWake;

void FutexWait(uint32_t* word, uint32_t expected, std::chrono::nanoseconds limit) {
  ringproto::FutexWait(word, expected, limit.count());
}

template <typename T>
void Put(std::byte* p, size_t off, T v) {
  std::memcpy(p + off, &v, sizeof(T));
}

absl::StatusCode CodeOf(int32_t code) {
  if (code < 0 || code > 16) return absl::StatusCode::kUnknown;
  return static_cast<absl::StatusCode>(code);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClientRings>> ClientRings::Create(const std::string& job,
                                                                 uint32_t sq_entries,
                                                                 uint32_t cq_entries,
                                                                 std::chrono::microseconds spin,
                                                                 int* memfd) {
  if (!rp::ValidEntries(sq_entries) || !rp::ValidEntries(cq_entries)) {
    return absl::InvalidArgumentError("ring entries must be powers of two in [8, 65536]");
  }
  const size_t bytes = rp::RingBytes(sq_entries, cq_entries);
  absl::StatusOr<MemfdBuffer> mem = CreateMemfdBuffer(job, bytes);
  if (!mem.ok()) return mem.status();
  auto* base = static_cast<std::byte*>(mem->data);
  Put<uint32_t>(base, rp::kOffMagic, rp::kMagic);
  Put<uint32_t>(base, rp::kOffVersion, rp::kVersion);
  Put<uint32_t>(base, rp::kOffSqEntries, sq_entries);
  Put<uint32_t>(base, rp::kOffCqEntries, cq_entries);
  *memfd = mem->fd;
  return std::unique_ptr<ClientRings>(new ClientRings(base, bytes, sq_entries, cq_entries, spin));
}

ClientRings::~ClientRings() { UnmapBuffer(base_, bytes_); }

absl::Status ClientRings::Encode(const v1::SubmitRequest& req, bool group_next,
                                 std::vector<std::byte>* out) {
  const size_t at = out->size();
  const bool vectors = req.op() == v1::COLLECTIVE_OP_ALL_TO_ALL_V;
  const size_t vec_len = static_cast<size_t>(req.send_counts_size());
  if (vectors && (req.send_displs_size() != req.send_counts_size() ||
                  req.recv_counts_size() != req.send_counts_size() ||
                  req.recv_displs_size() != req.send_counts_size())) {
    return absl::InvalidArgumentError(
        "AllToAllv: send_counts, send_displs, recv_counts and recv_displs must have one entry "
        "per rank each");
  }
  if (req.algo().size() >= rp::kAlgoBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "algorithm name \"", req.algo(), "\" is longer than ", rp::kAlgoBytes - 1, " characters"));
  }
  if (req.compression().size() >= rp::kCompressionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("compression \"", req.compression(),
                                                   "\" is longer than ", rp::kCompressionBytes - 1,
                                                   " characters"));
  }
  const uint64_t vec_ext = vectors ? rp::ExtSlotsFor(vec_len) : 0;
  const bool sync = req.has_stream_sync();
  const uint64_t ext = vec_ext + (sync ? 1 : 0);
  out->resize(at + (1 + ext) * rp::kSqEntryBytes, std::byte{0});
  std::byte* e = out->data() + at;
  Put<uint64_t>(e, rp::kSqRequestId, req.request_id());
  Put<uint64_t>(e, rp::kSqCommHandle, req.comm_handle());
  Put<uint64_t>(e, rp::kSqCount, req.count());
  Put<uint64_t>(e, rp::kSqSendBuffer, req.send().buffer_id());
  Put<uint64_t>(e, rp::kSqSendOffset, req.send().buffer_id() != 0 ? req.send().offset() : 0);
  Put<uint64_t>(e, rp::kSqRecvBuffer, req.recv().buffer_id());
  Put<uint64_t>(e, rp::kSqRecvOffset, req.recv().buffer_id() != 0 ? req.recv().offset() : 0);
  Put<uint32_t>(e, rp::kSqOp, static_cast<uint32_t>(req.op()));
  Put<uint32_t>(e, rp::kSqDtype, static_cast<uint32_t>(req.dtype()));
  Put<uint32_t>(e, rp::kSqRedOp, static_cast<uint32_t>(req.red_op()));
  Put<int32_t>(e, rp::kSqRoot, req.root());
  Put<uint32_t>(e, rp::kSqTimeoutMs, req.timeout_ms());
  Put<uint32_t>(e, rp::kSqFlags,
                (group_next ? rp::kFlagGroupNext : 0) |
                    (req.error_feedback() ? rp::kFlagErrorFeedback : 0) |
                    (sync ? rp::kFlagStreamSync : 0));
  Put<uint32_t>(e, rp::kSqExtSlots, static_cast<uint32_t>(ext));
  Put<uint32_t>(e, rp::kSqVecLen, vectors ? static_cast<uint32_t>(vec_len) : 0);
  std::memcpy(e + rp::kSqAlgo, req.algo().data(), req.algo().size());
  std::memcpy(e + rp::kSqCompression, req.compression().data(), req.compression().size());
  Put<uint64_t>(e, rp::kSqCompressionKey, req.error_feedback() ? req.compression_key() : 0);
  if (vectors) {
    std::byte* v = e + rp::kSqEntryBytes;
    const google::protobuf::RepeatedField<uint64_t>* vecs[4] = {
        &req.send_counts(), &req.send_displs(), &req.recv_counts(), &req.recv_displs()};
    for (int i = 0; i < 4; ++i) {
      if (vec_len > 0) std::memcpy(v + i * vec_len * 8, vecs[i]->data(), vec_len * 8);
    }
  }
  if (sync) {
    std::byte* slot = e + (1 + vec_ext) * rp::kSqEntryBytes;
    Put<uint64_t>(slot, rp::kSyncBuffer, req.stream_sync().words().buffer_id());
    Put<uint64_t>(slot, rp::kSyncOffset, req.stream_sync().words().offset());
    Put<uint32_t>(slot, rp::kSyncValue, req.stream_sync().value());
  }
  return absl::OkStatus();
}

uint64_t ClientRings::ConsumedHead() const {
  const uint64_t head = __atomic_load_n(Word64(rp::kOffSqHead), __ATOMIC_ACQUIRE);
  std::lock_guard<std::mutex> lock(sq_mu_);
  return head < sq_tail_ ? head : sq_tail_;
}

absl::Status ClientRings::Publish(const std::vector<std::byte>& entries,
                                  const std::function<void(uint64_t first_slot)>& on_slot) {
  const uint64_t need = entries.size() / rp::kSqEntryBytes;
  if (need > sq_entries_) {
    return absl::InvalidArgumentError(
        absl::StrCat("submission of ", need, " ring slots does not fit the ring's ", sq_entries_));
  }
  if (forked()) {
    return absl::FailedPreconditionError(
        "the session's rings belong to the process this one was forked from");
  }
  std::unique_lock<std::mutex> lock(sq_mu_);
  auto started = std::chrono::steady_clock::now();
  for (uint32_t spins = 0;; ++spins) {
    if (closed()) return absl::FailedPreconditionError("the session has ended");
    const uint64_t head = __atomic_load_n(Word64(rp::kOffSqHead), __ATOMIC_ACQUIRE);
    if (head > sq_tail_ || sq_tail_ - head > sq_entries_) {
      // No entry of ours put the daemon's head there: something else wrote the tail word, and
      // the ring would never have room again (or take our entries).
      return absl::FailedPreconditionError(absl::StrCat(
          "the submission ring is out of step: the daemon's head is at ", head,
          ", this client published up to ", sq_tail_,
          "; something other than this client library wrote the ring's tail. Reconnect for new "
          "rings"));
    }
    if (sq_tail_ + need - head <= sq_entries_) break;
    // Full: the daemon takes entries only while their completions fit, so read them meanwhile.
    lock.unlock();
    AwaitRoom(started);
    lock.lock();
  }
  if (on_slot) on_slot(sq_tail_);
  std::byte* sq = base_ + rp::SqOffset();
  for (uint64_t i = 0; i < need; ++i) {
    std::memcpy(sq + ((sq_tail_ + i) & (sq_entries_ - 1)) * rp::kSqEntryBytes,
                entries.data() + i * rp::kSqEntryBytes, rp::kSqEntryBytes);
  }
  sq_tail_ += need;
  __atomic_store_n(Word64(rp::kOffSqTail), sq_tail_, __ATOMIC_RELEASE);
  __atomic_fetch_add(Word32(rp::kOffSqDoorbell), 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(Word32(rp::kOffDaemonSleeping), __ATOMIC_SEQ_CST) != 0) {
    FutexWake(Word32(rp::kOffSqDoorbell), 1);
  }
  return absl::OkStatus();
}

void ClientRings::AwaitRoom(std::chrono::steady_clock::time_point started) {
  // Only a completion read makes room (the daemon takes an entry once its completion fits), and
  // the read that makes it wakes the daemon (Drain). So nothing here pokes the daemon: a poke
  // per spin would wake its ring thread thousands of times a second for nothing while a deep
  // queue waits on the network (issue 56: 3,700 wake-ups a second, a fifth of a core).
  if (Drain() > 0) return;
  const auto waited = std::chrono::steady_clock::now() - started;
  if (waited < spin_ && rp::SpinYield()) return;
  // Naps first: in a stream of small operations room comes within microseconds, and a client
  // asleep on the doorbell makes the daemon ring it (a system call) for each completion batch:
  // 8 B AllReduce with a full ring, one daemon and 2 ranks, went from ~5 to ~6-10 us an
  // operation when it slept on the doorbell at once. A wait past kNapFor is one on the network.
  constexpr auto kNapFor = std::chrono::milliseconds(2);
  if (waited < kNapFor) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    return;
  }
  // Sleep on the completion doorbell, as WaitUntil does; kRoomSleep bounds a lost wake-up.
  constexpr auto kRoomSleep = std::chrono::milliseconds(10);
  uint32_t* doorbell = Word32(rp::kOffCqDoorbell);
  __atomic_fetch_add(Word32(rp::kOffClientWaiters), 1, __ATOMIC_SEQ_CST);
  const uint32_t ring = __atomic_load_n(doorbell, __ATOMIC_SEQ_CST);
  if (Drain() == 0 && !closed()) FutexWait(doorbell, ring, kRoomSleep);
  __atomic_fetch_sub(Word32(rp::kOffClientWaiters), 1, __ATOMIC_SEQ_CST);
}

void ClientRings::WakeDaemonIfWaiting() {
  // The daemon waits for room in the completion ring only while entries wait for it.
  const uint64_t head = __atomic_load_n(Word64(rp::kOffSqHead), __ATOMIC_ACQUIRE);
  const uint64_t tail = __atomic_load_n(Word64(rp::kOffSqTail), __ATOMIC_RELAXED);
  if (head == tail) return;
  __atomic_fetch_add(Word32(rp::kOffSqDoorbell), 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(Word32(rp::kOffDaemonSleeping), __ATOMIC_SEQ_CST) != 0) {
    FutexWake(Word32(rp::kOffSqDoorbell), 1);
  }
}

size_t ClientRings::Drain() {
  if (forked()) return 0;
  size_t n;
  {
    std::lock_guard<std::mutex> lock(cq_mu_);
    n = DrainLocked();
  }
  if (n > 0) WakeDaemonIfWaiting();
  return n;
}

size_t ClientRings::DrainLocked() {
  if (closed()) return 0;  // the session (and the table completions go to) has ended
  const uint64_t tail = __atomic_load_n(Word64(rp::kOffCqTail), __ATOMIC_ACQUIRE);
  size_t n = 0;
  const std::byte* cq = base_ + rp::CqOffset(sq_entries_);
  while (cq_head_ != tail) {
    const std::byte* e = cq + (cq_head_ & (cq_entries_ - 1)) * rp::kCqEntryBytes;
    uint64_t request_id, seq;
    int32_t code;
    uint32_t len, flags;
    std::memcpy(&request_id, e + rp::kCqRequestId, 8);
    std::memcpy(&flags, e + rp::kCqFlags, 4);
    std::memcpy(&seq, e + rp::kCqSeq, 8);
    std::memcpy(&code, e + rp::kCqCode, 4);
    std::memcpy(&len, e + rp::kCqMessageLen, 4);
    if (len > rp::kCqMessageBytes) len = rp::kCqMessageBytes;
    absl::Status status =
        code == 0 ? absl::OkStatus()
                  : absl::Status(
                        CodeOf(code),
                        std::string(reinterpret_cast<const char*>(e + rp::kCqMessageOffset), len));
    ++cq_head_;
    ++n;
    if (on_completion_) on_completion_(request_id, std::move(status), seq, flags);
  }
  if (n > 0) __atomic_store_n(Word64(rp::kOffCqHead), cq_head_, __ATOMIC_RELEASE);
  return n;
}

bool ClientRings::WaitUntil(const std::function<bool()>& done,
                            std::chrono::steady_clock::time_point deadline) {
  if (forked()) return done();
  const auto spin_end = std::chrono::steady_clock::now() + spin_;
  // Spin: read completions as they come, yielding to the other threads on this CPU.
  for (uint32_t spins = 0;; ++spins) {
    if (done()) return true;
    bool drained = false;
    if (cq_mu_.try_lock()) {
      drained = DrainLocked() > 0;
      cq_mu_.unlock();
      if (drained) WakeDaemonIfWaiting();
    }
    if (drained) continue;
    if (closed()) return done();
    if ((spins & 63) != 63) {
      CpuRelax();
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return done();
    if (now >= spin_end || !rp::SpinYield()) break;
  }
  // Sleep on the doorbell.
  uint32_t* doorbell = Word32(rp::kOffCqDoorbell);
  for (;;) {
    if (done()) return true;
    if (closed()) return done();
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return done();
    __atomic_fetch_add(Word32(rp::kOffClientWaiters), 1, __ATOMIC_SEQ_CST);
    const uint32_t ring = __atomic_load_n(doorbell, __ATOMIC_SEQ_CST);
    const bool drained = Drain() > 0;
    if (!drained && !done() && !closed()) {
      FutexWait(
          doorbell, ring,
          std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::nanoseconds(kMaxSleep)));
    }
    __atomic_fetch_sub(Word32(rp::kOffClientWaiters), 1, __ATOMIC_SEQ_CST);
    Drain();
  }
}

void ClientRings::Close() {
  if (forked()) return;  // the parent's session: nothing of it to close here
  closed_.store(true, std::memory_order_release);
  { std::lock_guard<std::mutex> lock(cq_mu_); }  // a drain in progress has finished
  __atomic_fetch_add(Word32(rp::kOffCqDoorbell), 1, __ATOMIC_SEQ_CST);
  FutexWake(Word32(rp::kOffCqDoorbell), INT_MAX);
}

}  // namespace railyard::internal
