// The client's end of the buffer side channel (proto/railyard/v1/fd_channel.h): a SOCK_SEQPACKET
// connection to "<socket>.fd", opened before Local.Connect, whose HELLO ticket Connect names, and
// over which each buffer's memfd is sent (SCM_RIGHTS) for a one-time handle.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"

namespace railyard::internal {

class FdChannelClient {
 public:
  // Connects to fdproto::SocketPath(client_socket) and reads the HELLO. UNAVAILABLE naming the
  // path when it cannot (or the daemon refuses: its reason), DEADLINE_EXCEEDED after timeout.
  static absl::StatusOr<std::unique_ptr<FdChannelClient>> Connect(
      const std::string& client_socket, std::chrono::milliseconds timeout);
  ~FdChannelClient();
  FdChannelClient(const FdChannelClient&) = delete;
  FdChannelClient& operator=(const FdChannelClient&) = delete;

  const std::string& ticket() const { return ticket_; }
  // Sends fd and waits for its handle. The daemon's ERROR comes back as its status. Thread-safe.
  absl::StatusOr<uint64_t> Put(int fd, std::chrono::milliseconds timeout);

 private:
  FdChannelClient(int sock, std::string path) : sock_(sock), path_(std::move(path)) {}

  const int sock_;
  const std::string path_;
  std::string ticket_;
  std::mutex mu_;  // one PUT at a time
  uint64_t next_cookie_ = 1;
};

}  // namespace railyard::internal
