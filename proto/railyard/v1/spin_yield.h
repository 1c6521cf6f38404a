// How a spinning waiter lets other threads run, shared by the daemon and the clients (header-only:
// the Python extension compiles it too).
//
// Every so often a spinning waiter calls sched_yield(), so that a thread it waits for on the same
// core (the daemon's ring thread, another rank, a rail's progress thread) gets the core at once.
// Where other work keeps the cores busy (a neighbour's compute loop) a yield does the opposite: it
// hands the core to that work for its whole time slice, and the completion the waiter wants then
// waits for the slice to end, where a thread asleep on its doorbell would have been woken and run
// at once. Measured on a 2-vCPU guest (Linux 6.18, EEVDF) beside two busy loops: the clients'
// yields took 2-4 ms each, and a torch 4 B all_reduce at world size 2 took ~3.7 ms; without the
// yields, ~0.45 ms. On the same host idle, no client yield took over 0.5 ms, and the yields are
// what keep a daemon thread and two ranks going on two cores.
//
// So yields are paced by what they cost: a thread whose yields of over kLongNs lost more than a
// quarter of the last kWindowNs stops yielding for kQuietNs (SpinYield() returns false), then
// tries again. A client then sleeps on its doorbell at once; the daemon's ring thread spins on
// with pauses (the core it keeps losing may be its own client's, computing between operations).
// Beside the two busy loops that took the 4 B all_reduce to 0.27-0.47 ms (gloo 0.8-1.0).
//
// Only yields of at least kLongNs (2 ms; Linux's default slice on two CPUs is 1.5 ms) count. A
// yield that long handed the core to something that ran out its slice: a neighbour's compute loop
// (there ~95 % of the time clients lost in yields over 250 us was in yields of 2-8 ms, 674-759 of
// ~2,000-2,500 yields per run). Shorter ones usually went to this node's own threads doing the
// waiter's work: between two daemons with a rank each, on two cores, a rank's yields of 0.25-2 ms
// made up half its wait, and counting them from 250 us (as first written) put it to sleep on its
// doorbell, which made 8 B AllReduces across the daemons ~25 % slower (a futex wake per
// operation).
#pragma once

#include <sched.h>
#include <time.h>

#include <cstdint>

namespace railyard::ringproto {

class YieldPacer {
 public:
  static constexpr int64_t kLongNs = 2'000'000;     // a yield this long lost the core
  static constexpr int64_t kWindowNs = 50'000'000;  // lost time counted over this long
  static constexpr int64_t kQuietNs = 200'000'000;  // no yields for this long after

  // Whether a waiter should yield at now_ns (else SpinYield() returns false at once).
  bool ShouldYield(int64_t now_ns) const { return now_ns >= quiet_until_ns_; }
  // Records a yield from before_ns to after_ns; true when it starts a quiet period.
  bool Yielded(int64_t before_ns, int64_t after_ns) {
    if (after_ns - window_start_ns_ > kWindowNs) {
      window_start_ns_ = after_ns;
      lost_ns_ = 0;
    }
    if (after_ns - before_ns > kLongNs) lost_ns_ += after_ns - before_ns;
    if (lost_ns_ <= kWindowNs / 4) return false;
    quiet_until_ns_ = after_ns + kQuietNs;
    window_start_ns_ = quiet_until_ns_;  // a fresh count once it ends
    lost_ns_ = 0;
    return true;
  }
  int64_t quiet_until_ns() const { return quiet_until_ns_; }

 private:
  int64_t window_start_ns_ = 0;
  int64_t lost_ns_ = 0;
  int64_t quiet_until_ns_ = 0;
};

inline int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// A spinning waiter's sched_yield(), paced per thread by YieldPacer. Returns false, without
// yielding, while this thread's yields are paused: its core is contended, and the caller should
// stop spinning and sleep (a sleeper is woken and run at once; a spinner waits for its turn).
inline bool SpinYield() {
  thread_local YieldPacer pacer;
  const int64_t before = MonotonicNs();
  if (!pacer.ShouldYield(before)) return false;
  sched_yield();
  pacer.Yielded(before, MonotonicNs());
  return true;
}

}  // namespace railyard::ringproto
