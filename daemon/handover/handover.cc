#include "daemon/handover/handover.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "daemon/util/log.h"
#include "daemon/util/thread_name.h"

namespace railyard::handover {
namespace {

// How long either side waits for the other's next message, Ready aside.
constexpr absl::Duration kStepTimeout = absl::Seconds(10);

void Refuse(int fd, const std::string& reason) {
  v1::HandoverMessage m = Stamped();
  m.mutable_refused()->set_reason(reason);
  (void)Send(fd, std::move(m), {}, absl::Now() + absl::Seconds(1));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HandoverServer>> HandoverServer::Start(std::string path,
                                                                      std::string socket,
                                                                      absl::Duration ready_timeout,
                                                                      Hooks hooks) {
  absl::StatusOr<UniqueFd> listen = ListenAt(path);
  if (!listen.ok()) return listen.status();
  std::unique_ptr<HandoverServer> s(new HandoverServer());
  s->path_ = std::move(path);
  s->socket_ = std::move(socket);
  s->ready_timeout_ = ready_timeout;
  s->hooks_ = std::move(hooks);
  s->listen_ = *std::move(listen);
  s->wake_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s->wake_.valid()) return absl::UnavailableError("eventfd failed");
  s->thread_ = std::thread([raw = s.get()] {
    NameThisThread("ry-handover");
    raw->Run();
  });
  return s;
}

HandoverServer::~HandoverServer() { Stop(); }

void HandoverServer::Stop() {
  if (stopping_.exchange(true)) return;
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  const int conn = conn_.load();
  if (conn >= 0) ::shutdown(conn, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
}

void HandoverServer::Run() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{listen_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    const int n = ::poll(fds, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || (fds[1].revents & POLLIN) != 0) return;
    UniqueFd conn(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn.valid()) continue;
    conn_.store(conn.get());
    if (stopping_.load()) ::shutdown(conn.get(), SHUT_RDWR);  // Stop() raced the accept
    const bool done = Serve(conn.get());
    conn_.store(-1);
    if (done) {
      conn.Reset();
      hooks_.hand_over();
      return;
    }
  }
}

bool HandoverServer::Serve(int fd) {
  if (absl::Status s = CheckPeerIsUs(fd); !s.ok()) {
    Log(LogLevel::kWarning, "handover", "refused", {F("reason", s.message())});
    Refuse(fd, std::string(s.message()));
    return false;
  }
  absl::StatusOr<Received> hello = Receive(fd, absl::Now() + kStepTimeout);
  if (!hello.ok() && hello.status().code() == absl::StatusCode::kUnavailable) {
    return false;  // closed before a word: a probe of whether a daemon serves (takeover_if_serving)
  }
  if (!hello.ok() || !hello->message.has_hello()) {
    const std::string why = hello.ok() ? "expected Hello" : std::string(hello.status().message());
    Log(LogLevel::kWarning, "handover", "refused", {F("reason", why)});
    Refuse(fd, why);
    return false;
  }
  const v1::HandoverMessage& h = hello->message;
  if (absl::Status s = Compatible(h.hello().min_protocol(), h.protocol()); !s.ok()) {
    Log(LogLevel::kWarning, "handover", "refused",
        {F("reason", s.message()), F("their_version", h.daemon_version())});
    Refuse(fd, std::string(s.message()));
    return false;
  }
  Log(LogLevel::kInfo, "handover", "a new railyardd asks to take over",
      {F("pid", h.pid()), F("version", h.daemon_version()), F("protocol", h.protocol())});
  v1::HandoverMessage offer = Stamped();
  offer.mutable_offer()->set_socket(socket_);
  std::vector<int> fds;
  for (const auto& [name, d] : hooks_.offer()) {
    offer.mutable_offer()->add_fds(name);
    fds.push_back(d);
  }
  if (absl::Status s = Send(fd, std::move(offer), fds, absl::Now() + kStepTimeout); !s.ok()) {
    Log(LogLevel::kWarning, "handover", "offer not sent", {F("reason", s.message())});
    return false;
  }
  absl::StatusOr<Received> ready = Receive(fd, absl::Now() + ready_timeout_);
  if (!ready.ok() || !ready->message.has_ready()) {
    const std::string why = !ready.ok()                    ? std::string(ready.status().message())
                            : ready->message.has_refused() ? ready->message.refused().reason()
                                                           : std::string("expected Ready");
    // Nothing changed here: this daemon goes on serving.
    Log(LogLevel::kWarning, "handover", "the new railyardd did not take over; serving on",
        {F("reason", why)});
    return false;
  }
  const uint32_t sessions = hooks_.release();
  v1::HandoverMessage released = Stamped();
  released.mutable_released()->set_sessions(sessions);
  // It serves already: whether or not it hears this, this daemon no longer accepts.
  (void)Send(fd, std::move(released), {}, absl::Now() + kStepTimeout);
  handed_over_.store(true);
  Log(LogLevel::kInfo, "handover", "released the node to the new railyardd",
      {F("pid", ready->message.pid()), F("sessions", sessions)});
  return true;
}

absl::StatusOr<Takeover> Takeover::Begin(const std::string& socket, absl::Duration timeout) {
  const std::string path = HandoverPath(socket);
  absl::StatusOr<UniqueFd> conn = ConnectTo(path, timeout);
  if (!conn.ok()) return conn.status();
  if (absl::Status s = CheckPeerIsUs(conn->get()); !s.ok()) return s;
  v1::HandoverMessage hello = Stamped();
  hello.mutable_hello()->set_min_protocol(kMinProtocol);
  const absl::Time deadline = absl::Now() + std::max(timeout, kStepTimeout);
  if (absl::Status s = Send(conn->get(), std::move(hello), {}, deadline); !s.ok()) return s;
  absl::StatusOr<Received> offer = Receive(conn->get(), deadline);
  if (!offer.ok()) return offer.status();
  const v1::HandoverMessage& m = offer->message;
  if (m.has_refused()) {
    return absl::FailedPreconditionError(
        absl::StrCat("railyardd ", m.pid(), " (", m.daemon_version(),
                     ") refused the takeover: ", m.refused().reason()));
  }
  if (!m.has_offer()) return absl::InvalidArgumentError("expected an Offer from the old railyardd");
  if (absl::Status s = Compatible(kMinProtocol, m.protocol()); !s.ok()) return s;
  if (m.offer().socket() != socket) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the railyardd at ", path, " serves --socket ", m.offer().socket(), ", not ", socket));
  }
  if (offer->fds.size() != static_cast<size_t>(m.offer().fds_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the Offer names ", m.offer().fds_size(), " descriptors but ", offer->fds.size(), " came"));
  }
  Takeover t;
  t.conn_ = *std::move(conn);
  for (int i = 0; i < m.offer().fds_size(); ++i) {
    t.fds_[m.offer().fds(i)] = std::move(offer->fds[static_cast<size_t>(i)]);
  }
  t.old_version_ = m.daemon_version();
  t.old_pid_ = m.pid();
  t.old_protocol_ = m.protocol();
  return t;
}

UniqueFd Takeover::Take(const std::string& name) {
  auto it = fds_.find(name);
  if (it == fds_.end()) return UniqueFd();
  UniqueFd fd = std::move(it->second);
  fds_.erase(it);
  return fd;
}

absl::StatusOr<uint32_t> Takeover::Ready(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::HandoverMessage ready = Stamped();
  ready.mutable_ready();
  if (absl::Status s = Send(conn_.get(), std::move(ready), {}, deadline); !s.ok()) return s;
  absl::StatusOr<Received> released = Receive(conn_.get(), deadline);
  if (!released.ok()) return released.status();
  if (!released->message.has_released()) {
    return absl::InvalidArgumentError("expected Released from the old railyardd");
  }
  return released->message.released().sessions();
}

}  // namespace railyard::handover
