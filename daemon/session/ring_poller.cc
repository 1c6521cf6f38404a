#include "daemon/session/ring_poller.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <iterator>
#include <mutex>

#include "absl/time/clock.h"
#include "daemon/session/session_rings.h"
#include "daemon/util/log.h"
#include "daemon/util/thread_name.h"
#include "proto/railyard/v1/ring_futex.h"
#include "proto/railyard/v1/spin_yield.h"

namespace railyard {

namespace {

// The longest the thread sleeps without looking (a lost wake-up, or a client that rewrote a
// doorbell, costs at most this).
constexpr int64_t kMaxSleepNs = 1000000000;

long FutexWaitv(struct futex_waitv* waiters, unsigned n, const timespec* deadline) {
  return syscall(SYS_futex_waitv, waiters, n, 0, deadline, CLOCK_MONOTONIC);
}

}  // namespace

bool RingPoller::CanWaitOnMany() {
  static const bool can = [] {
    // No waiters is EINVAL where the call exists; ENOSYS (an old kernel) or EPERM (a seccomp
    // profile without it) where it does not.
    errno = 0;
    const long r = FutexWaitv(nullptr, 0, nullptr);
    return r == -1 && errno == EINVAL;
  }();
  return can;
}

RingPoller::RingPoller(std::string name, transport::Transport* transport)
    : name_(std::move(name)), transport_(transport) {}

RingPoller::~RingPoller() {
  Stop();
  if (thread_.joinable()) thread_.detach();  // only when the thread itself let go last
}

bool RingPoller::Add(std::shared_ptr<SessionRings> rings) {
  {
    absl::MutexLock lock(&mu_);
    if (ended_ || stop_.load() || serving_ + added_.size() >= kMaxRings) return false;
    added_.push_back(std::move(rings));
    added_pending_.store(true, std::memory_order_release);
    if (!started_) {
      started_ = true;
      // The thread keeps its poller alive until it has ended.
      thread_ = std::thread([self = shared_from_this()] {
        self->tid_.store(std::this_thread::get_id());
        NameDataPlaneThread("ry-rings");
        Log(LogLevel::kDebug, "rings", "serving", {F("for", self->name_)});
        self->Loop();
      });
      return true;
    }
  }
  Wake();
  return true;
}

void RingPoller::Wake() {
  __atomic_fetch_add(&wake_word_, 1, __ATOMIC_SEQ_CST);
  syscall(SYS_futex, &wake_word_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

void RingPoller::Stop() {
  if (!stop_.exchange(true)) Wake();
  if (OnThread()) return;
  {
    // Add() starts the thread under mu_; once stop_ is set it starts none.
    absl::MutexLock lock(&mu_);
    if (!started_) {
      ended_ = true;
      return;
    }
  }
  std::lock_guard<std::mutex> lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

bool RingPoller::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

void RingPoller::Sleep(const std::vector<std::shared_ptr<SessionRings>>& rings,
                       const std::vector<uint32_t>& seen, uint32_t wake_seen, int64_t limit_ns) {
  if (rings.size() == 1 && !CanWaitOnMany()) {
    // One session (no futex_waitv: --ring_threads=session is forced): its doorbell alone.
    // SessionRings::Stop() rings it; the wake word is not watched here, so a RingPoller::Stop()
    // of a thread whose session still runs waits out this sleep (kMaxSleepNs at most).
    ringproto::FutexWait(rings[0]->SqDoorbell(), seen[0], limit_ns);
    return;
  }
  struct futex_waitv waiters[kMaxRings + 1] = {};
  for (size_t i = 0; i < rings.size(); ++i) {
    waiters[i].val = seen[i];
    waiters[i].uaddr = reinterpret_cast<uintptr_t>(rings[i]->SqDoorbell());
    waiters[i].flags = FUTEX_32;  // shared with the client: not private
  }
  waiters[rings.size()].val = wake_seen;
  waiters[rings.size()].uaddr = reinterpret_cast<uintptr_t>(&wake_word_);
  waiters[rings.size()].flags = FUTEX_32 | FUTEX_PRIVATE_FLAG;
  timespec deadline{};
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  const int64_t end_ns =
      static_cast<int64_t>(deadline.tv_sec) * 1000000000 + deadline.tv_nsec + limit_ns;
  deadline.tv_sec = static_cast<time_t>(end_ns / 1000000000);
  deadline.tv_nsec = static_cast<long>(end_ns % 1000000000);
  FutexWaitv(waiters, static_cast<unsigned>(rings.size() + 1), &deadline);
}

void RingPoller::Loop() {
  std::vector<std::shared_ptr<SessionRings>> rings;
  std::vector<uint32_t> seen;
  uint32_t spins = 0;
  // Registered with the transport as a poller from every wake-up to the next sleep, so that the
  // transfers this thread starts are not handed to a progress thread that must be woken.
  bool polling = false;
  auto begin_polling = [&] {
    if (transport_ != nullptr && !polling) {
      transport_->BeginPolling();
      polling = true;
    }
  };
  auto end_polling = [&] {
    if (polling) {
      transport_->EndPolling();
      polling = false;
    }
  };
  // One look at every session: takes what each published (at most kPerPass), drops the stopped.
  // Returns the entries taken; *in_flight: whether any has operations in flight.
  auto pass = [&](bool learn, bool* in_flight) {
    size_t taken = 0;
    for (size_t i = 0; i < rings.size();) {
      SessionRings& r = *rings[i];
      std::unique_lock<std::mutex> lock(r.serve_mu_);
      if (r.Stopping()) {
        lock.unlock();
        rings.erase(rings.begin() + static_cast<std::ptrdiff_t>(i));
        absl::MutexLock l(&mu_);
        --serving_;
        continue;
      }
      taken += r.ServeOnce(kPerPass, learn);
      if (r.InFlight()) *in_flight = true;
      ++i;
    }
    return taken;
  };
  begin_polling();
  while (!stop_.load(std::memory_order_acquire)) {
    if (added_pending_.load(std::memory_order_acquire)) {
      absl::MutexLock lock(&mu_);
      for (auto& r : added_) rings.push_back(std::move(r));
      serving_ += added_.size();
      added_.clear();
      added_pending_.store(false, std::memory_order_relaxed);
    }
    bool in_flight = false;
    if (pass(true, &in_flight) > 0) {
      spins = 0;
      continue;
    }
    if (rings.empty()) {
      absl::MutexLock lock(&mu_);
      if (!added_.empty()) continue;
      ended_ = true;  // Add() refuses from now on; RingPollers starts another thread
      break;
    }
    // Nothing to take (or no room for its completions: the client reads completions, and its
    // operations in flight make more). With operations in flight, make their progress here
    // (a client that queues many keeps both daemons' ring threads polling, so no message waits
    // for a progress thread to wake); either way spin a while, yielding the CPU to the threads
    // we wait for (on a small host they share our core), then sleep.
    const bool poll = polling && in_flight;
    if (poll && transport_->Poll()) spins = 0;
    if (!poll && (++spins & 63) != 0) {
      ringproto::CpuRelax();
      continue;
    }
    const int64_t now = absl::GetCurrentTimeNanos();
    bool awake = false;
    for (const auto& r : rings) awake = awake || now < r->AwakeUntil(transport_ != nullptr);
    if (awake) {
      // Polling is a system call already (the transport's epoll); yielding after each would
      // double what a poll costs where system calls are dear (a paravirtualised guest).
      // Where yields lose the core (spin_yield.h), this thread spins on with pauses rather than
      // sleep: the thread that keeps its core may be the client it serves, computing between
      // operations, and the spin is what spares that client a futex wake per submission.
      if ((!poll || (++spins & 7) == 0) && !ringproto::SpinYield()) ringproto::CpuRelax();
      continue;
    }
    // Tell every client we sleep, read the doorbells, then look once more: an entry published
    // after that look rings a doorbell we wait on.
    const uint32_t wake_seen = __atomic_load_n(&wake_word_, __ATOMIC_SEQ_CST);
    seen.clear();
    for (const auto& r : rings) seen.push_back(r->PrepareToSleep());
    bool ignored = false;
    const size_t late = pass(false, &ignored);
    if (late > 0 || rings.size() != seen.size() || stop_.load(std::memory_order_acquire) ||
        added_pending_.load(std::memory_order_acquire)) {
      for (const auto& r : rings) r->Woken(false);
      continue;
    }
    end_polling();
    Sleep(rings, seen, wake_seen, kMaxSleepNs);
    for (const auto& r : rings) r->Woken(true);
    spins = 0;
    begin_polling();
  }
  end_polling();
  std::vector<std::shared_ptr<SessionRings>> dropped;
  {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    serving_ = 0;
    dropped.swap(added_);
  }
  // Let go of sessions outside mu_: a last reference runs ~SessionRings, whose Stop() takes the
  // session's start_mu_, and SessionRings::Start() holds that lock while it calls Add().
}

RingPollers::RingPollers(Mode mode)
    : mode_(mode == Mode::kPerJob && !RingPoller::CanWaitOnMany() ? Mode::kPerSession : mode) {
  if (mode != mode_) {
    Log(LogLevel::kWarning, "rings",
        "futex_waitv is refused here (Linux before 5.16, or a seccomp profile without it): each "
        "session gets a ring thread of its own",
        {});
  }
}

RingPollers::~RingPollers() { StopAll(); }

std::shared_ptr<RingPoller> RingPollers::Serve(const std::string& job,
                                               std::shared_ptr<SessionRings> rings,
                                               transport::Transport* transport) {
  absl::MutexLock lock(&mu_);
  // Threads whose sessions have all gone, of every job (most jobs never come back): joined (they
  // have left their loops) and forgotten, so a daemon that sees many jobs holds only live ones.
  for (auto j = by_job_.begin(); j != by_job_.end();) {
    std::vector<std::shared_ptr<RingPoller>>& ps = j->second;
    for (auto it = ps.begin(); it != ps.end();) {
      if ((*it)->ended()) {
        (*it)->Stop();
        it = ps.erase(it);
      } else {
        ++it;
      }
    }
    j = ps.empty() ? by_job_.erase(j) : std::next(j);
  }
  std::vector<std::shared_ptr<RingPoller>>& pollers = by_job_[job];
  if (mode_ == Mode::kPerJob) {
    for (const auto& p : pollers) {
      if (p->Add(rings)) return p;
    }
  }
  auto p = std::make_shared<RingPoller>("rings of job " + job, transport);
  p->Add(std::move(rings));
  pollers.push_back(p);
  return p;
}

void RingPollers::StopAll() {
  std::map<std::string, std::vector<std::shared_ptr<RingPoller>>> all;
  {
    absl::MutexLock lock(&mu_);
    all.swap(by_job_);
  }
  for (auto& [job, pollers] : all) {
    for (auto& p : pollers) p->Stop();
  }
}

size_t RingPollers::held() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [job, pollers] : by_job_) n += pollers.size();
  return n;
}

size_t RingPollers::threads() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [job, pollers] : by_job_) {
    for (const auto& p : pollers) n += p->ended() ? 0 : 1;
  }
  return n;
}

}  // namespace railyard
