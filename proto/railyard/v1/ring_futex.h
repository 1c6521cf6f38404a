// The doorbells of the session rings (ring.h): futex words in memory shared between two processes
// (not FUTEX_PRIVATE), and the pause a spinning waiter takes between looks. Header-only, shared by
// the daemon and the C++ client.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

}  // namespace railyard::ringproto
