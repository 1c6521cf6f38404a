#include "fd_channel_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "memfd_buffer.h"
#include "proto/railyard/v1/fd_channel.h"

namespace railyard::internal {
namespace {

// Waits for one message, up to timeout.
absl::StatusOr<fdproto::Message> Receive(int sock, const std::string& path,
                                         std::chrono::milliseconds timeout) {
  pollfd p{sock, POLLIN, 0};
  // A signal (a profiler's SIGPROF, a Python handler) interrupts poll: wait out the rest.
  const auto until = std::chrono::steady_clock::now() + timeout;
  int ready;
  do {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    ready = poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
  } while (ready < 0 && errno == EINTR);
  if (ready == 0) {
    return absl::DeadlineExceededError(absl::StrCat(
        "railyardd's fd side channel ", path, " did not answer within ", timeout.count(), " ms"));
  }
  char data[fdproto::kMaxMessage];
  ssize_t n = -1;
  if (ready > 0) {
    do n = recv(sock, data, sizeof(data), 0);
    while (n < 0 && errno == EINTR);
  }
  if (n <= 0) {
    return absl::UnavailableError(absl::StrCat("railyardd's fd side channel ", path, " closed",
                                               n < 0 ? ": " + ErrnoText(errno) : ""));
  }
  std::string why;
  std::optional<fdproto::Message> m =
      fdproto::Decode(std::string_view(data, static_cast<size_t>(n)), &why);
  if (!m.has_value()) {
    return absl::InternalError(absl::StrCat("bad message on the fd side channel: ", why));
  }
  return *std::move(m);
}

absl::Status ErrorOf(const fdproto::Message& m) {
  const auto code = static_cast<absl::StatusCode>(m.code);
  return absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code, m.payload);
}

}  // namespace

absl::StatusOr<std::unique_ptr<FdChannelClient>> FdChannelClient::Connect(
    const std::string& client_socket, std::chrono::milliseconds timeout) {
  const std::string path = fdproto::SocketPath(client_socket);
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("fd side channel path ", path, " is too long"));
  }
  const int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (sock < 0) return absl::InternalError(absl::StrCat("socket: ", ErrnoText(errno)));
  std::unique_ptr<FdChannelClient> c(new FdChannelClient(sock, path));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("railyardd's fd side channel ", path, " not reachable: ", ErrnoText(errno)));
  }
  absl::StatusOr<fdproto::Message> hello = Receive(sock, path, timeout);
  if (!hello.ok()) return hello.status();
  if (hello->type == fdproto::Type::kError) {
    absl::Status refused = ErrorOf(*hello);
    return absl::Status(refused.code(),
                        absl::StrCat("railyardd refused the fd side channel: ", refused.message()));
  }
  if (hello->type != fdproto::Type::kHello || hello->payload.size() != fdproto::kTicketChars) {
    return absl::InternalError("the fd side channel did not start with a HELLO ticket");
  }
  c->ticket_ = hello->payload;
  return c;
}

FdChannelClient::~FdChannelClient() { close(sock_); }

absl::StatusOr<uint64_t> FdChannelClient::Put(int fd, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  fdproto::Message put;
  put.type = fdproto::Type::kPut;
  put.cookie = next_cookie_++;
  const std::string bytes = fdproto::Encode(put);
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  if (sendmsg(sock_, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
    return absl::UnavailableError(
        absl::StrCat("sending a buffer descriptor on ", path_, ": ", ErrnoText(errno)));
  }
  absl::StatusOr<fdproto::Message> reply = Receive(sock_, path_, timeout);
  if (!reply.ok()) return reply.status();
  if (reply->cookie != put.cookie) {
    return absl::InternalError("the fd side channel answered another request");
  }
  if (reply->type == fdproto::Type::kError) return ErrorOf(*reply);
  if (reply->type != fdproto::Type::kPutOk) {
    return absl::InternalError("unexpected message on the fd side channel");
  }
  return reply->handle;
}

}  // namespace railyard::internal
