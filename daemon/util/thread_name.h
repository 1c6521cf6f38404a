// Names the calling thread (shown by top -H, ps -L, /proc/<pid>/task/<tid>/comm and gdb), so an
// operator can tell which of the daemon's threads uses the CPU. Linux keeps 15 bytes.
//
// Data-plane threads (rings, workers, device lanes, UCX rails, pacers, stream gates) name
// themselves with NameDataPlaneThread, which also lowers their CPU priority by
// --data_plane_nice: when the node's cores are contended, the control plane (gRPC's threads:
// heartbeats, keepalives, Status, Diagnose; the timer; the listeners) is scheduled first, so a
// busy data path cannot make peers and clients think the daemon is dead. An unprivileged
// process may lower its threads' priority; it may not raise it back.
#pragma once

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace railyard {

inline void NameThisThread(const char* name) { pthread_setname_np(pthread_self(), name); }

// How much nicer than the process data-plane threads run (0: as nice as the rest).
inline std::atomic<int>& DataPlaneNice() {
  static std::atomic<int> nice{0};
  return nice;
}

inline void NameDataPlaneThread(const char* name) {
  NameThisThread(name);
  const int nice = DataPlaneNice().load(std::memory_order_relaxed);
  if (nice <= 0) return;
  errno = 0;
  const int base = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::getpid()));  // the main thread's
  if (base == -1 && errno != 0) return;
  const int tid = static_cast<int>(::syscall(SYS_gettid));
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), base + nice < 19 ? base + nice : 19);
}

}  // namespace railyard
