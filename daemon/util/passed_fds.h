// Descriptors a received message carried (SCM_RIGHTS), owned as soon as they arrive: whatever is
// wrong with the message, none leaks.
#pragma once

#include <sys/socket.h>

#include <cstring>
#include <vector>

#include "daemon/util/unique_fd.h"

namespace railyard {

// Appends every SCM_RIGHTS descriptor of msg (after recvmsg) to out.
inline void TakePassedFds(msghdr& msg, std::vector<UniqueFd>* out) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int passed = -1;
      std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out->emplace_back(passed);
    }
  }
}

}  // namespace railyard
