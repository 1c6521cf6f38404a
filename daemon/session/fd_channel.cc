#include "daemon/session/fd_channel.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/util/listening_socket.h"
#include "daemon/util/log.h"
#include "daemon/util/passed_fds.h"
#include "daemon/util/random_id.h"
#include "daemon/util/thread_name.h"
#include "proto/railyard/v1/fd_channel.h"

namespace railyard {
namespace {

constexpr int kMaxFdsPerMessage = 8;       // more in one message: refused, all closed
constexpr int kMaxMessagesPerWakeup = 64;  // then the next connection gets its turn

// Sends without ever blocking; false when the client does not take it (gone, or not reading).
bool SendMessage(int fd, const fdproto::Message& m) {
  const std::string bytes = fdproto::Encode(m);
  return ::send(fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL) ==
         static_cast<ssize_t>(bytes.size());
}

bool SendError(int fd, uint64_t cookie, absl::StatusCode code, const std::string& text) {
  fdproto::Message m;
  m.type = fdproto::Type::kError;
  m.cookie = cookie;
  m.code = static_cast<uint32_t>(code);
  m.payload = text;
  return SendMessage(fd, m);
}

}  // namespace

absl::StatusOr<UniqueFd> FdChannel::Take(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  if (dead_) {
    return absl::FailedPreconditionError(
        "this session's buffer side channel is closed: its descriptors are gone");
  }
  auto it = pending_.find(handle);
  if (it == pending_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "fd handle ", handle,
        " was not given out on this session's side channel, or was registered already"));
  }
  UniqueFd fd = std::move(it->second);
  pending_.erase(it);
  return fd;
}

void FdChannel::Close() {
  absl::MutexLock lock(&mu_);
  // The server thread sees EOF and drops (closes) the socket; from now on nothing is taken.
  if (!dead_ && fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  dead_ = true;
  pending_.clear();
}

size_t FdChannel::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

absl::StatusOr<uint64_t> FdChannel::Put(UniqueFd fd, size_t max_pending) {
  absl::MutexLock lock(&mu_);
  if (dead_) return absl::FailedPreconditionError("the session of this side channel has ended");
  if (pending_.size() >= max_pending) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this connection already holds ", pending_.size(),
        " descriptors not yet registered (the limit): RegisterBuffer or drop some first"));
  }
  const uint64_t handle = next_handle_++;
  pending_.emplace(handle, std::move(fd));
  return handle;
}

void FdChannel::Drop() {
  absl::MutexLock lock(&mu_);
  dead_ = true;
  pending_.clear();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::StatusOr<std::unique_ptr<FdChannelServer>> FdChannelServer::Start(Options options) {
  std::unique_ptr<FdChannelServer> s(new FdChannelServer(std::move(options)));
  const std::string& path = s->options_.path;
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("fd side channel path '", path,
                                                   "' is empty or longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  s->listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("socket(AF_UNIX, SOCK_SEQPACKET): ", std::strerror(errno)));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::chmod(path.c_str(), 0660) != 0 || ::listen(s->listen_fd_, 128) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve the fd side channel at ", path, ": ", std::strerror(errno)));
  }
  return Serve(std::move(s));
}

absl::StatusOr<std::unique_ptr<FdChannelServer>> FdChannelServer::Adopt(Options options,
                                                                        int listen_fd) {
  std::unique_ptr<FdChannelServer> s(new FdChannelServer(std::move(options)));
  s->listen_fd_ = listen_fd;
  if (absl::Status st = CheckHandedOverListener(listen_fd, SOCK_SEQPACKET, "side channel socket");
      !st.ok()) {
    return st;
  }
  return Serve(std::move(s));
}

void FdChannelServer::Release() {
  options_.path.clear();
  Stop();
}

absl::StatusOr<std::unique_ptr<FdChannelServer>> FdChannelServer::Serve(
    std::unique_ptr<FdChannelServer> s) {
  s->epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  s->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->epoll_fd_ < 0 || s->wake_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("epoll/eventfd: ", std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = s->listen_fd_;
  ::epoll_ctl(s->epoll_fd_, EPOLL_CTL_ADD, s->listen_fd_, &ev);
  ev.data.fd = s->wake_fd_;
  ::epoll_ctl(s->epoll_fd_, EPOLL_CTL_ADD, s->wake_fd_, &ev);
  s->thread_ = std::thread([raw = s.get()] {
    NameThisThread("ry-fd-channel");
    raw->Run();
  });
  return s;
}

FdChannelServer::~FdChannelServer() { Stop(); }

void FdChannelServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  std::map<int, std::shared_ptr<FdChannel>> all;
  {
    absl::MutexLock lock(&mu_);
    all.swap(by_fd_);
    while (!unbound_.empty()) EraseUnboundLocked(unbound_.begin());
  }
  for (auto& [fd, channel] : all) channel->Drop();
  for (int* fd : {&listen_fd_, &epoll_fd_, &wake_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  if (!options_.path.empty()) ::unlink(options_.path.c_str());
}

absl::StatusOr<std::shared_ptr<FdChannel>> FdChannelServer::Claim(const std::string& ticket) {
  std::shared_ptr<FdChannel> channel;
  {
    absl::MutexLock lock(&mu_);
    auto it = unbound_.find(ticket);
    if (it == unbound_.end()) {
      return absl::NotFoundError(
          "fd_ticket is not one this daemon handed out, or it was used already or expired: "
          "connect the side channel (<socket>.fd) again and pass its new ticket");
    }
    channel = it->second;
    EraseUnboundLocked(it);
  }
  absl::MutexLock lock(&channel->mu_);
  if (channel->dead_) {
    return absl::FailedPreconditionError("the side channel of this fd_ticket is closed already");
  }
  return channel;
}

size_t FdChannelServer::connections() const {
  absl::MutexLock lock(&mu_);
  return by_fd_.size();
}

void FdChannelServer::Run() {
  epoll_event events[32];
  absl::Time last_sweep = absl::Now();
  while (true) {
    // Only connections waiting for their Connect need the clock; new ones are accepted on this
    // thread, so with none waiting the thread sleeps until a descriptor is ready (an idle daemon
    // wakes for nothing).
    bool waiting;
    {
      absl::MutexLock lock(&mu_);
      waiting = !unbound_.empty();
    }
    const int n = ::epoll_wait(epoll_fd_, events, 32, waiting ? 500 : -1);
    if (n < 0 && errno != EINTR) {
      Log(LogLevel::kError, "fdchannel", "epoll_wait failed", {F("error", std::strerror(errno))});
      return;
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) return;
      if (fd == listen_fd_) {
        AcceptAll();
        continue;
      }
      std::shared_ptr<FdChannel> channel;
      {
        absl::MutexLock lock(&mu_);
        auto it = by_fd_.find(fd);
        if (it != by_fd_.end()) channel = it->second;
      }
      if (channel == nullptr) continue;
      const bool hangup = (events[i].events & (EPOLLHUP | EPOLLERR)) != 0;
      if (!ReadFrom(channel, fd) || hangup) DropConnection(fd, "closed");
    }
    const absl::Time now = absl::Now();
    if (now - last_sweep >= absl::Seconds(1)) {
      SweepUnbound(now);
      last_sweep = now;
    }
  }
}

void FdChannelServer::AcceptAll() {
  for (int round = 0; round < 64; ++round) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a connection that died on the way in
    const std::optional<PeerCred> peer = PeerCredOf(fd);
    if (!peer.has_value()) {
      ::close(fd);
      continue;
    }
    const PeerCred cred = *peer;
    {
      absl::MutexLock lock(&mu_);
      std::string full;
      if (by_fd_.size() >= options_.max_connections) {
        full = "railyardd serves its limit of side-channel connections (one per session)";
      } else {
        switch (unbound_shares_.Take(cred.uid)) {
          case CallerShares<uint32_t>::Refusal::kNone:
            break;
          case CallerShares<uint32_t>::Refusal::kCallerShare:
            full = absl::StrCat("uid ", cred.uid, " has ", unbound_shares_.of(cred.uid),
                                " side-channel connections waiting for their Connect, its share "
                                "(--max_unbound_side_channels_per_uid): bind or close them");
            break;
          case CallerShares<uint32_t>::Refusal::kPool:
            full = absl::StrCat(unbound_shares_.total(),
                                " side-channel connections wait for their Connect, the daemon's "
                                "limit (--max_unbound_side_channels): try again shortly");
            break;
        }
      }
      if (!full.empty()) {
        SendError(fd, 0, absl::StatusCode::kResourceExhausted, full);
        ::close(fd);
        Log(LogLevel::kWarning, "fdchannel", "connection refused",
            {F("pid", cred.pid), F("uid", cred.uid), F("reason", full)});
        continue;
      }
    }
    auto channel = std::make_shared<FdChannel>(fd, cred, RandomHex128(), absl::Now());
    {
      // Claimable before the client can know the ticket.
      absl::MutexLock lock(&mu_);
      by_fd_.emplace(fd, channel);
      unbound_.emplace(channel->ticket_, channel);
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.fd = fd;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    }
    fdproto::Message hello;
    hello.type = fdproto::Type::kHello;
    hello.payload = channel->ticket_;
    if (!SendMessage(fd, hello)) DropConnection(fd, "HELLO not taken");
  }
}

bool FdChannelServer::ReadFrom(const std::shared_ptr<FdChannel>& channel, int fd) {
  for (int round = 0; round < kMaxMessagesPerWakeup; ++round) {
    char data[fdproto::kMaxMessage + 1];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    iovec iov{data, sizeof(data)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    // Own every descriptor that came, whatever else is wrong with the message: even a 0-byte
    // record, which reads as end of stream, can carry some (found by fd_channel_fuzz: they
    // leaked).
    std::vector<UniqueFd> fds;
    TakePassedFds(msg, &fds);
    if (n == 0) return false;  // the client closed it (or the session ended: Close)
    std::string why;
    std::optional<fdproto::Message> m =
        (msg.msg_flags & MSG_TRUNC) != 0
            ? std::nullopt
            : fdproto::Decode(std::string_view(data, static_cast<size_t>(n)), &why);
    if ((msg.msg_flags & MSG_TRUNC) != 0) why = "message longer than 256 bytes";
    if (!m.has_value() || m->type != fdproto::Type::kPut) {
      if (m.has_value()) why = "only PUT messages go from the client to the daemon";
      SendError(fd, m.has_value() ? m->cookie : 0, absl::StatusCode::kInvalidArgument,
                absl::StrCat("malformed fd channel message: ", why, "; closing the channel"));
      Log(LogLevel::kWarning, "fdchannel", "malformed message",
          {F("pid", channel->cred().pid), F("uid", channel->cred().uid), F("reason", why)});
      return false;
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0 || fds.size() != 1) {
      const std::string text =
          (msg.msg_flags & MSG_CTRUNC) != 0 || fds.size() > 1
              ? absl::StrCat("a PUT carries exactly one descriptor; this one carried more (",
                             fds.size(), " or more); all were closed")
              : std::string("a PUT carries exactly one descriptor (SCM_RIGHTS); this one had none");
      if (!SendError(fd, m->cookie, absl::StatusCode::kInvalidArgument, text)) return false;
      continue;
    }
    absl::StatusOr<uint64_t> handle = channel->Put(std::move(fds[0]), options_.max_pending_fds);
    if (!handle.ok()) {
      if (!SendError(fd, m->cookie, handle.status().code(),
                     std::string(handle.status().message()))) {
        return false;
      }
      continue;
    }
    fdproto::Message ok;
    ok.type = fdproto::Type::kPutOk;
    ok.cookie = m->cookie;
    ok.handle = *handle;
    if (!SendMessage(fd, ok)) return false;  // not reading its replies: drop it
  }
  return true;
}

void FdChannelServer::DropConnection(int fd, const char* why) {
  std::shared_ptr<FdChannel> channel;
  {
    absl::MutexLock lock(&mu_);
    auto it = by_fd_.find(fd);
    if (it == by_fd_.end()) return;
    channel = std::move(it->second);
    by_fd_.erase(it);
    if (auto u = unbound_.find(channel->ticket_); u != unbound_.end()) EraseUnboundLocked(u);
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  }
  Log(LogLevel::kDebug, "fdchannel", "connection ended",
      {F("pid", channel->cred().pid), F("reason", why)});
  channel->Drop();
}

void FdChannelServer::EraseUnboundLocked(
    std::map<std::string, std::shared_ptr<FdChannel>>::iterator it) {
  unbound_shares_.Give(it->second->cred().uid);
  unbound_.erase(it);
}

void FdChannelServer::SweepUnbound(absl::Time now) {
  std::vector<int> expired;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [ticket, channel] : unbound_) {
      if (now - channel->opened_ > options_.bind_timeout) {
        absl::MutexLock channel_lock(&channel->mu_);
        if (channel->fd_ >= 0) expired.push_back(channel->fd_);
      }
    }
  }
  for (int fd : expired) {
    SendError(fd, 0, absl::StatusCode::kDeadlineExceeded,
              "no Local.Connect named this channel's ticket in time; closing it");
    DropConnection(fd, "unbound too long");
  }
}

}  // namespace railyard
