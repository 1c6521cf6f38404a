// The handover socket's wire (proto/railyard/v1/handover.proto): railyardd --takeover reaches the
// daemon it replaces at "<socket>.handover" and receives its listening sockets by SCM_RIGHTS.
// Mechanism only: framing, descriptors, deadlines, who may connect. What each side does with the
// steps is daemon/handover/handover_server.h (old) and Server::Start (new).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/util/unique_fd.h"
#include "railyard/v1/handover.pb.h"

namespace railyard::handover {

// The handover protocol this build speaks, and the oldest it takes over from or hands over to:
// version N takes over from N-1 (docs/restarts.md, "Versions").
inline constexpr uint32_t kProtocol = 1;
inline constexpr uint32_t kMinProtocol = 1;
// A message's payload at most (a length beyond it ends the connection).
inline constexpr uint32_t kMaxMessageBytes = 64 * 1024;
// Descriptors one message may carry at most.
inline constexpr size_t kMaxFds = 8;

// "<socket>.handover".
std::string HandoverPath(const std::string& socket);

// A listening Unix stream socket at path, mode 0600, put in place by rename() from a private
// directory (no window where others may connect; a socket already at path, an older daemon's,
// is replaced atomically).
absl::StatusOr<UniqueFd> ListenAt(const std::string& path);
// Connects to the socket at path (UNAVAILABLE naming it when nobody listens).
absl::StatusOr<UniqueFd> ConnectTo(const std::string& path, absl::Duration timeout);
// The peer of a connected socket is this user (or root): who may hand over or take over.
absl::Status CheckPeerIsUs(int fd);

struct Received {
  v1::HandoverMessage message;
  std::vector<UniqueFd> fds;
};

// Sends one message with descriptors (duplicated by the kernel: the caller keeps its own).
absl::Status Send(int fd, v1::HandoverMessage message, const std::vector<int>& fds,
                  absl::Time deadline);
// Receives one message. DEADLINE_EXCEEDED past deadline, UNAVAILABLE when the peer closed,
// INVALID_ARGUMENT for a frame that is too long or does not parse, or more than kMaxFds.
absl::StatusOr<Received> Receive(int fd, absl::Time deadline);

// A message of this build: protocol, version and pid filled in.
v1::HandoverMessage Stamped();
// OK when a peer speaking `protocol` (min_protocol..protocol) can hand over to or take over from
// this build; FAILED_PRECONDITION naming both ranges otherwise.
absl::Status Compatible(uint32_t min_protocol, uint32_t protocol);

}  // namespace railyard::handover
