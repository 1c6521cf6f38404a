#include "client_core.h"

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
#include "memfd_buffer.h"
#include "proto/railyard/v1/ring.h"

namespace railyard {
namespace internal {
namespace {

// Deadline of every unary call but InitComm.
constexpr std::chrono::milliseconds kRpcTimeout{30000};
// InitComm waits for the other ranks: its own timeout plus this margin, or kInitDefaultTimeout
// when the daemon's default applies (its value is not known here).
constexpr std::chrono::milliseconds kInitMargin{5000};
constexpr std::chrono::milliseconds kInitDefaultTimeout{10 * 60 * 1000};
// How long Shutdown waits for the daemon to acknowledge Disconnect.
constexpr std::chrono::milliseconds kDisconnectTimeout{5000};
// Waits longer than this are treated as unbounded (avoids overflowing time_point arithmetic).
constexpr std::chrono::milliseconds kForever{std::chrono::hours(24 * 365)};

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

absl::Status PendingRequest::Wait(std::chrono::milliseconds timeout) {
  if (rings_ != nullptr && !done()) {
    if (rings_->forked()) {
      return absl::FailedPreconditionError(
          "this operation was submitted by the process this one was forked from: its completion "
          "is the parent's to read");
    }
    const auto deadline = timeout >= kForever ? std::chrono::steady_clock::time_point::max()
                                              : std::chrono::steady_clock::now() +
                                                    std::max(timeout, std::chrono::milliseconds(0));
    // The rings end with the session, whose end completes this request: no wait is unbounded.
    rings_->WaitUntil([this] { return done(); }, deadline);
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout >= kForever) {
    cv_.wait(lock, [this] { return done_; });
  } else if (!cv_.wait_for(lock, std::max(timeout, std::chrono::milliseconds(0)),
                           [this] { return done_; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("operation not complete after ", timeout.count(),
                     " ms (it keeps running in the daemon; wait again or give up)"));
  }
  return status_;
}

bool PendingRequest::Test() {
  if (!done() && rings_ != nullptr) rings_->Drain();
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
  const std::string token =
      !options.token.empty() ? options.token : internal::EnvOr("RAILYARD_TOKEN", "");
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
  if (absl::Status st = internal::CheckSocketPath(core->socket_); !st.ok()) return st;
  absl::StatusOr<grpc::ChannelArguments> channel_args =
      internal::SessionChannelArgs(&core->keepalive_ms_);
  if (!channel_args.ok()) return channel_args.status();

  // The side channel first: its ticket names, in Connect, the connection whose peer credentials
  // the daemon records and over which this session's buffers travel.
  const auto side_timeout = options.connect_timeout >= internal::kForever
                                ? internal::kRpcTimeout
                                : std::max(options.connect_timeout, std::chrono::milliseconds(1));
  absl::StatusOr<std::unique_ptr<internal::FdChannelClient>> side =
      internal::FdChannelClient::Connect(core->socket_, side_timeout);
  if (!side.ok()) {
    if (side.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::UnavailableError(absl::StrCat("railyardd not reachable at ", core->socket_, ": ",
                                                 side.status().message()));
    }
    return side.status();
  }
  core->fd_channel_ = *std::move(side);

  core->channel_ = grpc::CreateCustomChannel("unix:" + core->socket_,
                                             grpc::InsecureChannelCredentials(), *channel_args);
  core->stub_ = v1::Local::NewStub(core->channel_);

  v1::ConnectRequest request;
  request.set_job_id(core->job_);
  request.set_token(token);
  request.set_fd_ticket(core->fd_channel_->ticket());
  request.set_pid(getpid());
  request.set_client("railyard-cpp/" RAILYARD_VERSION);
  // The reader thread opens the stream itself: opening can block while the channel connects, and
  // TryCancel() from here bounds that wait too.
  core->reader_ = std::thread([raw = core.get(), request] {
    raw->stream_ = raw->stub_->Connect(&raw->stream_ctx_, request);
    raw->ReadEvents();
  });

  std::unique_lock<std::mutex> lock(core->mu_);
  auto answered_pred = [&] { return core->connected_ || core->stream_ended_; };
  bool answered = true;
  if (options.connect_timeout >= internal::kForever) {
    core->connected_cv_.wait(lock, answered_pred);
  } else {
    answered = core->connected_cv_.wait_for(
        lock, std::max(options.connect_timeout, std::chrono::milliseconds(0)), answered_pred);
  }
  if (core->connected_) {
    lock.unlock();
    // The fast path: on unless RAILYARD_FASTPATH=0; "1" makes a failure to set it up an error.
    const std::string fastpath = internal::EnvOr("RAILYARD_FASTPATH", "");
    if (fastpath != "0") {
      const std::string spin_env = internal::EnvOr("RAILYARD_SPIN_US", "");
      long spin_us = 10;
      if (!spin_env.empty()) {
        char* end = nullptr;
        spin_us = std::strtol(spin_env.c_str(), &end, 10);
        if (end == spin_env.c_str() || *end != '\0' || spin_us < 0 || spin_us > 1000000) {
          core->Shutdown();
          return absl::InvalidArgumentError(absl::StrCat(
              "RAILYARD_SPIN_US=", spin_env, ": expected microseconds in [0, 1000000]"));
        }
      }
      if (absl::Status st = core->OpenRings(std::chrono::microseconds(spin_us));
          !st.ok() && fastpath == "1") {
        core->Shutdown();
        return absl::Status(st.code(), absl::StrCat("RAILYARD_FASTPATH=1: the session rings "
                                                    "could not be opened: ",
                                                    st.message()));
      }
    }
    return core;
  }
  absl::Status error;
  if (!answered) {
    error = absl::UnavailableError(absl::StrCat("railyardd not reachable at ", core->socket_,
                                                ": no answer within ",
                                                options.connect_timeout.count(), " ms"));
  } else if (core->end_status_.code() == absl::StatusCode::kUnavailable ||
             core->end_status_.code() == absl::StatusCode::kDeadlineExceeded) {
    error = absl::UnavailableError(absl::StrCat("railyardd not reachable at ", core->socket_, ": ",
                                                core->end_status_.message()));
  } else {
    // The daemon refused the session (token, job id): its message says why.
    error = core->end_status_;
  }
  lock.unlock();
  core->Shutdown();
  return error;
}

ClientCore::~ClientCore() { Shutdown(); }

absl::Status ClientCore::OpenRings(std::chrono::microseconds spin) {
  int memfd = -1;
  absl::StatusOr<std::unique_ptr<internal::ClientRings>> rings = internal::ClientRings::Create(
      job_, ringproto::kDefaultSqEntries, ringproto::kDefaultCqEntries, spin, &memfd);
  if (!rings.ok()) return rings.status();
  absl::StatusOr<uint64_t> handle = fd_channel_->Put(memfd, internal::kRpcTimeout);
  close(memfd);
  if (!handle.ok()) return handle.status();
  grpc::ClientContext ctx;
  SetDeadline(&ctx, internal::kRpcTimeout);
  v1::OpenRingsRequest request;
  request.set_session_id(session_id_);
  request.set_fd_handle(*handle);
  request.set_sq_entries((*rings)->sq_entries());
  request.set_cq_entries((*rings)->cq_entries());
  v1::OpenRingsResponse response;
  grpc::Status status = stub_->OpenRings(&ctx, request, &response);
  if (!status.ok()) return RpcError("OpenRings", status);
  std::shared_ptr<internal::ClientRings> shared = *std::move(rings);
  shared->SetOnCompletion([this](uint64_t request_id, absl::Status st, uint64_t seq) {
    OnRingCompletion(request_id, std::move(st), seq);
  });
  {
    // The reader thread looks at rings_ when the session ends, which may be now.
    std::lock_guard<std::mutex> lock(mu_);
    rings_ = std::move(shared);
  }
  return absl::OkStatus();
}

void ClientCore::OnRingCompletion(uint64_t request_id, absl::Status status, uint64_t seq) {
  std::shared_ptr<internal::PendingRequest> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(request_id);
    if (it == pending_.end()) return;  // not ours (or a refusal the daemon could not attribute)
    pending = std::move(it->second);
    pending_.erase(it);
  }
  pending->Complete(std::move(status), seq);
}

void ClientCore::ReadEvents() {
  v1::SessionEvent event;
  while (stream_->Read(&event)) {
    if (event.has_connected()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (connected_) continue;  // only the first one counts
        session_id_ = event.connected().session_id();
        node_name_ = event.connected().node_name();
        connected_ = true;
      }
      connected_cv_.notify_all();
    } else if (event.has_completion()) {
      const v1::Completion& completion = event.completion();
      std::shared_ptr<internal::PendingRequest> pending;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = pending_.find(completion.request_id());
        if (it == pending_.end()) continue;  // e.g. its Submit timed out on our side
        pending = std::move(it->second);
        pending_.erase(it);
      }
      pending->Complete(
          absl::Status(internal::CodeFromInt(completion.code()), completion.message()),
          completion.seq());
    }
  }
  grpc::Status finish = stream_->Finish();
  // Completions the daemon wrote before the session ended are outcomes, not orphans (a
  // shutdown fails the operations first, then ends the sessions).
  std::shared_ptr<internal::ClientRings> rings;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rings = rings_;
  }
  if (rings != nullptr) rings->Drain();

  std::unordered_map<uint64_t, std::shared_ptr<internal::PendingRequest>> orphans;
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
      if (!connected_) {
        end = internal::FromGrpc(finish);  // refused: keep the daemon's words
      } else if (absl::StrContains(finish.error_message(), "keepalive")) {
        end = absl::UnavailableError(absl::StrCat(
            "railyardd at ", socket_, " stopped answering: no reply to a keepalive ping within ",
            keepalive_ms_, " ms (is it stopped or wedged?); the session is over (",
            finish.error_message(), "; $RAILYARD_KEEPALIVE_MS sets it)"));
      }
    }
    end_status_ = end;
    stream_ended_ = true;
    orphans.swap(pending_);
  }
  connected_cv_.notify_all();
  if (rings != nullptr) rings->Close();
  for (auto& [id, pending] : orphans) pending->Complete(end, 0);
}

void ClientCore::Shutdown() {
  if (forked()) return;  // the parent's session, threads and channel: nothing to end here
  std::call_once(shutdown_once_, [this] {
    bool disconnect = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      disconnect = connected_ && !stream_ended_;
      shutting_down_ = true;
    }
    if (disconnect) {
      grpc::ClientContext ctx;
      SetDeadline(&ctx, internal::kDisconnectTimeout);
      v1::DisconnectRequest request;
      request.set_session_id(session_id_);
      v1::DisconnectResponse response;
      (void)stub_->Disconnect(&ctx, request, &response);  // the session ends either way
    }
    stream_ctx_.TryCancel();
    if (reader_.joinable()) reader_.join();
    if (rings_ != nullptr) rings_->Close();
  });
}

bool ClientCore::alive() const {
  if (forked()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return connected_ && !stream_ended_ && !shutting_down_;
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
  if (stream_ended_) return end_status_;
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

absl::StatusOr<uint64_t> ClientCore::RegisterBuffer(int memfd, uint64_t size, int device) {
  if (absl::Status st = SessionError(); !st.ok()) return st;
  absl::StatusOr<uint64_t> handle = fd_channel_->Put(memfd, internal::kRpcTimeout);
  if (!handle.ok()) return handle.status();
  v1::RegisterBufferRequest request;
  request.set_fd_handle(*handle);
  request.set_size_bytes(size);
  if (device >= 0) {
    request.set_memory(v1::MEMORY_KIND_CUDA);
    request.set_device(device);
  }
  return SendRegisterBuffer(&request);
}

absl::StatusOr<uint64_t> ClientCore::RegisterCudaIpc(std::string_view handle, uint64_t offset,
                                                     uint64_t size, int device) {
  if (absl::Status st = SessionError(); !st.ok()) return st;
  v1::RegisterBufferRequest request;
  request.set_size_bytes(size);
  request.set_memory(v1::MEMORY_KIND_CUDA);
  request.set_device(device);
  request.set_cuda_ipc_handle(std::string(handle));
  request.set_cuda_ipc_offset(offset);
  return SendRegisterBuffer(&request);
}

absl::StatusOr<uint64_t> ClientCore::SendRegisterBuffer(v1::RegisterBufferRequest* request) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, internal::kRpcTimeout);
  request->set_session_id(session_id_);
  v1::RegisterBufferResponse response;
  grpc::Status status = stub_->RegisterBuffer(&ctx, *request, &response);
  if (!status.ok()) return RpcError("RegisterBuffer", status);
  return response.buffer_id();
}

absl::StatusOr<uint64_t> ClientCore::RegisterPart(uint64_t parent, uint64_t offset, uint64_t size) {
  v1::RegisterBufferRequest request;
  request.set_parent_buffer_id(parent);
  request.set_parent_offset(offset);
  request.set_size_bytes(size);
  return SendRegisterBuffer(&request);
}

absl::Status ClientCore::ReleaseBuffer(uint64_t buffer_id) {
  if (absl::Status st = SessionError(); !st.ok()) return st;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, internal::kRpcTimeout);
  v1::ReleaseBufferRequest request;
  request.set_session_id(session_id_);
  request.set_buffer_id(buffer_id);
  v1::ReleaseBufferResponse response;
  grpc::Status status = stub_->ReleaseBuffer(&ctx, request, &response);
  if (!status.ok()) return RpcError("ReleaseBuffer", status);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ClientCore::CreateCommId() {
  if (absl::Status st = SessionError(); !st.ok()) return st;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, internal::kRpcTimeout);
  v1::CreateCommIdRequest request;
  request.set_session_id(session_id_);
  v1::CreateCommIdResponse response;
  grpc::Status status = stub_->CreateCommId(&ctx, request, &response);
  if (!status.ok()) return RpcError("CreateCommId", status);
  return response.comm_id();
}

absl::StatusOr<v1::InitCommResponse> ClientCore::InitComm(const std::string& comm_id, int rank,
                                                          int nranks,
                                                          std::chrono::milliseconds timeout) {
  if (absl::Status st = SessionError(); !st.ok()) return st;
  if (timeout.count() < 0 || timeout.count() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("InitComm timeout ", timeout.count(), " ms out of range"));
  }
  grpc::ClientContext ctx;
  SetDeadline(
      &ctx, timeout.count() == 0 ? internal::kInitDefaultTimeout : timeout + internal::kInitMargin);
  v1::InitCommRequest request;
  request.set_session_id(session_id_);
  request.set_comm_id(comm_id);
  request.set_rank(rank);
  request.set_nranks(nranks);
  request.set_timeout_ms(static_cast<uint32_t>(timeout.count()));
  request.set_integrity(integrity_);
  v1::InitCommResponse response;
  grpc::Status status = stub_->InitComm(&ctx, request, &response);
  if (!status.ok()) return RpcError("InitComm", status);
  return response;
}

absl::Status ClientCore::DestroyComm(uint64_t comm_handle) {
  if (absl::Status st = SessionError(); !st.ok()) return st;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, internal::kRpcTimeout);
  v1::DestroyCommRequest request;
  request.set_session_id(session_id_);
  request.set_comm_handle(comm_handle);
  v1::DestroyCommResponse response;
  grpc::Status status = stub_->DestroyComm(&ctx, request, &response);
  if (!status.ok()) return RpcError("DestroyComm", status);
  return absl::OkStatus();
}

bool ClientCore::Register(uint64_t request_id,
                          const std::shared_ptr<internal::PendingRequest>& pending) {
  // Registered before it is submitted, so that the completion can never arrive unknown.
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_ || stream_ended_) {
    absl::Status closed =
        shutting_down_ ? absl::FailedPreconditionError("the client is disconnected") : end_status_;
    pending->Complete(closed, 0);
    return false;
  }
  pending_.emplace(request_id, pending);
  return true;
}

void ClientCore::SubmitGroup(
    std::vector<std::pair<v1::SubmitRequest, std::shared_ptr<internal::PendingRequest>>> requests) {
  if (rings_ == nullptr) {
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i].first.set_group_next(i + 1 < requests.size());
      Submit(std::move(requests[i].first), requests[i].second);
    }
    return;
  }
  std::vector<std::byte> entries;
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto& [request, pending] = requests[i];
    const uint64_t request_id = next_request_id_.fetch_add(1);
    request.set_request_id(request_id);
    const size_t before = entries.size();
    if (absl::Status st = internal::ClientRings::Encode(request, i + 1 < requests.size(), &entries);
        !st.ok()) {
      entries.resize(before);
      pending->Complete(st, 0);
      continue;
    }
    pending->SetRings(rings_);
    if (!Register(request_id, pending)) {
      entries.resize(before);
      continue;
    }
    ids.push_back(request_id);
  }
  if (entries.empty()) return;
  if (absl::Status st = rings_->Publish(entries); !st.ok()) {
    if (absl::Status session = SessionError(); !session.ok()) st = session;
    for (uint64_t id : ids) OnRingCompletion(id, st, 0);
  }
}

void ClientCore::Submit(v1::SubmitRequest request,
                        const std::shared_ptr<internal::PendingRequest>& pending) {
  if (rings_ != nullptr) {
    std::vector<std::pair<v1::SubmitRequest, std::shared_ptr<internal::PendingRequest>>> one;
    one.emplace_back(std::move(request), pending);
    SubmitGroup(std::move(one));
    return;
  }
  const uint64_t request_id = next_request_id_.fetch_add(1);
  request.set_session_id(session_id_);
  request.set_request_id(request_id);
  if (!Register(request_id, pending)) return;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, internal::kRpcTimeout);
  v1::SubmitResponse response;
  grpc::Status status = stub_->Submit(&ctx, request, &response);
  if (!status.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.erase(request_id);
    }
    pending->Complete(RpcError("Submit", status), 0);
    return;
  }
  pending->SetSeq(response.seq());
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
