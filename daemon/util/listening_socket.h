// A listening socket another process handed over (railyardd --takeover): checked before it is
// served, so that a wrong descriptor is refused at start rather than failing every accept.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace railyard {

// OK when fd is a listening socket of `type` (SOCK_STREAM, SOCK_SEQPACKET), which it then makes
// non-blocking; INVALID_ARGUMENT naming `what` otherwise.
inline absl::Status CheckHandedOverListener(int fd, int type, absl::string_view what) {
  int got_type = 0;
  int listening = 0;
  socklen_t type_len = sizeof(got_type);
  socklen_t listening_len = sizeof(listening);
  if (fd < 0 || ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &got_type, &type_len) != 0 ||
      ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &listening_len) != 0 ||
      got_type != type || listening == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, " handed over is not a listening ",
                     type == SOCK_STREAM ? "stream" : "SOCK_SEQPACKET", " socket"));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return absl::OkStatus();
}

}  // namespace railyard
