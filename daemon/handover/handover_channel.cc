#include "daemon/handover/handover_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "daemon/util/passed_fds.h"
#include "daemon/version.h"

namespace railyard::handover {
namespace {

std::string Errno(int err) { return std::strerror(err); }

// Waits until fd is readable (POLLIN) or writable (POLLOUT), or the deadline passes.
absl::Status WaitFor(int fd, short events, absl::Time deadline) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("no answer on the handover socket in time");
    }
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("poll: ", Errno(errno)));
    if (n > 0) return absl::OkStatus();
  }
}

// Reads exactly size bytes (the first read may bring descriptors).
absl::Status ReadAll(int fd, char* data, size_t size, absl::Time deadline,
                     std::vector<UniqueFd>* fds) {
  size_t got = 0;
  while (got < size) {
    if (absl::Status s = WaitFor(fd, POLLIN, deadline); !s.ok()) return s;
    iovec iov{data + got, size - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("handover socket: ", Errno(errno)));
    TakePassedFds(msg, fds);  // owned (closed) whatever happens next
    if ((msg.msg_flags & MSG_CTRUNC) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the handover peer sent more than ", kMaxFds, " descriptors"));
    }
    if (n == 0) return absl::UnavailableError("the handover peer closed the connection");
    got += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

std::string HandoverPath(const std::string& socket) { return socket + ".handover"; }

absl::StatusOr<UniqueFd> ListenAt(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  std::string tmpl = absl::StrCat(dir.empty() ? "." : dir, "/.railyard-handover.XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create a private directory beside ", path, ": ", Errno(errno)));
  }
  const std::string staging = tmpl + "/h.sock";
  auto cleanup = [&] {
    ::unlink(staging.c_str());
    ::rmdir(tmpl.c_str());
  };
  sockaddr_un addr{};
  if (staging.size() >= sizeof(addr.sun_path) || path.size() >= sizeof(addr.sun_path)) {
    cleanup();
    return absl::InvalidArgumentError(
        absl::StrCat("handover socket ", path, " is too long for a Unix socket once staged"));
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, staging.data(), staging.size());
  if (!fd.valid() || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::chmod(staging.c_str(), 0600) != 0 || ::listen(fd.get(), 4) != 0 ||
      ::rename(staging.c_str(), path.c_str()) != 0) {
    const std::string err = Errno(errno);
    cleanup();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", path, ": ", err));
  }
  ::rmdir(tmpl.c_str());
  return fd;
}

absl::StatusOr<UniqueFd> ConnectTo(const std::string& path, absl::Duration timeout) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is too long for a Unix socket"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return absl::UnavailableError(absl::StrCat("socket: ", Errno(errno)));
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
      return fd;
    }
    const int err = errno;
    // A daemon between bind and listen, or with a full backlog: try again until the deadline.
    if ((err != EAGAIN && err != ECONNREFUSED) || absl::Now() >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("no railyardd to take over from at ", path, ": ", Errno(err)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::Status CheckPeerIsUs(int fd) {
  ucred uc{};
  socklen_t len = sizeof(uc);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) != 0) {
    return absl::PermissionDeniedError("the handover peer's credentials are unknown");
  }
  if (uc.uid != ::geteuid() && uc.uid != 0) {
    return absl::PermissionDeniedError(absl::StrCat("the handover peer (pid ", uc.pid, ", uid ",
                                                    uc.uid, ") is not this daemon's user (uid ",
                                                    ::geteuid(), ") or root"));
  }
  return absl::OkStatus();
}

absl::Status Send(int fd, v1::HandoverMessage message, const std::vector<int>& fds,
                  absl::Time deadline) {
  if (fds.size() > kMaxFds) return absl::InvalidArgumentError("too many descriptors");
  std::string payload;
  message.SerializeToString(&payload);
  if (payload.size() > kMaxMessageBytes) return absl::InvalidArgumentError("message too long");
  const uint32_t len = static_cast<uint32_t>(payload.size());
  std::string frame(4, '\0');
  std::memcpy(frame.data(), &len, 4);
  frame += payload;
  size_t sent = 0;
  bool with_fds = !fds.empty();
  while (sent < frame.size()) {
    if (absl::Status s = WaitFor(fd, POLLOUT, deadline); !s.ok()) return s;
    iovec iov{frame.data() + sent, frame.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
    if (with_fds) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("handover socket: ", Errno(errno)));
    sent += static_cast<size_t>(n);
    with_fds = false;  // they went with the first bytes
  }
  return absl::OkStatus();
}

absl::StatusOr<Received> Receive(int fd, absl::Time deadline) {
  Received r;
  uint32_t len = 0;
  if (absl::Status s = ReadAll(fd, reinterpret_cast<char*>(&len), 4, deadline, &r.fds); !s.ok()) {
    return s;
  }
  if (len > kMaxMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("handover message of ", len, " bytes: at most ", kMaxMessageBytes));
  }
  std::string payload(len, '\0');
  if (absl::Status s = ReadAll(fd, payload.data(), len, deadline, &r.fds); !s.ok()) return s;
  if (r.fds.size() > kMaxFds) {
    return absl::InvalidArgumentError(
        absl::StrCat("the handover peer sent more than ", kMaxFds, " descriptors"));
  }
  if (!r.message.ParseFromString(payload)) {
    return absl::InvalidArgumentError("handover message does not parse");
  }
  return r;
}

v1::HandoverMessage Stamped() {
  v1::HandoverMessage m;
  m.set_protocol(kProtocol);
  m.set_daemon_version(kRailyardVersion);
  m.set_pid(::getpid());
  return m;
}

absl::Status Compatible(uint32_t min_protocol, uint32_t protocol) {
  // Overlap of [min_protocol, protocol] with [kMinProtocol, kProtocol].
  if (min_protocol > protocol || protocol < kMinProtocol || min_protocol > kProtocol) {
    return absl::FailedPreconditionError(absl::StrCat(
        "handover protocol versions ", min_protocol, "..", protocol, " of the other railyardd and ",
        kMinProtocol, "..", kProtocol, " of this one do not meet: upgrade one release at a time"));
  }
  return absl::OkStatus();
}

}  // namespace railyard::handover
