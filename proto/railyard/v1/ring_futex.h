// The doorbells of the session rings (ring.h): futex words in memory shared between two processes
// (not FUTEX_PRIVATE), and the pause a spinning waiter takes between looks. Header-only, shared by
// the daemon and the C++ client.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace railyard::ringproto {

// Sleeps while *word == expected, at most limit_ns (a waker that changed the word since the
// caller read it makes this return at once).
inline void FutexWait(uint32_t* word, uint32_t expected, int64_t limit_ns) {
  if (limit_ns <= 0) return;
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(limit_ns / 1000000000);
  ts.tv_nsec = static_cast<long>(limit_ns % 1000000000);
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

// Wakes up to n sleepers of word.
inline void FutexWake(uint32_t* word, int n) {
  syscall(SYS_futex, word, FUTEX_WAKE, n, nullptr, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

inline int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Spin only while spinning pays. A spinning waiter reports how each spin ended: what it waited
// for came (it pays), or the spin ran out and the waiter went to sleep on its futex anyway.
// After kFailures spins in a row ran out, waiters skip the spin for a pause: 50 ms, doubling
// while spins keep running out, up to 400 ms; after a pause one spin decides (running out pauses
// again), and kSettled spins that paid in a row bring the pause back to 50 ms. Spins run out
// where the operations are long (a spin is wasted there anyway), and where other processes keep
// the cores busy: a thread that spins there spends the turns that the threads it waits for
// need, and waits ~10x longer than one that sleeps and is woken (local-api.md). Shared by the
// waiters of a process (the host's load is the process's); races between them only blur it.
class SpinPolicy {
 public:
  static constexpr int kFailures = 4;
  static constexpr int kSettled = 64;
  static constexpr int64_t kMinPauseNs = 50000000;
  static constexpr int64_t kMaxPauseNs = 400000000;

  bool Allowed(int64_t now_ns) const {
    return now_ns >= off_until_ns_.load(std::memory_order_relaxed);
  }
  void Report(bool paid, int64_t now_ns) {
    if (paid) {
      failures_.store(0, std::memory_order_relaxed);
      if (successes_.fetch_add(1, std::memory_order_relaxed) + 1 >= kSettled) {
        pause_ns_.store(kMinPauseNs, std::memory_order_relaxed);
      }
      return;
    }
    successes_.store(0, std::memory_order_relaxed);
    if (failures_.fetch_add(1, std::memory_order_relaxed) + 1 < kFailures) return;
    const int64_t pause = pause_ns_.load(std::memory_order_relaxed);
    off_until_ns_.store(now_ns + pause, std::memory_order_relaxed);
    pause_ns_.store(std::min(2 * pause, kMaxPauseNs), std::memory_order_relaxed);
    failures_.store(kFailures - 1, std::memory_order_relaxed);
    pauses_.fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t pauses() const { return pauses_.load(std::memory_order_relaxed); }
  // Back to spinning, with the shortest pause next (the counts of pauses stays).
  void Reset() {
    off_until_ns_.store(0, std::memory_order_relaxed);
    pause_ns_.store(kMinPauseNs, std::memory_order_relaxed);
    failures_.store(0, std::memory_order_relaxed);
    successes_.store(0, std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> off_until_ns_{0};
  std::atomic<int64_t> pause_ns_{kMinPauseNs};
  std::atomic<int> failures_{0};
  std::atomic<int> successes_{0};
  std::atomic<uint64_t> pauses_{0};
};

// The process's policy.
inline SpinPolicy& ProcessSpinPolicy() {
  static SpinPolicy policy;
  return policy;
}

}  // namespace railyard::ringproto
