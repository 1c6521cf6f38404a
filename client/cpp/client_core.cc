#include "client_core.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client_link.h"
#include "memfd_buffer.h"
#include "proto/railyard/v1/ring.h"

namespace railyard {
namespace internal {
namespace {

std::string EnvOr(const char* name, const std::string& fallback) {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read at Connect only; this library never sets env.
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? std::string(value) : fallback;
}

// HTTP/2 keepalive on the session's channel ($RAILYARD_KEEPALIVE_MS, default 5000; 0: off): a
// daemon that answers no ping for that long (stopped, wedged) ends the session, and with it every
// wait, with UNAVAILABLE, as a daemon that exits does. gRPC pings at most once a second; the
// daemon permits one every 500 ms.
constexpr long kDefaultKeepaliveMs = 5000;
constexpr long kMinKeepaliveMs = 1000;

absl::StatusOr<grpc::ChannelArguments> SessionChannelArgs(long* keepalive_ms) {
  grpc::ChannelArguments args;
  const std::string value = EnvOr("RAILYARD_KEEPALIVE_MS", "");
  long ms = kDefaultKeepaliveMs;
  if (!value.empty()) {
    char* end = nullptr;
    errno = 0;
    ms = std::strtol(value.c_str(), &end, 10);
    if (end == value.c_str() || *end != '\0' || errno != 0 ||
        (ms != 0 && (ms < kMinKeepaliveMs || ms > std::numeric_limits<int>::max()))) {
      return absl::InvalidArgumentError(
          absl::StrCat("RAILYARD_KEEPALIVE_MS=", value, ": expected 0 (off) or milliseconds in [",
                       kMinKeepaliveMs, ", ", std::numeric_limits<int>::max(),
                       "] (gRPC pings at most once a second)"));
    }
  }
  *keepalive_ms = ms;
  // A channel of its own connection: after a handover the next session must reach the daemon
  // now accepting on the socket, not a connection to the old one that gRPC would share.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (ms == 0) return args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(ms));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(ms));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // The session's stream is quiet while operations go over the rings; gRPC would otherwise stop
  // pinging after two pings without data.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return args;
}

absl::StatusCode CodeFromInt(int code) {
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnknown;
  }
  return static_cast<absl::StatusCode>(code);
}

// A clear error before gRPC's generic one when the socket is obviously not there.
absl::Status CheckSocketPath(const std::string& socket) {
  if (socket.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path ", socket, " is ", socket.size(),
                                                   " bytes; Unix sockets allow at most ",
                                                   sizeof(sockaddr_un::sun_path) - 1));
  }
  struct stat st;
  if (stat(socket.c_str(), &st) != 0) {
    int err = errno;
    return absl::UnavailableError(absl::StrCat(
        "railyardd not reachable at ", socket, ": ", ErrnoText(err),
        err == ENOENT ? " (is railyardd running? the socket is set by its --socket flag and by "
                        "RAILYARD_SOCKET for clients)"
                      : ""));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::UnavailableError(
        absl::StrCat("railyardd not reachable at ", socket, ": not a Unix socket"));
  }
  return absl::OkStatus();
}

}  // namespace

void PendingRequest::Complete(absl::Status status, uint64_t seq) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    if (!status.ok() && stream_done_ != nullptr) StoreAtLeast(stream_done_, stream_value_);
    status_ = std::move(status);
    if (seq != 0) seq_ = seq;
  }
  cv_.notify_all();
}

void PendingRequest::SetSeq(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  if (seq_ == 0) seq_ = seq;
}

void PendingRequest::SetRings(std::shared_ptr<ClientRings> rings) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    rings_ = std::move(rings);
  }
  cv_.notify_all();
}

absl::Status PendingRequest::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = timeout >= kForever ? std::chrono::steady_clock::time_point::max()
                                            : std::chrono::steady_clock::now() +
                                                  std::max(timeout, std::chrono::milliseconds(0));
  auto timed_out = [&] {
    return absl::DeadlineExceededError(
        absl::StrCat("operation not complete after ", timeout.count(),
                     " ms (it keeps running in the daemon; wait again or give up)"));
  };
  while (true) {
    std::shared_ptr<ClientRings> rings;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return status_;
      rings = rings_;
    }
    if (rings != nullptr && rings->forked()) {
      return absl::FailedPreconditionError(
          "this operation was submitted by the process this one was forked from: its completion "
          "is the parent's to read");
    }
    if (rings != nullptr && !rings->closed()) {
      // Its completion comes on these rings, read here; they close when their session ends (and
      // the request then moves to the next session's rings, or completes).
      rings->WaitUntil(
          [&] {
            std::lock_guard<std::mutex> lock(mu_);
            return done_ || rings_ != rings;
          },
          deadline);
    } else {
      // On the Connect stream, or between sessions: completed by another thread, or given rings.
      std::unique_lock<std::mutex> lock(mu_);
      auto changed = [&] { return done_ || rings_ != rings; };
      if (deadline == std::chrono::steady_clock::time_point::max()) {
        cv_.wait(lock, changed);
      } else {
        cv_.wait_until(lock, deadline, changed);
      }
    }
    if (done()) continue;
    if (std::chrono::steady_clock::now() >= deadline) return timed_out();
  }
}

bool PendingRequest::Test() {
  std::shared_ptr<ClientRings> rings;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return true;
    rings = rings_;
  }
  if (rings != nullptr) rings->Drain();
  return done();
}

bool PendingRequest::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

uint64_t PendingRequest::seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seq_;
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(CodeFromInt(static_cast<int>(status.error_code())), status.error_message());
}

}  // namespace internal

absl::StatusOr<std::shared_ptr<ClientCore>> ClientCore::Connect(const ClientOptions& options) {
  // In a child forked after this, the last reference to the core must not destroy it: that
  // would disconnect the parent's session over the parent's gRPC channel and join threads that
  // do not exist in the child. The child leaks it instead (its memory is a copy).
  std::shared_ptr<ClientCore> core(new ClientCore(), [](ClientCore* c) {
    if (!c->forked()) delete c;
  });
  core->socket_ = !options.socket.empty()
                      ? options.socket
                      : internal::EnvOr("RAILYARD_SOCKET", "/run/railyard/railyard.sock");
  core->job_ = !options.job.empty() ? options.job : internal::EnvOr("RAILYARD_JOB", "default");
  core->token_ = !options.token.empty() ? options.token : internal::EnvOr("RAILYARD_TOKEN", "");
  core->stream_ops_ = options.stream_ops;
  core->default_algo_ = internal::EnvOr("RAILYARD_ALGO", "");
  core->default_compression_ = internal::EnvOr("RAILYARD_COMPRESSION", "");
  core->integrity_ =
      !options.integrity.empty() ? options.integrity : internal::EnvOr("RAILYARD_INTEGRITY", "");
  if (!core->integrity_.empty() && core->integrity_ != "none" && core->integrity_ != "crc32c") {
    return absl::InvalidArgumentError(
        absl::StrCat("integrity \"", core->integrity_,
                     "\" (option or $RAILYARD_INTEGRITY): expected none or crc32c"));
  }
  const std::string reconnect = internal::EnvOr("RAILYARD_RECONNECT_S", "");
  if (!reconnect.empty()) {
    char* end = nullptr;
    errno = 0;
    const long s = std::strtol(reconnect.c_str(), &end, 10);
    if (end == reconnect.c_str() || *end != '\0' || errno != 0 || s < 0 || s > 86400) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RAILYARD_RECONNECT_S=", reconnect,
          ": expected seconds in [0, 86400] (how long a client waits for railyardd to come back; "
          "0: not at all)"));
    }
    core->reconnect_window_ = std::chrono::seconds(s);
  }
  core->fastpath_env_ = internal::EnvOr("RAILYARD_FASTPATH", "");
  const std::string spin_env = internal::EnvOr("RAILYARD_SPIN_US", "");
  if (!spin_env.empty()) {
    char* end = nullptr;
    const long spin_us = std::strtol(spin_env.c_str(), &end, 10);
    if (end == spin_env.c_str() || *end != '\0' || spin_us < 0 || spin_us > 1000000) {
      return absl::InvalidArgumentError(
          absl::StrCat("RAILYARD_SPIN_US=", spin_env, ": expected microseconds in [0, 1000000]"));
    }
    core->spin_ = std::chrono::microseconds(spin_us);
  }
  if (absl::Status st = internal::CheckSocketPath(core->socket_); !st.ok()) return st;
  absl::StatusOr<std::shared_ptr<Link>> link = core->OpenLink(options.connect_timeout);
  if (!link.ok()) return link.status();
  {
    std::lock_guard<std::mutex> lock(core->mu_);
    core->link_ = *link;
    core->session_id_ = (*link)->session_id;
    core->node_name_ = (*link)->node_name;
  }
  return core;
}

absl::StatusOr<std::shared_ptr<ClientCore::Link>> ClientCore::OpenLink(
    std::chrono::milliseconds timeout) {
  absl::StatusOr<grpc::ChannelArguments> channel_args =
      internal::SessionChannelArgs(&keepalive_ms_);
  if (!channel_args.ok()) return channel_args.status();
  auto link = std::make_shared<Link>();
  // The side channel first: its ticket names, in Connect, the connection whose peer credentials
  // the daemon records and over which this session's buffers travel.
  const auto side_timeout = timeout >= internal::kForever
                                ? internal::kRpcTimeout
                                : std::max(timeout, std::chrono::milliseconds(1));
  absl::StatusOr<std::unique_ptr<internal::FdChannelClient>> side =
      internal::FdChannelClient::Connect(socket_, side_timeout);
  if (!side.ok()) {
    if (side.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::UnavailableError(
          absl::StrCat("railyardd not reachable at ", socket_, ": ", side.status().message()));
    }
    return side.status();
  }
  link->fd_channel = *std::move(side);
  link->channel = grpc::CreateCustomChannel("unix:" + socket_, grpc::InsecureChannelCredentials(),
                                            *channel_args);
  link->stub = v1::Local::NewStub(link->channel);

  v1::ConnectRequest request;
  request.set_job_id(job_);
  request.set_token(token_);
  request.set_fd_ticket(link->fd_channel->ticket());
  request.set_pid(getpid());
  request.set_client("railyard-cpp/" RAILYARD_VERSION);
  // The reader thread opens the stream itself: opening can block while the channel connects, and
  // TryCancel() bounds that wait too.
  link->reader = std::thread([this, l = link.get(), weak = std::weak_ptr<Link>(link), request] {
    l->stream = l->stub->Connect(&l->stream_ctx, request);
    // The link outlives its reader (~Link joins it): lock() fails only during that join.
    std::shared_ptr<Link> self = weak.lock();
    if (self == nullptr) {
      v1::SessionEvent ignored;
      while (l->stream->Read(&ignored)) {
      }
      (void)l->stream->Finish();
      return;
    }
    ReadEvents(self);
  });

  std::unique_lock<std::mutex> lock(mu_);
  auto answered_pred = [&] { return link->connected || link->ended || shutting_down_; };
  bool answered = true;
  if (timeout >= internal::kForever) {
    cv_.wait(lock, answered_pred);
  } else {
    answered = cv_.wait_for(lock, std::max(timeout, std::chrono::milliseconds(0)), answered_pred);
  }
  if (link->connected) {
    lock.unlock();
    // The fast path: on unless RAILYARD_FASTPATH=0; "1" makes a failure to set it up an error.
    if (fastpath_env_ != "0") {
      if (absl::Status st = OpenRings(*link); !st.ok() && fastpath_env_ == "1") {
        link->stream_ctx.TryCancel();
        return absl::Status(st.code(), absl::StrCat("RAILYARD_FASTPATH=1: the session rings "
                                                    "could not be opened: ",
                                                    st.message()));
      }
    }
    return link;
  }
  absl::Status error;
  if (!link->connected && !link->ended && shutting_down_) {
    error = absl::FailedPreconditionError("the client is disconnected");
  } else if (!answered) {
    error = absl::UnavailableError(absl::StrCat("railyardd not reachable at ", socket_,
                                                ": no answer within ", timeout.count(), " ms"));
  } else if (link->end.code() == absl::StatusCode::kUnavailable ||
             link->end.code() == absl::StatusCode::kDeadlineExceeded) {
    error = absl::UnavailableError(
        absl::StrCat("railyardd not reachable at ", socket_, ": ", link->end.message()));
  } else {
    // The daemon refused the session (token, job id): its message says why.
    error = link->end;
  }
  if (error.ok())
    error = absl::UnavailableError(absl::StrCat("railyardd at ", socket_, " ended the session"));
  lock.unlock();
  link->stream_ctx.TryCancel();
  return error;
}

ClientCore::~ClientCore() { Shutdown(); }

absl::Status ClientCore::OpenRings(Link& link) {
  int memfd = -1;
  absl::StatusOr<std::unique_ptr<internal::ClientRings>> rings = internal::ClientRings::Create(
      job_, ringproto::kDefaultSqEntries, ringproto::kDefaultCqEntries, spin_, &memfd);
  if (!rings.ok()) return rings.status();
  absl::StatusOr<uint64_t> handle = link.fd_channel->Put(memfd, internal::kRpcTimeout);
  close(memfd);
  if (!handle.ok()) return handle.status();
  grpc::ClientContext ctx;
  SetDeadline(&ctx, internal::kRpcTimeout);
  v1::OpenRingsRequest request;
  request.set_session_id(link.session_id);
  request.set_fd_handle(*handle);
  request.set_sq_entries((*rings)->sq_entries());
  request.set_cq_entries((*rings)->cq_entries());
  v1::OpenRingsResponse response;
  grpc::Status status = link.stub->OpenRings(&ctx, request, &response);
  if (!status.ok()) return RpcError("OpenRings", status);
  std::shared_ptr<internal::ClientRings> shared = *std::move(rings);
  shared->SetOnCompletion(
      [this](uint64_t request_id, absl::Status st, uint64_t seq, uint32_t flags) {
        OnCompletion(request_id, std::move(st), seq, flags);
      });
  {
    // The reader thread looks at the rings when the session ends, which may be now.
    std::lock_guard<std::mutex> lock(mu_);
    link.rings = std::move(shared);
  }
  return absl::OkStatus();
}

bool ClientCore::fastpath() const {
  std::lock_guard<std::mutex> lock(mu_);
  return link_ != nullptr && link_->rings != nullptr;
}

uint64_t ClientCore::reconnects() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

void ClientCore::OnCompletion(uint64_t request_id, absl::Status status, uint64_t seq,
                              uint32_t flags) {
  std::shared_ptr<internal::PendingRequest> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(request_id);
    if (it == pending_.end()) return;  // not ours (or a refusal the daemon could not attribute)
    if ((flags & ringproto::kCqFlagMoved) != 0) {
      // Handed back untaken: sent again once the session is rebuilt on the next daemon.
      it->second.moved = true;
      return;
    }
    if (status.ok() && internal::IsCollective(it->second.request)) {
      auto c = comms_.find(it->second.request.comm_handle());
      if (c != comms_.end()) c->second.next_seq = std::max(c->second.next_seq, seq + 1);
    }
    pending = std::move(it->second.pending);
    pending_.erase(it);
  }
  pending->Complete(std::move(status), seq);
}

void ClientCore::ReadEvents(const std::shared_ptr<Link>& link) {
  v1::SessionEvent event;
  while (link->stream->Read(&event)) {
    if (event.has_connected()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (link->connected) continue;  // only the first one counts
        link->session_id = event.connected().session_id();
        link->node_name = event.connected().node_name();
        link->connected = true;
      }
      cv_.notify_all();
    } else if (event.has_completion()) {
      const v1::Completion& c = event.completion();
      OnCompletion(c.request_id(), absl::Status(internal::CodeFromInt(c.code()), c.message()),
                   c.seq(), (c.flags() & v1::COMPLETION_MOVED) != 0 ? ringproto::kCqFlagMoved : 0);
    } else if (event.has_moving()) {
      std::lock_guard<std::mutex> lock(mu_);
      link->moving = true;
    }
  }
  grpc::Status finish = link->stream->Finish();
  // Completions the daemon wrote before the session ended are outcomes, not orphans (a
  // shutdown fails the operations first, then ends the sessions; a handover hands them back).
  std::shared_ptr<internal::ClientRings> rings;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rings = link->rings;
  }
  if (rings != nullptr) rings->Drain();
  absl::Status end;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) {
      end = absl::CancelledError("the client disconnected");
    } else if (finish.ok()) {
      end = absl::UnavailableError("daemon closed the session");
    } else {
      end = absl::Status(internal::CodeFromInt(static_cast<int>(finish.error_code())),
                         absl::StrCat("daemon closed the session: ", finish.error_message()));
      if (!link->connected) {
        end = internal::FromGrpc(finish);  // refused: keep the daemon's words
      } else if (absl::StrContains(finish.error_message(), "keepalive")) {
        end = absl::UnavailableError(absl::StrCat(
            "railyardd at ", socket_, " stopped answering: no reply to a keepalive ping within ",
            keepalive_ms_, " ms (is it stopped or wedged?); the session is over (",
            finish.error_message(), "; $RAILYARD_KEEPALIVE_MS sets it)"));
      }
    }
  }
  OnLinkEnded(link, std::move(end));
}

void ClientCore::OnLinkEnded(const std::shared_ptr<Link>& link, absl::Status end) {
  std::thread previous;
  bool rebuild = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    link->ended = true;
    link->end = end;
    cv_.notify_all();
    // Not (or no longer) the session: OpenLink's caller or the rebuild in progress sees it.
    if (link != link_ || dead_ || state_ == State::kRebuilding) return;
    const bool handover = link->moving;
    rebuild = !shutting_down_ && link->connected && (handover || reconnect_window_.count() > 0);
    if (rebuild) {
      state_ = State::kRebuilding;
      const auto window =
          handover ? std::max<std::chrono::seconds>(reconnect_window_, internal::kHandoverWindow)
                   : reconnect_window_;
      previous = std::move(rebuild_thread_);
      rebuild_thread_ = std::thread(
          [this, deadline = std::chrono::steady_clock::now() + window] { RebuildLoop(deadline); });
    }
  }
  if (previous.joinable()) previous.join();
  if (!rebuild) Die(std::move(end));
}

void ClientCore::Die(absl::Status status) {
  std::map<uint64_t, Outstanding> orphans;
  std::shared_ptr<Link> link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!dead_) {
      dead_ = true;
      end_status_ = status;
    }
    state_ = State::kLive;
    orphans.swap(pending_);
    link = link_;
  }
  cv_.notify_all();
  if (link != nullptr && link->rings != nullptr) link->rings->Close();
  for (auto& [id, o] : orphans) o.pending->Complete(status, 0);
}

uint64_t ClientCore::BufferIdLocked(uint64_t id) const {
  auto it = buffers_.find(id);
  return it == buffers_.end() ? ~uint64_t{0} : it->second.id;  // unknown: refused by the daemon
}

v1::SubmitRequest ClientCore::TranslatedLocked(const v1::SubmitRequest& request) const {
  v1::SubmitRequest r = request;
  auto c = comms_.find(request.comm_handle());
  r.set_comm_handle(c == comms_.end() ? ~uint64_t{0} : c->second.handle);
  if (r.has_send() && r.send().buffer_id() != 0) {
    r.mutable_send()->set_buffer_id(BufferIdLocked(r.send().buffer_id()));
  }
  if (r.has_recv() && r.recv().buffer_id() != 0) {
    r.mutable_recv()->set_buffer_id(BufferIdLocked(r.recv().buffer_id()));
  }
  if (r.has_stream_sync() && r.stream_sync().words().buffer_id() != 0) {
    r.mutable_stream_sync()->mutable_words()->set_buffer_id(
        BufferIdLocked(r.stream_sync().words().buffer_id()));
  }
  return r;
}

void ClientCore::SendOn(const std::shared_ptr<Link>& link, const std::vector<uint64_t>& ids,
                        bool group) {
  if (link->rings == nullptr) {
    // gRPC: one Submit each, in order.
    for (uint64_t id : ids) {
      v1::SubmitRequest request;
      std::shared_ptr<internal::PendingRequest> pending;
      uint64_t generation = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = pending_.find(id);
        if (it == pending_.end()) continue;
        it->second.unsent = false;
        it->second.via_rings = false;
        it->second.generation = generation = generation_;
        pending = it->second.pending;
        request = translating_.load() ? TranslatedLocked(it->second.request) : it->second.request;
        pending->SetRings(nullptr);
      }
      request.set_session_id(link->session_id);
      request.set_request_id(id);
      grpc::ClientContext ctx;
      SetDeadline(&ctx, internal::kRpcTimeout);
      v1::SubmitResponse response;
      grpc::Status status = link->stub->Submit(&ctx, request, &response);
      if (status.ok()) {
        pending->SetSeq(response.seq());
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pending_.find(id);
      if (it == pending_.end() || it->second.generation != generation) continue;
      if (status.error_details() == internal::kMovedDetails) {
        it->second.moved = true;  // handed back untaken: the next session sends it again
        continue;
      }
      const bool leaving = state_ == State::kRebuilding || link->ended || link->moving;
      if (leaving && (status.error_code() == grpc::StatusCode::NOT_FOUND ||
                      status.error_code() == grpc::StatusCode::CANCELLED)) {
        // The session was gone (unknown session id) or ending when it arrived: not taken.
        it->second.moved = true;
        continue;
      }
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE && leaving) {
        continue;  // the daemon went away meanwhile: the rebuild decides
      }
      pending_.erase(it);
      absl::Status st = internal::FromGrpc(status);
      if (st.code() == absl::StatusCode::kUnavailable) {
        st = absl::UnavailableError(
            absl::StrCat("Submit: railyardd at ", socket_, " unavailable: ", st.message()));
      }
      pending->Complete(st, 0);
    }
    return;
  }
  std::vector<std::byte> entries;
  std::vector<std::pair<std::shared_ptr<internal::PendingRequest>, uint64_t>> slots;
  std::vector<uint64_t> sent;
  std::vector<std::pair<std::shared_ptr<internal::PendingRequest>, absl::Status>> refused;
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation = generation_;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = pending_.find(ids[i]);
      if (it == pending_.end()) continue;
      Outstanding& o = it->second;
      const size_t before = entries.size();
      v1::SubmitRequest translated;
      const v1::SubmitRequest& request =
          translating_.load() ? (translated = TranslatedLocked(o.request)) : o.request;
      if (absl::Status st =
              internal::ClientRings::Encode(request, group && i + 1 < ids.size(), &entries);
          !st.ok()) {
        entries.resize(before);
        refused.emplace_back(o.pending, st);
        pending_.erase(it);
        continue;
      }
      o.unsent = false;
      o.via_rings = true;
      o.generation = generation;
      o.pending->sq_first.store(internal::PendingRequest::kUnpublished);
      o.pending->SetRings(link->rings);
      slots.emplace_back(o.pending, before / ringproto::kSqEntryBytes);
      sent.push_back(ids[i]);
    }
  }
  for (auto& [p, st] : refused) p->Complete(st, 0);
  if (entries.empty()) return;
  absl::Status st = link->rings->Publish(entries, [&](uint64_t first) {
    for (auto& [p, offset] : slots) p->sq_first.store(first + offset);
  });
  if (st.ok()) return;
  std::vector<std::shared_ptr<internal::PendingRequest>> lost;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool rebuilding = state_ == State::kRebuilding || link->ended;
    for (uint64_t id : sent) {
      auto it = pending_.find(id);
      if (it == pending_.end() || it->second.generation != generation) continue;
      if (rebuilding) {
        it->second.unsent = true;  // never published: the rebuild sends it
        continue;
      }
      lost.push_back(it->second.pending);
      pending_.erase(it);
    }
    if (dead_) st = end_status_;
  }
  for (auto& p : lost) p->Complete(st, 0);
}

void ClientCore::SubmitGroup(
    std::vector<std::pair<v1::SubmitRequest, std::shared_ptr<internal::PendingRequest>>> requests) {
  if (forked()) {  // before the lock, which a thread of the parent may have held at the fork
    const absl::Status st = SessionError();
    for (auto& [request, pending] : requests) pending->Complete(st, 0);
    return;
  }
  std::vector<uint64_t> ids;
  std::shared_ptr<Link> link;
  absl::Status closed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) {
      closed = absl::FailedPreconditionError("the client is disconnected");
    } else if (dead_) {
      closed = end_status_;
    } else {
      // Registered before it is submitted, so that the completion can never arrive unknown;
      // while the session is rebuilt it waits here, unsent, in its place in the order.
      const bool hold = state_ == State::kRebuilding;
      for (auto& [request, pending] : requests) {
        const uint64_t id = next_request_id_.fetch_add(1);
        request.set_request_id(id);
        Outstanding o;
        o.pending = pending;
        o.request = std::move(request);
        o.unsent = hold;
        o.via_rings = link_->rings != nullptr;
        auto c = comms_.find(o.request.comm_handle());
        if (c != comms_.end() && !c->second.broken.ok()) {
          pending->Complete(c->second.broken, 0);
          continue;
        }
        if (c != comms_.end() && c->second.lost > 0 && internal::IsCollective(o.request)) {
          --c->second.lost;
          pending->Complete(LostStatus(o.request, c->second.comm_id), 0);
          continue;
        }
        pending_.emplace(id, std::move(o));
        if (!hold) ids.push_back(id);
      }
      link = link_;
    }
  }
  if (!closed.ok()) {
    for (auto& [request, pending] : requests) pending->Complete(closed, 0);
    return;
  }
  if (!ids.empty()) SendOn(link, ids, true);
}

void ClientCore::Submit(v1::SubmitRequest request,
                        const std::shared_ptr<internal::PendingRequest>& pending) {
  std::vector<std::pair<v1::SubmitRequest, std::shared_ptr<internal::PendingRequest>>> one;
  one.emplace_back(std::move(request), pending);
  SubmitGroup(std::move(one));
}

absl::StatusOr<std::shared_ptr<ClientCore::Link>> ClientCore::AcquireLink() {
  if (absl::Status st = SessionError(); !st.ok()) return st;
  std::unique_lock<std::mutex> lock(mu_);
  const auto limit = std::max<std::chrono::seconds>(reconnect_window_, internal::kHandoverWindow) +
                     std::chrono::seconds(30);
  if (!cv_.wait_for(lock, limit,
                    [&] { return state_ == State::kLive || dead_ || shutting_down_; })) {
    return absl::UnavailableError(absl::StrCat("railyardd at ", socket_, " is being reconnected"));
  }
  if (shutting_down_) return absl::FailedPreconditionError("the client is disconnected");
  if (dead_) return end_status_;
  return link_;
}

template <typename T>
absl::StatusOr<T> ClientCore::WithLink(const std::function<absl::StatusOr<T>(Link&)>& fn) {
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<std::shared_ptr<Link>> link = AcquireLink();
    if (!link.ok()) return link.status();
    absl::StatusOr<T> result = fn(**link);
    if (result.ok() || result.status().code() != absl::StatusCode::kUnavailable || attempt >= 2) {
      return result;
    }
    // The daemon went away during the call: once the session is back, on the new daemon.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(2),
                 [&] { return (*link)->ended || dead_ || shutting_down_; });
    if (!(*link)->ended || dead_ || shutting_down_) return result;
  }
}

void ClientCore::Shutdown() {
  if (forked()) return;  // the parent's session, threads and channel: nothing to end here
  std::call_once(shutdown_once_, [this] {
    std::shared_ptr<Link> link;
    bool disconnect = false;
    std::thread rebuild;
    {
      std::lock_guard<std::mutex> lock(mu_);
      link = link_;
      disconnect = link != nullptr && link->connected && !link->ended && !dead_;
      shutting_down_ = true;
      rebuild = std::move(rebuild_thread_);
      for (grpc::ClientContext* ctx : joining_) ctx->TryCancel();
    }
    cv_.notify_all();
    if (disconnect) {
      grpc::ClientContext ctx;
      SetDeadline(&ctx, internal::kDisconnectTimeout);
      v1::DisconnectRequest request;
      request.set_session_id(link->session_id);
      v1::DisconnectResponse response;
      (void)link->stub->Disconnect(&ctx, request, &response);  // the session ends either way
    }
    if (link != nullptr) {
      link->stream_ctx.TryCancel();
      if (link->reader.joinable()) link->reader.join();
    }
    if (rebuild.joinable()) rebuild.join();
    std::shared_ptr<Link> last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = link_;
    }
    if (last != nullptr && last != link) {
      last->stream_ctx.TryCancel();
      if (last->reader.joinable()) last->reader.join();
    }
    Die(absl::CancelledError("the client disconnected"));
  });
}

bool ClientCore::alive() const {
  if (forked()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return link_ != nullptr && !dead_ && !shutting_down_;
}

void ClientCore::SetDeadline(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
}

absl::Status ClientCore::SessionError() const {
  if (forked()) {  // before the lock, which a thread of the parent may have held at the fork
    return absl::FailedPreconditionError(absl::StrCat(
        "this railyard::Client was connected by process ", pid_, "; process ", getpid(),
        " is a fork of it and cannot use its session: gRPC does not survive fork(); connect in "
        "the child (after exec, or in a process started without fork)"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return absl::FailedPreconditionError("the client is disconnected");
  if (dead_) return end_status_;
  return absl::OkStatus();
}

absl::Status ClientCore::RpcError(const char* rpc, const grpc::Status& status) const {
  absl::Status st = internal::FromGrpc(status);
  if (st.code() == absl::StatusCode::kUnavailable) {
    // Most likely the daemon went away: say so if the session stream noticed.
    if (absl::Status session = SessionError(); !session.ok()) return session;
    return absl::UnavailableError(
        absl::StrCat(rpc, ": railyardd at ", socket_, " unavailable: ", st.message()));
  }
  if (st.code() == absl::StatusCode::kDeadlineExceeded && st.message() == "Deadline Exceeded") {
    return absl::DeadlineExceededError(
        absl::StrCat(rpc, ": no answer from railyardd at ", socket_, " in time"));
  }
  return st;
}

uint64_t ClientCore::NewIdLocked(uint64_t daemon_id, uint64_t* next) {
  // The daemon's own ids while they are fresh (the first session): nothing to translate. Once
  // one is not (after a reconnect), ids of our own, translated on every call.
  uint64_t id = daemon_id;
  if (translating_.load() || daemon_id < *next) {
    id = *next;
    translating_.store(true);
  }
  *next = std::max(*next, id + 1);
  return id;
}

absl::StatusOr<uint64_t> ClientCore::RegisterOn(Link& link, v1::RegisterBufferRequest request) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, internal::kRpcTimeout);
  request.set_session_id(link.session_id);
  v1::RegisterBufferResponse response;
  grpc::Status status = link.stub->RegisterBuffer(&ctx, request, &response);
  if (!status.ok()) return RpcError("RegisterBuffer", status);
  return response.buffer_id();
}

absl::StatusOr<uint64_t> ClientCore::RegisterBuffer(int memfd, uint64_t size, int device) {
  internal::OwnedFd copy(::fcntl(memfd, F_DUPFD_CLOEXEC, 0));
  if (copy.get() < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot keep the buffer's descriptor: ", internal::ErrnoText(errno)));
  }
  absl::StatusOr<uint64_t> id = WithLink<uint64_t>([&](Link& link) -> absl::StatusOr<uint64_t> {
    absl::StatusOr<uint64_t> handle = link.fd_channel->Put(memfd, internal::kRpcTimeout);
    if (!handle.ok()) return handle.status();
    v1::RegisterBufferRequest request;
    request.set_fd_handle(*handle);
    request.set_size_bytes(size);
    if (device >= 0) {
      request.set_memory(v1::MEMORY_KIND_CUDA);
      request.set_device(device);
    }
    return RegisterOn(link, request);
  });
  if (!id.ok()) return id.status();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t vid = NewIdLocked(*id, &next_buffer_id_);
  BufferRecord& b = buffers_[vid];
  b.fd = std::move(copy);
  b.size = size;
  b.device = device;
  b.id = *id;
  return vid;
}

absl::StatusOr<uint64_t> ClientCore::RegisterCudaIpc(std::string_view handle, uint64_t offset,
                                                     uint64_t size, int device) {
  absl::StatusOr<uint64_t> id = WithLink<uint64_t>([&](Link& link) {
    v1::RegisterBufferRequest request;
    request.set_size_bytes(size);
    request.set_memory(v1::MEMORY_KIND_CUDA);
    request.set_device(device);
    request.set_cuda_ipc_handle(std::string(handle));
    request.set_cuda_ipc_offset(offset);
    return RegisterOn(link, request);
  });
  if (!id.ok()) return id.status();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t vid = NewIdLocked(*id, &next_buffer_id_);
  BufferRecord& b = buffers_[vid];
  b.ipc_handle = std::string(handle);
  b.ipc_offset = offset;
  b.size = size;
  b.device = device;
  b.id = *id;
  return vid;
}

absl::StatusOr<uint64_t> ClientCore::RegisterPart(uint64_t parent, uint64_t offset, uint64_t size) {
  absl::StatusOr<uint64_t> id = WithLink<uint64_t>([&](Link& link) -> absl::StatusOr<uint64_t> {
    v1::RegisterBufferRequest request;
    {
      std::lock_guard<std::mutex> lock(mu_);
      request.set_parent_buffer_id(BufferIdLocked(parent));
    }
    request.set_parent_offset(offset);
    request.set_size_bytes(size);
    return RegisterOn(link, request);
  });
  if (!id.ok()) return id.status();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t vid = NewIdLocked(*id, &next_buffer_id_);
  BufferRecord& b = buffers_[vid];
  b.parent = parent;
  b.parent_offset = offset;
  b.size = size;
  b.id = *id;
  return vid;
}

absl::Status ClientCore::Release(const char* rpc, const std::function<grpc::Status(Link&)>& call,
                                 const std::function<void()>& forget) {
  {
    // Between sessions there is no daemon to tell: forgotten here, it is not registered or joined
    // again (and a destructor never waits out a reconnect).
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kRebuilding || dead_) {
      forget();
      return dead_ ? end_status_ : absl::OkStatus();
    }
  }
  absl::StatusOr<std::shared_ptr<Link>> link = AcquireLink();
  const grpc::Status status = link.ok() ? call(**link) : grpc::Status::OK;
  {
    std::lock_guard<std::mutex> lock(mu_);
    forget();
  }
  if (!link.ok()) return link.status();
  // The daemon went away during the call (stopping, handing over): what it held went with the
  // session, and the next session does not hold it either. Never retried on it: a destructor
  // must not wait for the next daemon.
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::CANCELLED) {
    return absl::OkStatus();
  }
  return status.ok() ? absl::OkStatus() : RpcError(rpc, status);
}

absl::Status ClientCore::ReleaseBuffer(uint64_t buffer_id) {
  return Release(
      "ReleaseBuffer",
      [&](Link& link) {
        grpc::ClientContext ctx;
        SetDeadline(&ctx, internal::kRpcTimeout);
        v1::ReleaseBufferRequest request;
        request.set_session_id(link.session_id);
        {
          std::lock_guard<std::mutex> lock(mu_);
          request.set_buffer_id(BufferIdLocked(buffer_id));
        }
        v1::ReleaseBufferResponse response;
        return link.stub->ReleaseBuffer(&ctx, request, &response);
      },
      [&] { buffers_.erase(buffer_id); });
}

absl::StatusOr<std::string> ClientCore::CreateCommId() {
  return WithLink<std::string>([&](Link& link) -> absl::StatusOr<std::string> {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, internal::kRpcTimeout);
    v1::CreateCommIdRequest request;
    request.set_session_id(link.session_id);
    v1::CreateCommIdResponse response;
    grpc::Status status = link.stub->CreateCommId(&ctx, request, &response);
    if (!status.ok()) return RpcError("CreateCommId", status);
    return response.comm_id();
  });
}

absl::StatusOr<v1::InitCommResponse> ClientCore::InitCommOn(Link& link, const std::string& comm_id,
                                                            int rank, int nranks,
                                                            std::chrono::milliseconds timeout,
                                                            uint64_t resume_seq) {
  grpc::ClientContext ctx;
  SetDeadline(
      &ctx, timeout.count() == 0 ? internal::kInitDefaultTimeout : timeout + internal::kInitMargin);
  v1::InitCommRequest request;
  request.set_session_id(link.session_id);
  request.set_comm_id(comm_id);
  request.set_rank(rank);
  request.set_nranks(nranks);
  request.set_timeout_ms(static_cast<uint32_t>(timeout.count()));
  request.set_integrity(integrity_);
  request.set_resume_seq(resume_seq);
  v1::InitCommResponse response;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return absl::FailedPreconditionError("the client is disconnected");
    joining_.insert(&ctx);  // Shutdown cancels it: a join may wait long for the other ranks
  }
  grpc::Status status = link.stub->InitComm(&ctx, request, &response);
  {
    std::lock_guard<std::mutex> lock(mu_);
    joining_.erase(&ctx);
  }
  if (!status.ok()) return RpcError("InitComm", status);
  return response;
}

absl::StatusOr<v1::InitCommResponse> ClientCore::InitComm(const std::string& comm_id, int rank,
                                                          int nranks,
                                                          std::chrono::milliseconds timeout) {
  if (timeout.count() < 0 || timeout.count() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("InitComm timeout ", timeout.count(), " ms out of range"));
  }
  absl::StatusOr<v1::InitCommResponse> response = WithLink<v1::InitCommResponse>(
      [&](Link& link) { return InitCommOn(link, comm_id, rank, nranks, timeout, 0); });
  if (!response.ok()) return response;
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t vid = NewIdLocked(response->comm_handle(), &next_comm_id_);
  CommRecord& c = comms_[vid];
  c.comm_id = comm_id;
  c.rank = rank;
  c.nranks = nranks;
  c.nnodes = std::max(1, response->nnodes());
  c.handle = response->comm_handle();
  c.next_seq = response->first_seq();
  response->set_comm_handle(vid);
  return response;
}

absl::StatusOr<std::string> ClientCore::CommIdOf(uint64_t comm_handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(comm_handle);
  if (it == comms_.end()) {
    return absl::FailedPreconditionError("communicator not initialized or already destroyed");
  }
  return it->second.comm_id;
}

absl::StatusOr<v1::CommCensusResponse> ClientCore::CommCensus(uint64_t comm_handle,
                                                              uint32_t timeout_ms,
                                                              const std::vector<int>& exclude) {
  return WithLink<v1::CommCensusResponse>(
      [&](Link& link) -> absl::StatusOr<v1::CommCensusResponse> {
        grpc::ClientContext ctx;
        SetDeadline(&ctx, std::chrono::milliseconds(timeout_ms) + internal::kRpcTimeout);
        v1::CommCensusRequest request;
        request.set_session_id(link.session_id);
        request.set_timeout_ms(timeout_ms);
        for (int r : exclude) request.add_exclude(r);
        {
          std::lock_guard<std::mutex> lock(mu_);
          auto c = comms_.find(comm_handle);
          if (c == comms_.end()) {
            return absl::FailedPreconditionError(
                "communicator not initialized or already destroyed");
          }
          request.set_comm_handle(c->second.handle);
        }
        v1::CommCensusResponse response;
        grpc::Status status = link.stub->CommCensus(&ctx, request, &response);
        if (!status.ok()) return RpcError("CommCensus", status);
        return response;
      });
}

absl::Status ClientCore::DestroyComm(uint64_t comm_handle) {
  return Release(
      "DestroyComm",
      [&](Link& link) {
        grpc::ClientContext ctx;
        SetDeadline(&ctx, internal::kRpcTimeout);
        v1::DestroyCommRequest request;
        request.set_session_id(link.session_id);
        {
          std::lock_guard<std::mutex> lock(mu_);
          auto c = comms_.find(comm_handle);
          request.set_comm_handle(c == comms_.end() ? comm_handle : c->second.handle);
        }
        v1::DestroyCommResponse response;
        return link.stub->DestroyComm(&ctx, request, &response);
      },
      [&] { comms_.erase(comm_handle); });
}

absl::StatusOr<internal::StreamWords*> ClientCore::StreamWords() {
  std::lock_guard<std::mutex> lock(streams_mu_);
  if (stream_words_ != nullptr) return stream_words_.get();
  if (stream_ops_ == nullptr) {
    absl::StatusOr<std::shared_ptr<StreamOps>> cuda = CudaStreamOps();
    if (!cuda.ok()) return cuda.status();
    stream_ops_ = *std::move(cuda);
  }
  absl::StatusOr<std::unique_ptr<internal::StreamWords>> words = internal::StreamWords::Create(
      stream_ops_, job_, [this](int fd, uint64_t size) { return RegisterBuffer(fd, size); },
      [this](uint64_t id) { (void)ReleaseBuffer(id); });
  if (!words.ok()) return words.status();
  stream_words_ = *std::move(words);
  return stream_words_.get();
}

}  // namespace railyard
