#include "daemon/services/client_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/session/peer_cred.h"
#include "daemon/util/listening_socket.h"
#include "daemon/util/log.h"
#include "daemon/util/thread_name.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_posix.h"
#include "grpcpp/support/server_callback.h"

namespace railyard {
namespace {

// Refused connections are logged at most this often (with how many were not): a flood must not
// become a flood of log lines.
constexpr absl::Duration kRefusalLogEvery = absl::Seconds(10);
// How long the listener waits after a failed accept before it tries again.
constexpr int kAcceptBackoffMs = 20;

ino_t InodeOf(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
}

// Every call on a refused connection: RESOURCE_EXHAUSTED with why, at once.
class RefusalService final : public grpc::CallbackGenericService {
 public:
  explicit RefusalService(ClientListener* listener) : listener_(listener) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    return new Refusal(
        grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, listener_->RefusalOf(ctx->peer())));
  }

 private:
  class Refusal final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Refusal(grpc::Status status) { Finish(std::move(status)); }
    void OnDone() override { delete this; }
  };
  ClientListener* const listener_;
};

}  // namespace

uint64_t ClientListener::RaiseDescriptorLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  return static_cast<uint64_t>(rl.rlim_cur);
}

absl::StatusOr<std::unique_ptr<ClientListener>> ClientListener::Bind(Options options) {
  std::unique_ptr<ClientListener> l(new ClientListener(std::move(options)));
  const std::string& path = l->options_.path;
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad socket path: ", path));
  }
  l->listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ::unlink(path.c_str());
  const mode_t old = ::umask(0117);  // created 0660: no window where others may connect
  const bool bound = l->listen_fd_ >= 0 &&
                     ::bind(l->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                     ::listen(l->listen_fd_, SOMAXCONN) == 0;
  const int err = errno;
  ::umask(old);
  if (!bound) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on unix:", path, ": ", std::strerror(err)));
  }
  return Ready(std::move(l));
}

absl::StatusOr<std::unique_ptr<ClientListener>> ClientListener::Adopt(Options options,
                                                                      int listen_fd) {
  std::unique_ptr<ClientListener> l(new ClientListener(std::move(options)));
  l->listen_fd_ = listen_fd;
  if (absl::Status s = CheckHandedOverListener(listen_fd, SOCK_STREAM, "client socket"); !s.ok()) {
    return s;
  }
  return Ready(std::move(l));
}

absl::StatusOr<std::unique_ptr<ClientListener>> ClientListener::Ready(
    std::unique_ptr<ClientListener> l) {
  l->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  l->spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  rlimit rl{};
  l->fd_limit_ = ::getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 1024;
  return l;
}

void ClientListener::Release() {
  options_.path.clear();
  Stop();
}

ClientListener::~ClientListener() { Stop(); }

void ClientListener::Start(grpc::Server* server, grpc::Server* refusals) {
  server_ = server;
  refusals_ = refusals;
  thread_ = std::thread([this] {
    NameThisThread("ry-accept");
    Run();
  });
}

void ClientListener::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  for (int* fd : {&listen_fd_, &wake_fd_, &spare_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  if (!options_.path.empty()) ::unlink(options_.path.c_str());
}

ClientListener::Counts ClientListener::counts() {
  absl::MutexLock lock(&mu_);
  SweepLocked();
  return counts_;
}

std::string ClientListener::RefusalOf(const std::string& peer) {
  int fd = -1;
  if (peer.rfind("fd:", 0) == 0) fd = std::atoi(peer.c_str() + 3);
  absl::MutexLock lock(&mu_);
  auto it = reasons_.find(fd);
  if (it != reasons_.end()) return it->second;
  return "railyardd refused this connection to its client socket (its connection limits)";
}

void ClientListener::Run() {
  while (true) {
    bool tracking;
    {
      absl::MutexLock lock(&mu_);
      tracking = !conns_.empty();
    }
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    // With connections to watch, a sweep a second keeps the counts true; idle, it sleeps.
    const int n = ::poll(fds, 2, tracking ? 1000 : -1);
    if (n < 0 && errno != EINTR) {
      Log(LogLevel::kError, "listener", "poll failed", {F("error", std::strerror(errno))});
      return;
    }
    if ((fds[1].revents & POLLIN) != 0) return;
    if ((fds[0].revents & POLLIN) != 0) AcceptAll();
    absl::MutexLock lock(&mu_);
    SweepLocked();
  }
}

void ClientListener::SweepLocked() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    const int fd = it->first;
    ++it;
    if (InodeOf(fd) != conns_[fd].inode) ForgetLocked(fd);
  }
  while (!refusing_order_.empty()) {  // drop the order's stale head
    auto it = conns_.find(refusing_order_.front().first);
    if (it != conns_.end() && it->second.refusing &&
        it->second.seq == refusing_order_.front().second) {
      break;
    }
    refusing_order_.pop_front();
  }
}

void ClientListener::ForgetLocked(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  if (it->second.refusing) {
    --counts_.refusing;
    reasons_.erase(fd);
    if (it->second.own_fd >= 0) ::close(it->second.own_fd);
  } else {
    shares_.Give(it->second.uid);
    --counts_.open;
  }
  conns_.erase(it);
}

void ClientListener::CutOldestRefusalLocked() {
  while (!refusing_order_.empty()) {
    const auto [fd, seq] = refusing_order_.front();
    refusing_order_.pop_front();
    auto it = conns_.find(fd);
    if (it == conns_.end() || !it->second.refusing || it->second.seq != seq) continue;
    // gRPC sees the connection end and closes its descriptor; the caller has had its answer.
    ::shutdown(it->second.own_fd, SHUT_RDWR);
    ForgetLocked(fd);
    ++counts_.refusals_cut;
    return;
  }
}

void ClientListener::ShedOne() {
  if (spare_fd_ >= 0) {
    ::close(spare_fd_);
    spare_fd_ = -1;
  }
  const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) ::close(fd);
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void ClientListener::AcceptAll() {
  for (int round = 0; round < 64; ++round) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      if (errno == ECONNABORTED) continue;
      {
        absl::MutexLock lock(&mu_);
        ++counts_.accept_failures;
      }
      if (errno == EMFILE || errno == ENFILE) ShedOne();
      ::poll(nullptr, 0, kAcceptBackoffMs);
      return;
    }
    const std::optional<PeerCred> peer = PeerCredOf(fd);
    if (!peer.has_value()) {
      ::close(fd);
      continue;
    }
    const PeerCred& cred = *peer;
    const ino_t inode = InodeOf(fd);
    std::string why;
    bool admit = false;
    {
      absl::MutexLock lock(&mu_);
      // The kernel reuses descriptor numbers: one still in the table was closed by gRPC since
      // the last sweep. Forget it before this connection takes its place.
      ForgetLocked(fd);
      if (static_cast<uint64_t>(fd) + options_.fd_reserve >= fd_limit_) {
        SweepLocked();
        ++counts_.refused_descriptors;
        why = absl::StrCat("railyardd keeps ", options_.fd_reserve, " of its ", fd_limit_,
                           " descriptors free and has no more for clients: try again shortly");
      } else {
        auto verdict = shares_.Take(cred.uid);
        if (verdict != CallerShares<uid_t>::Refusal::kNone) {
          SweepLocked();  // closed connections may have left room
          verdict = shares_.Take(cred.uid);
        }
        switch (verdict) {
          case CallerShares<uid_t>::Refusal::kNone:
            admit = true;
            break;
          case CallerShares<uid_t>::Refusal::kCallerShare:
            ++counts_.refused_share;
            why = absl::StrCat("uid ", cred.uid, " has ", shares_.of(cred.uid),
                               " connections open to railyardd's client socket, its share "
                               "(--max_client_connections_per_uid): close some");
            break;
          case CallerShares<uid_t>::Refusal::kPool:
            ++counts_.refused_pool;
            why = absl::StrCat("railyardd's client socket serves ", shares_.total(),
                               " connections, its limit (--max_client_connections): try again "
                               "shortly");
            break;
        }
      }
      if (admit) {
        conns_[fd] = Conn{inode, cred.uid, false};
        ++counts_.open;
      } else {
        const absl::Time now = absl::Now();
        if (now - last_refusal_log_ >= kRefusalLogEvery) {
          Log(LogLevel::kWarning, "listener", "client connection refused",
              {F("pid", cred.pid), F("uid", cred.uid), F("reason", why),
               F("refused_since_last_log", unlogged_refusals_)});
          last_refusal_log_ = now;
          unlogged_refusals_ = 0;
        } else {
          ++unlogged_refusals_;
        }
        if (refusals_ == nullptr || options_.max_refusing == 0) {
          ::close(fd);
          continue;
        }
        if (counts_.refusing >= options_.max_refusing) SweepLocked();
        if (counts_.refusing >= options_.max_refusing) CutOldestRefusalLocked();
        const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (own < 0) {  // no descriptor to keep a handle on it: close it unanswered
          ::close(fd);
          continue;
        }
        const uint64_t seq = next_seq_++;
        conns_[fd] = Conn{inode, cred.uid, true, own, seq};
        refusing_order_.emplace_back(fd, seq);
        reasons_[fd] = why;
        ++counts_.refusing;
      }
    }
    // gRPC owns fd from here, and closes it when the connection ends.
    grpc::AddInsecureChannelFromFd(admit ? server_ : refusals_, fd);
  }
}

RefusalServer::RefusalServer(ClientListener* listener)
    : service_(std::make_unique<RefusalService>(listener)) {
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(service_.get());
  // A refused connection lives about two seconds: long enough to hear why.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 1000);
  server_ = builder.BuildAndStart();
}

RefusalServer::~RefusalServer() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
}

}  // namespace railyard
