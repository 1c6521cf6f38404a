// Who is at the other end of a session's local connection, as the kernel says (SO_PEERCRED of
// its side channel), in the daemon's pid namespace (pid 0 when the client's is not visible).
#pragma once

#include <cstdint>

namespace railyard {

struct PeerCred {
  int64_t pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
};

}  // namespace railyard
