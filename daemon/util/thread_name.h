// Names the calling thread (shown by top -H, ps -L, /proc/<pid>/task/<tid>/comm and gdb), so an
// operator can tell which of the daemon's threads uses the CPU. Linux keeps 15 bytes.
#pragma once

#include <pthread.h>

namespace railyard {

inline void NameThisThread(const char* name) { pthread_setname_np(pthread_self(), name); }

}  // namespace railyard
