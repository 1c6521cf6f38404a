// Who is at the other end of a session's local connection, as the kernel says (SO_PEERCRED of
// its side channel), in the daemon's pid namespace (pid 0 when the client's is not visible).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <optional>

namespace railyard {

struct PeerCred {
  int64_t pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
};

// The kernel's SO_PEERCRED of a connected Unix socket; nullopt when it will not say.
inline std::optional<PeerCred> PeerCredOf(int fd) {
  ucred uc{};
  socklen_t len = sizeof(uc);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) != 0) return std::nullopt;
  return PeerCred{uc.pid, uc.uid, uc.gid};
}

}  // namespace railyard
