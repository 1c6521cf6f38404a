#include "daemon/transport/ucx/ucx_rail.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/transport/ucx/ucx_address.h"
#include "daemon/util/thread_name.h"
#include "proto/railyard/v1/spin_yield.h"

namespace railyard::transport {
namespace {

// While operations are pending the progress thread wakes at least this often even without
// events, so that UCX's timer-driven work (keepalive, which detects a hung peer) keeps running.
// Idle, it sleeps until an event or a command arrives.
constexpr int kPendingPollMs = 100;
// While a polling thread is registered the progress thread sleeps unarmed, but wakes at least
// this often and progresses the worker itself: a poller that is busy elsewhere (planning the next
// operation) delays other traffic on the rail by at most this much.
constexpr int kPolledSleepMs = 1;
// Progress calls (each followed by the commands their completions queued) between two looks at
// the owner's other duties: a rail under steady traffic still expires grace periods and erases
// released peers, and a polling thread returns to its own work (its session's submissions).
constexpr int kProgressCallsPerPass = 64;
// Event moderation (a NIC's interrupt coalescing, here for the progress thread): while at least
// kCoalesceMinBytes are in flight on the rail, a wake-up for socket events is followed by up to
// the rail's window more asleep (a command still wakes it at once), so that one progress pass
// handles what the kernel moved meanwhile instead of one pass per segment. On a 200 Mbit/s rail
// the thread woke ~2,100 times a second for 21 MB/s. The window is the time the link takes to
// move kCoalesceBytes, at most kCoalesceMaxNs: far less than the sockets' buffers (hundreds of
// KiB to MiB, autotuned) hold, so the wire does not idle. A link of unknown rate (no speed_gbps
// in the topology, such as lo) or one fast enough that the window would be under kCoalesceMinNs
// is not moderated: on loopback a fixed 500 us window made a lone 2 MiB AllReduce between two
// daemons 1.8x slower (bench/sidebyside.sh case 3). With less in flight (a latency-bound
// operation) it is off too.
constexpr size_t kCoalesceMinBytes = 1 << 20;
constexpr double kCoalesceBytes = 64 << 10;
constexpr int64_t kCoalesceMaxNs = 500000;
constexpr int64_t kCoalesceMinNs = 50000;

int64_t CoalesceWindowNs(double bytes_per_s) {
  if (!(bytes_per_s > 0)) return 0;
  const double ns = kCoalesceBytes / bytes_per_s * 1e9;
  if (ns < static_cast<double>(kCoalesceMinNs)) return 0;
  return ns > static_cast<double>(kCoalesceMaxNs) ? kCoalesceMaxNs : static_cast<int64_t>(ns);
}

absl::Status UcxError(absl::string_view what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

// Errors by which UCX reports that the other side is gone or unreachable.
bool IsPeerFailure(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_TIMED_OUT:
      return true;
    default:
      return false;
  }
}

std::string ErrnoText(int err) {
  char buffer[128];
  return strerror_r(err, buffer, sizeof(buffer));  // the GNU variant returns the text
}

int MillisUntil(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  // Round up: waking a little early would only spin once more.
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

}  // namespace

struct UcxRail::Peer {
  UcxRail* rail;
  uint64_t id;
  std::string label;      // the peer's, for messages
  std::string remote;     // the peer worker's address: endpoints to one worker form a group
  ucp_ep_h ep = nullptr;  // null once closed (or never created)
  bool closing = false;   // ucp_ep_close_nbx has not completed yet
  bool released = false;  // no endpoint handle refers to this peer any more
  // Once set, every pending and later operation fails with it.
  absl::Status failure;
  std::unordered_set<Op*> ops;  // started, not completed
  // Set by FailPeer while ops remain that UCX could not cancel at once.
  absl::Time grace_deadline = absl::InfiniteFuture();
};

struct UcxRail::Op {
  Op(UcxRail* r, uint64_t id, bool send, Tag t) : rail(r), peer_id(id), is_send(send), tag(t) {}
  UcxRail* rail;
  uint64_t peer_id;
  bool is_send;
  Tag tag;
  // The message: segments with a size, in order. One is passed to UCX as a contiguous buffer,
  // more as an iov (which UCX reads from iov until the request completes).
  ucp_dt_iov_t iov[kMaxSegments] = {};
  int count = 0;
  size_t size = 0;          // total
  RecvCompletionFn done;    // sends ignore the length
  Peer* peer = nullptr;     // set when started; null once failed without UCX's consent (orphan)
  void* request = nullptr;  // UCX's request while in flight
  // A receive's callback can run inside ucp_tag_recv_nbx; it leaves its result here.
  bool starting = false;
  bool completed_inline = false;
  ucs_status_t inline_status = UCS_OK;
  size_t inline_length = 0;
};

UcxRail::UcxRail(Config config)
    : config_(std::move(config)), coalesce_ns_(CoalesceWindowNs(config_.rail.speed_bytes_per_s)) {}

UcxRail::~UcxRail() {
  {
    absl::MutexLock lock(&join_mu_);
    if (thread_.joinable()) {
      // The progress thread holds a reference until it exits, so the last one can drop on it.
      if (thread_.get_id() == std::this_thread::get_id()) {
        thread_.detach();
      } else {
        thread_.join();
      }
    }
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

absl::StatusOr<std::shared_ptr<UcxRail>> UcxRail::Create(Config config) {
  std::shared_ptr<UcxRail> rail(new UcxRail(std::move(config)));
  {
    absl::MutexLock lock(&rail->join_mu_);
    rail->thread_ = std::thread([rail] {
      NameDataPlaneThread("ry-ucx-rail");
      rail->Run();
    });
  }
  if (!rail->started_.WaitForNotificationWithTimeout(absl::Seconds(60))) {
    rail->RequestStop();
    return absl::DeadlineExceededError(
        absl::StrCat("UCX rail ", rail->index(), " did not initialise within 60 s"));
  }
  if (!rail->init_status_.ok()) {
    rail->StopAndWait();
    return rail->init_status_;
  }
  return rail;
}

bool UcxRail::Post(std::function<void()> fn) {
  bool wake = false;
  {
    absl::MutexLock lock(&mu_);
    if (stop_requested_) return false;
    commands_.push_back(std::move(fn));
    // Asleep unarmed (pollers were registered), we wake within kPolledSleepMs anyway and a
    // poller most likely runs it sooner; asleep armed, nothing bounds the wait but a wake-up
    // (a registered thread with nothing in flight does not poll).
    if (sleeping_ && !wake_pending_ && !(sleep_unarmed_ && pollers_ > 0)) {
      wake_pending_ = true;
      wake = true;
    }
  }
  if (wake) Wake();
  return true;
}

void UcxRail::Wake() {
  const uint64_t one = 1;
  // EAGAIN means the counter is already non-zero: the thread will wake anyway.
  (void)!write(wake_fd_, &one, sizeof(one));
}

void UcxRail::RequestStop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_requested_) return;
    stop_requested_ = true;
  }
  if (started_.HasBeenNotified() && wake_fd_ >= 0) Wake();
}

void UcxRail::StopAndWait() {
  RequestStop();
  // From a completion callback: the thread finishes the stop after the callback returns (and a
  // polling thread must not wait for a progress thread that waits for the rail it owns).
  if (std::this_thread::get_id() == thread_id_ || OwnedHere()) return;
  const absl::Duration bound = config_.shutdown_timeout + absl::Seconds(5);
  if (!exited_.WaitForNotificationWithTimeout(bound)) {
    // A completion callback is blocking the progress thread. Leave it running (it holds its
    // own reference to this rail) rather than hang the caller.
    std::fprintf(stderr,
                 "level=error comp=transport msg=\"UCX rail %d progress thread did not exit "
                 "within %s; a completion callback is probably blocked\"\n",
                 config_.index, absl::FormatDuration(bound).c_str());
    return;
  }
  absl::MutexLock lock(&join_mu_);
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<uint64_t> UcxRail::Connect(const std::string& peer_address) {
  absl::StatusOr<UcxWorkerAddress> address = DecodeUcxAddress(peer_address);
  if (!address.ok()) return address.status();
  // What the progress thread reports: creating the endpoint, or its wire-up, failed or not.
  struct Result {
    void Set(ucs_status_t s) {
      status = s;
      done.Notify();
    }
    absl::Notification done;
    ucs_status_t status = UCS_OK;
  };
  auto result = std::make_shared<Result>();
  const std::string label = address->label;
  const uint64_t id = next_peer_id_.fetch_add(1);
  const bool posted = Post([this, id, address = *std::move(address), result] {
    auto peer = std::make_unique<Peer>();
    peer->rail = this;
    peer->id = id;
    peer->label = address.label;
    peer->remote = address.bytes;
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(address.bytes.data());
    // PEER mode: UCX detects a dead peer and fails its requests instead of hanging them.
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &UcxRail::EndpointErrorCallback;
    params.err_handler.arg = peer.get();
    TcpCongestionResult congestion;
    ucs_status_t status;
    {
      // A tcp endpoint connects its socket inside ucp_ep_create.
      const TcpCongestionScope scope(config_.tcp_congestion, &congestion);
      status = ucp_ep_create(worker_, &params, &peer->ep);
    }
    ReportTcpCongestion(congestion, "connection");
    if (status != UCS_OK) {
      result->Set(status);
      return;
    }
    // Wait for the wire-up (a flush completes once the endpoint's lanes are connected) before
    // the endpoint is used: UCX 1.13 aborts the process when an endpoint fails while a wire-up
    // reply is still queued on it (ucp_request.c:684, openucx/ucx#8175 removed the assertion),
    // which a peer that aborts early made likely under load.
    ucp_ep_h ep = peer->ep;
    peers_.emplace(id, std::move(peer));
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = [](void* request, ucs_status_t s, void* user_data) {
      // The caller may have given up waiting (its timeout): the callback holds its own reference.
      std::unique_ptr<std::shared_ptr<Result>> held(
          static_cast<std::shared_ptr<Result>*>(user_data));
      ucp_request_free(request);
      (*held)->Set(s);
    };
    auto held = std::make_unique<std::shared_ptr<Result>>(result);
    param.user_data = held.get();
    const ucs_status_ptr_t request = ucp_ep_flush_nbx(ep, &param);
    if (UCS_PTR_IS_PTR(request)) {
      held.release();  // the callback owns it
    } else {
      result->Set(UCS_PTR_STATUS(request));
    }
  });
  if (!posted) {
    return absl::FailedPreconditionError(
        absl::StrCat("UCX rail ", config_.index, " is shut down; cannot connect"));
  }
  if (!result->done.WaitForNotificationWithTimeout(config_.connect_timeout)) {
    Release(id);  // runs after the connect command, whenever that happens
    return absl::DeadlineExceededError(
        absl::StrCat("UCX rail ", config_.index, ": creating an endpoint to ", label,
                     " took longer than ", absl::FormatDuration(config_.connect_timeout)));
  }
  if (result->status != UCS_OK) {
    Release(id);  // an endpoint whose wire-up failed (nothing to release when creating it did)
    return UcxError(
        absl::StrCat("UCX rail ", config_.index, " (", config_.label, ") cannot reach ", label),
        result->status);
  }
  return id;
}

void UcxRail::SendV(uint64_t peer, Tag tag, const Segment* segments, int count, CompletionFn done) {
  SubmitV(new Op(this, peer, /*is_send=*/true, tag), segments, count,
          [done = std::move(done)](absl::Status s, size_t) { done(std::move(s)); });
}

void UcxRail::RecvV(uint64_t peer, Tag tag, const Segment* segments, int count,
                    RecvCompletionFn done) {
  SubmitV(new Op(this, peer, /*is_send=*/false, tag), segments, count, std::move(done));
}

void UcxRail::SubmitV(Op* op, const Segment* segments, int count, RecvCompletionFn done) {
  if (count < 1 || count > kMaxSegments) {
    const char* what = op->is_send ? "send" : "receive";
    delete op;
    done(absl::InvalidArgumentError(
             absl::StrCat("a ", what, " takes 1 to ", kMaxSegments, " segments, not ", count)),
         0);
    return;
  }
  op->done = std::move(done);
  for (int i = 0; i < count; ++i) {
    if (segments[i].size == 0) continue;  // UCX needs no empty iov entries
    op->iov[op->count++] = {segments[i].data, segments[i].size};
    op->size += segments[i].size;
  }
  Submit(op);
}

void UcxRail::Submit(Op* op) {
  if (!Post([this, op] { Start(op); })) {
    RecvCompletionFn fn = std::move(op->done);
    delete op;
    fn(absl::CancelledError(absl::StrCat("UCX rail ", config_.index, " is shut down")), 0);
  }
}

void UcxRail::Abort(uint64_t peer, absl::Status status) {
  // An OK failure would read as "healthy" below.
  if (status.ok()) status = absl::CancelledError("endpoint aborted (with an OK status)");
  Post([this, peer, status = std::move(status)] {
    if (Peer* p = FindPeer(peer)) FailPeer(p, status);
  });
}

void UcxRail::Release(uint64_t peer) {
  Post([this, peer] {
    Peer* p = FindPeer(peer);
    if (p == nullptr) return;
    p->released = true;
    if (p->failure.ok() && p->ops.empty()) {
      p->failure = absl::CancelledError(absl::StrCat("endpoint to ", p->label, " was released"));
    } else {
      FailPeer(p, absl::CancelledError(absl::StrCat("endpoint to ", p->label,
                                                    " was released with operations pending")));
    }
    CloseGroupIfReleased(p->remote);
    sweep_.push_back(peer);
  });
}

// UCX pairs the k-th endpoint a worker creates to another worker with the k-th that one creates
// back, whichever communicator each belongs to, and a rendezvous transfer replies over the
// paired endpoint. So an endpoint of one communicator may carry another's replies: none of the
// endpoints to a worker is closed while any of them still has a handle (except when the peer
// failed, which fails them all anyway).
bool UcxRail::HasUnreleasedSibling(const Peer* peer) const {
  for (const auto& [id, other] : peers_) {
    if (other.get() != peer && other->remote == peer->remote && !other->released) return true;
  }
  return false;
}

void UcxRail::CloseGroupIfReleased(const std::string& remote) {
  std::vector<Peer*> group;
  for (const auto& [id, p] : peers_) {
    if (p->remote != remote) continue;
    if (!p->released) return;  // still in use: every endpoint of the group stays open
    group.push_back(p.get());
  }
  // Nothing in flight: close politely so that the peer sees an orderly disconnect.
  for (Peer* p : group) CloseEndpoint(p, /*force=*/!p->ops.empty());
}

// ---- Progress thread ----

void UcxRail::Own() {
  owner_mu_.lock();
  owner_tid_.store(std::this_thread::get_id());
}

void UcxRail::Disown() {
  owner_tid_.store(std::thread::id());
  owner_mu_.unlock();
}

void UcxRail::BeginPolling() {
  absl::MutexLock lock(&mu_);
  ++pollers_;
}

void UcxRail::EndPolling() {
  bool wake = false;
  {
    absl::MutexLock lock(&mu_);
    if (pollers_ > 0) --pollers_;
    // The progress thread takes over: it re-arms the worker, and runs what the pollers left.
    if (pollers_ == 0 && sleeping_ && !wake_pending_ && (sleep_unarmed_ || !commands_.empty())) {
      wake_pending_ = true;
      wake = true;
    }
  }
  if (wake) Wake();
}

bool UcxRail::Poll() {
  // Never from the owner itself (a completion callback): the mutex is not recursive.
  if (OwnedHere() || !owner_mu_.try_lock()) return false;
  owner_tid_.store(std::this_thread::get_id());
  bool any = false;
  // worker_ is null before InitUcx succeeded and after TeardownUcx; a stopping rail is the
  // progress thread's to drain.
  for (int round = 0; round < 4 && worker_ != nullptr; ++round) {
    bool did = false;
    if (RunCommands(/*when_stopping=*/false, &did)) break;
    bool stopping = false;
    // As in Loop: what the completions queued starts after each progress call.
    for (int calls = 0;
         !stopping && calls < kProgressCallsPerPass && ucp_worker_progress(worker_) != 0; ++calls) {
      did = true;
      HandleFailedPeers();
      stopping = RunCommands(/*when_stopping=*/false, &did);
    }
    HandleFailedPeers();
    if (!did) break;
    any = true;  // callbacks may have posted more: another round
  }
  if (worker_ != nullptr) Sweep();
  Disown();
  return any;
}

void UcxRail::Run() {
  thread_id_ = std::this_thread::get_id();
  Own();
  init_status_ = InitUcx();
  started_.Notify();
  if (init_status_.ok()) {
    Loop();
    DrainForStop();
  }
  TeardownUcx();
  Disown();
  {
    absl::MutexLock lock(&mu_);
    stop_requested_ = true;  // Post refuses from now on
  }
  exited_.Notify();
}

void UcxRail::ReportTcpCongestion(const TcpCongestionResult& result, const char* what) {
  if (config_.tcp_congestion.mode == TcpCongestionPolicy::Mode::kHost || !config_.report) return;
  const std::string policy = TcpCongestionPolicyText(config_.tcp_congestion);
  if (!TcpCongestionHookActive() && !congestion_warned_) {
    congestion_warned_ = true;
    config_.report(true,
                   absl::StrCat("UCX rail ", config_.index, ": --rail_tcp_congestion=", policy,
                                " has no effect: this executable does not export socket() "
                                "(link it with -Wl,--export-dynamic-symbol=socket)"));
    return;
  }
  if (result.changed > 0 && !congestion_reported_) {
    congestion_reported_ = true;
    config_.report(false, absl::StrCat("UCX rail ", config_.index, ": its TCP ", what,
                                       " uses congestion control ", result.to, " instead of ",
                                       result.from, " (--rail_tcp_congestion=", policy, ")"));
  }
  if (!result.error.empty() && !congestion_warned_) {
    congestion_warned_ = true;
    config_.report(true, absl::StrCat("UCX rail ", config_.index, ": its TCP ", what,
                                      " keeps congestion control ", result.from,
                                      " (--rail_tcp_congestion=", policy,
                                      "), the kernel refused: ", result.error));
  }
}

absl::Status UcxRail::InitUcx() {
  const std::string where =
      absl::StrCat("UCX rail ", config_.index, " (device \"", config_.rail.device, "\", tls \"",
                   config_.rail.tls, "\")");
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ < 0 || epoll_fd_ < 0) {
    return absl::InternalError(absl::StrCat(where, ": eventfd/epoll: ", ErrnoText(errno)));
  }

  // One context per rail, so that each rail's UCX_NET_DEVICES/UCX_TLS apply to it alone.
  ucp_config_t* ucp_config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &ucp_config);
  if (status != UCS_OK) return UcxError(absl::StrCat(where, ": reading UCX config"), status);
  if (!config_.rail.device.empty()) {
    status = ucp_config_modify(ucp_config, "NET_DEVICES", config_.rail.device.c_str());
  }
  if (status == UCS_OK) status = ucp_config_modify(ucp_config, "TLS", config_.rail.tls.c_str());
  bool zcopy_set = false;
  if (status == UCS_OK && RailTlsIsTcpOnly(config_.rail.tls) &&
      std::getenv("UCX_ZCOPY_THRESH") == nullptr) {
    status = ucp_config_modify(ucp_config, "ZCOPY_THRESH", kUcxTcpZcopyThresh);
    zcopy_set = status == UCS_OK;
  }
  if (status != UCS_OK) {
    ucp_config_release(ucp_config);
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": UCX rejects the setting: ", ucs_status_string(status)));
  }
  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  params.name = config_.label.c_str();
  status = ucp_init(&params, ucp_config, &context_);
  ucp_config_release(ucp_config);
  if (status != UCS_OK) {
    context_ = nullptr;
    return UcxError(absl::StrCat(where, ": ucp_init"), status);
  }
  if (zcopy_set && config_.report) {
    config_.report(false,
                   absl::StrCat("UCX rail ", config_.index, ": zero-copy sends from ",
                                kUcxTcpZcopyThresh, " (tcp alone; UCX_ZCOPY_THRESH overrides)"));
  }

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time, the rail's owner, touches the worker (see ucx_transport.h).
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  TcpCongestionResult congestion;
  {
    // UCX's tcp listener opens here; the connections it accepts inherit its choice.
    const TcpCongestionScope scope(config_.tcp_congestion, &congestion);
    status = ucp_worker_create(context_, &worker_params, &worker_);
  }
  if (status != UCS_OK) {
    worker_ = nullptr;
    return UcxError(absl::StrCat(where, ": ucp_worker_create"), status);
  }
  ReportTcpCongestion(congestion, "listener");

  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  status = ucp_worker_get_address(worker_, &address, &address_length);
  if (status != UCS_OK) return UcxError(absl::StrCat(where, ": ucp_worker_get_address"), status);
  address_ = EncodeUcxAddress(
      {config_.label, std::string(reinterpret_cast<const char*>(address), address_length)});
  ucp_worker_release_address(worker_, address);

  int worker_fd = -1;
  status = ucp_worker_get_efd(worker_, &worker_fd);
  if (status != UCS_OK) return UcxError(absl::StrCat(where, ": ucp_worker_get_efd"), status);
  for (int fd : {worker_fd, wake_fd_}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
      return absl::InternalError(absl::StrCat(where, ": epoll_ctl: ", ErrnoText(errno)));
    }
  }
  return absl::OkStatus();
}

void UcxRail::TeardownUcx() {
  // Destroying the worker also destroys endpoints whose close did not finish in time; callbacks
  // it runs still find their Peer and Op objects, which are freed only afterwards.
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  worker_ = nullptr;
  if (context_ != nullptr) ucp_cleanup(context_);
  context_ = nullptr;
  for (Op* op : orphans_) delete op;
  orphans_.clear();
  peers_.clear();
  if (epoll_fd_ >= 0) close(epoll_fd_);
  epoll_fd_ = -1;
  // wake_fd_ stays open until destruction: a late Post may still write it.
}

void UcxRail::Loop() {
  while (true) {
    bool stop = RunCommands(/*when_stopping=*/true);
    // Commands that the completions of one progress call queued (a receive's completion readies
    // the send of what it reduced) start before the next call, not once the worker has nothing
    // left to progress: under steady traffic that could be after every other receive of the
    // operation, which serialised its sends behind its receives (docs/data-plane.md).
    bool more = false;
    for (int calls = 0; ucp_worker_progress(worker_) != 0;) {
      HandleFailedPeers();
      if (!stop) stop = RunCommands(/*when_stopping=*/true);
      if (++calls == kProgressCallsPerPass) {  // the housekeeping below, then on at once
        more = true;
        break;
      }
    }
    HandleFailedPeers();
    ExpireGracePeriods(/*all=*/false);
    Sweep();
    if (stop) return;
    if (more) continue;
    BusyPoll();
    WaitForEvents();
  }
}

void UcxRail::BusyPoll() {
  if (config_.busy_poll <= absl::ZeroDuration()) return;
  const absl::Time until = absl::Now() + config_.busy_poll;
  for (uint32_t polls = 1;; ++polls) {
    if (ucp_worker_progress(worker_) != 0) return;
    {
      absl::MutexLock lock(&mu_);
      if (!commands_.empty() || stop_requested_) return;
    }
    if ((polls & 7) != 0) continue;
    if (absl::Now() >= until) return;
    // Let the threads we wait for run (on a small host they share our core), and a polling
    // thread own the rail meanwhile.
    Disown();
    const bool yielded = ringproto::SpinYield();
    Own();
    if (!yielded) return;  // the core is contended: wait on the worker's events instead
  }
}

bool UcxRail::RunCommands(bool when_stopping, bool* ran) {
  bool stop;
  {
    absl::MutexLock lock(&mu_);
    stop = stop_requested_;
    if (stop && !when_stopping) return true;
    batch_.swap(commands_);
  }
  if (ran != nullptr && !batch_.empty()) *ran = true;
  for (std::function<void()>& fn : batch_) fn();
  batch_.clear();
  return stop;
}

void UcxRail::WaitForEvents() {
  bool unarmed;
  {
    absl::MutexLock lock(&mu_);
    if (!commands_.empty() || stop_requested_) return;
    sleeping_ = true;
    // A registered poller progresses the worker: armed, its traffic would wake us for nothing.
    unarmed = sleep_unarmed_ = pollers_ > 0;
  }
  int timeout_ms = active_ops_ > 0 ? kPendingPollMs : -1;
  if (grace_peers_ > 0) {
    for (const auto& [id, peer] : peers_) {
      if (peer->grace_deadline == absl::InfiniteFuture()) continue;
      const int ms = MillisUntil(peer->grace_deadline);
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    }
  }
  if (unarmed) timeout_ms = timeout_ms < 0 ? kPolledSleepMs : std::min(timeout_ms, kPolledSleepMs);
  const bool events = Sleep(timeout_ms, /*arm=*/!unarmed);
  if (events && !unarmed && coalesce_ns_ > 0 && active_bytes_ >= kCoalesceMinBytes) {
    CoalesceEvents();
  }
  absl::MutexLock lock(&mu_);
  sleeping_ = false;
  wake_pending_ = false;
  sleep_unarmed_ = false;
}

void UcxRail::CoalesceEvents() {
  {
    absl::MutexLock lock(&mu_);
    if (!commands_.empty() || stop_requested_ || wake_pending_) return;
  }
  Disown();
  pollfd fd{wake_fd_, POLLIN, 0};
  const timespec wait{0, static_cast<long>(coalesce_ns_)};
  const bool woken = ppoll(&fd, 1, &wait, nullptr) == 1 && (fd.revents & POLLIN) != 0;
  Own();
  if (woken) {
    uint64_t value;
    (void)!read(wake_fd_, &value, sizeof(value));
  }
}

bool UcxRail::Sleep(int timeout_ms, bool arm) {
  bool woken = false;
  bool events = false;
  if (arm) {
    const ucs_status_t status = ucp_worker_arm(worker_);
    if (status == UCS_ERR_BUSY) return false;  // events arrived meanwhile: progress them first
    // Without an armed event fd nothing would wake us for UCX events: poll instead.
    if (status != UCS_OK) timeout_ms = timeout_ms < 0 ? 1 : std::min(timeout_ms, 1);
    Disown();
    epoll_event ready[2];
    const int n = epoll_wait(epoll_fd_, ready, 2, timeout_ms);
    for (int i = 0; i < n; ++i) {
      woken = woken || ready[i].data.fd == wake_fd_;
      events = events || ready[i].data.fd != wake_fd_;
    }
    events = events && !woken;
  } else {
    Disown();
    pollfd fd{wake_fd_, POLLIN, 0};
    woken = poll(&fd, 1, timeout_ms) == 1 && (fd.revents & POLLIN) != 0;
  }
  Own();
  if (woken) {
    uint64_t value;
    (void)!read(wake_fd_, &value, sizeof(value));
  }
  return events;
}

UcxRail::Peer* UcxRail::FindPeer(uint64_t id) {
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : it->second.get();
}

void UcxRail::Start(Op* op) {
  Peer* peer = FindPeer(op->peer_id);
  if (peer == nullptr || !peer->failure.ok()) {
    absl::Status status = peer != nullptr
                              ? peer->failure
                              : absl::CancelledError(absl::StrCat("endpoint on UCX rail ",
                                                                  config_.index, " was released"));
    RecvCompletionFn done = std::move(op->done);
    delete op;
    done(std::move(status), 0);
    return;
  }
  op->peer = peer;
  peer->ops.insert(op);
  ++active_ops_;
  active_bytes_ += op->size;

  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.user_data = op;
  // Contiguous for zero or one segment (count and buffer as UCX expects them), else an iov of
  // op->count entries.
  void* buffer = op->count == 1 ? op->iov[0].buffer : nullptr;
  size_t count = op->count <= 1 ? op->size : static_cast<size_t>(op->count);
  if (op->count > 1) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
    buffer = op->iov;
  }
  if (op->is_send) {
    param.cb.send = &UcxRail::SendCallback;
    const ucs_status_ptr_t request = ucp_tag_send_nbx(peer->ep, buffer, count, op->tag, &param);
    if (request == nullptr) {
      Complete(op, UCS_OK, op->size);
    } else if (UCS_PTR_IS_ERR(request)) {
      Complete(op, UCS_PTR_STATUS(request), 0);
    } else {
      op->request = request;
    }
    return;
  }
  // UCX 1.13 leaves recv_info.tag_info unwritten when a receive completes immediately (it matched
  // an unexpected eager message), so the received length would be unknown. With NO_IMM_CMPL it
  // instead runs the callback inline, with the length, and returns the (completed) request.
  param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = &UcxRail::RecvCallback;
  op->starting = true;
  // Exact match: the scheduler makes tags unique per sender and step.
  const ucs_status_ptr_t request =
      ucp_tag_recv_nbx(worker_, buffer, count, op->tag, ~Tag{0}, &param);
  op->starting = false;
  if (UCS_PTR_IS_ERR(request)) {
    Complete(op, UCS_PTR_STATUS(request), 0);
  } else if (op->completed_inline) {
    if (request != nullptr) ucp_request_free(request);
    Complete(op, op->inline_status, op->inline_length);
  } else if (request == nullptr) {  // immediate completion after all (other UCX versions)
    Complete(op, UCS_OK, op->size);
  } else {
    op->request = request;
  }
}

void UcxRail::SendCallback(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->request = nullptr;
  ucp_request_free(request);
  op->rail->Complete(op, status, op->size);
}

void UcxRail::RecvCallback(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                           void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  // info lives in the request: read it before the request goes back to UCX's pool.
  const size_t length = status == UCS_OK ? info->length : 0;
  if (op->starting) {  // inside ucp_tag_recv_nbx (see Start), which frees the request
    op->completed_inline = true;
    op->inline_status = status;
    op->inline_length = length;
    return;
  }
  op->request = nullptr;
  ucp_request_free(request);
  op->rail->Complete(op, status, length);
}

void UcxRail::Complete(Op* op, ucs_status_t status, size_t length) {
  Peer* peer = op->peer;
  if (peer == nullptr) {  // failed earlier; UCX has just let go of the buffer
    orphans_.erase(op);
    delete op;
    return;
  }
  peer->ops.erase(op);
  --active_ops_;
  active_bytes_ -= op->size;
  absl::Status result = StatusFor(*op, status, length);
  RecvCompletionFn done = std::move(op->done);
  delete op;
  if (peer->ops.empty()) sweep_.push_back(peer->id);
  done(std::move(result), result.ok() ? length : 0);
}

absl::Status UcxRail::StatusFor(const Op& op, ucs_status_t status, size_t length) const {
  // A shorter message is the caller's to judge (RecvCompletionFn has the length).
  if (status == UCS_OK) return absl::OkStatus();
  // Cancellation and errors after Abort or a peer failure report why the endpoint failed.
  if (!op.peer->failure.ok()) return op.peer->failure;
  if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    return absl::OutOfRangeError(
        absl::StrCat("message tagged 0x", absl::Hex(op.tag), " on UCX rail ", config_.index,
                     " is longer than the ", op.size, "-byte receive buffer"));
  }
  if (status == UCS_ERR_CANCELED) {
    return absl::CancelledError(
        absl::StrCat("operation tagged 0x", absl::Hex(op.tag), " was cancelled"));
  }
  const std::string what =
      absl::StrCat(op.is_send ? "send to " : "receive from ", op.peer->label, " on UCX rail ",
                   config_.index, " failed: ", ucs_status_string(status));
  if (IsPeerFailure(status)) return absl::UnavailableError(what);
  return absl::InternalError(what);
}

void UcxRail::EndpointErrorCallback(void* arg, ucp_ep_h ep, ucs_status_t status) {
  // Runs inside ucp_worker_progress; closing the endpoint here would re-enter UCX, so defer.
  auto* peer = static_cast<Peer*>(arg);
  peer->rail->failed_peers_.emplace_back(peer->id, status);
}

void UcxRail::HandleFailedPeers() {
  if (failed_peers_.empty()) return;
  std::vector<std::pair<uint64_t, ucs_status_t>> failed;
  failed.swap(failed_peers_);
  for (const auto& [id, status] : failed) {
    Peer* peer = FindPeer(id);
    if (peer == nullptr) continue;
    FailPeer(peer, absl::UnavailableError(absl::StrCat("peer ", peer->label, " on UCX rail ",
                                                       config_.index,
                                                       " failed: ", ucs_status_string(status))));
    // A failed endpoint must be closed with force even when FailPeer found it failed already.
    CloseEndpoint(peer, /*force=*/true);
  }
}

void UcxRail::FailPeer(Peer* peer, const absl::Status& status) {
  if (!peer->failure.ok()) return;
  peer->failure = status;
  // Unmatched receives cancel at once (UCX completes them with UCS_ERR_CANCELED, inline). Copy
  // first: completion erases from peer->ops.
  std::vector<void*> receives;
  for (Op* op : peer->ops) {
    if (!op->is_send && op->request != nullptr) receives.push_back(op->request);
  }
  for (void* request : receives) ucp_request_cancel(worker_, request);
  // Forcing the close fails the endpoint's sends (UCS_ERR_CANCELED) and stops its traffic; while
  // other endpoints to the same worker are in use it stays open (see HasUnreleasedSibling), and
  // sends UCX cannot cancel end with the grace period below.
  if (!HasUnreleasedSibling(peer)) CloseEndpoint(peer, /*force=*/true);
  if (!peer->ops.empty() && peer->grace_deadline == absl::InfiniteFuture()) {
    peer->grace_deadline = absl::Now() + config_.cancel_grace;
    ++grace_peers_;
  }
  sweep_.push_back(peer->id);
}

void UcxRail::CloseEndpoint(Peer* peer, bool force) {
  if (peer->ep == nullptr || peer->closing) return;
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  param.cb.send = &UcxRail::CloseCallback;
  param.user_data = peer;
  const ucs_status_ptr_t request = ucp_ep_close_nbx(peer->ep, &param);
  if (UCS_PTR_IS_PTR(request)) {
    peer->closing = true;
  } else {
    peer->ep = nullptr;
    sweep_.push_back(peer->id);
  }
}

void UcxRail::CloseCallback(void* request, ucs_status_t status, void* user_data) {
  auto* peer = static_cast<Peer*>(user_data);
  ucp_request_free(request);
  peer->closing = false;
  peer->ep = nullptr;
  peer->rail->sweep_.push_back(peer->id);
}

void UcxRail::ExpireGracePeriods(bool all) {
  if (grace_peers_ == 0) return;
  const absl::Time now = absl::Now();
  std::vector<std::pair<RecvCompletionFn, absl::Status>> late;
  for (auto& [id, peer] : peers_) {
    if (peer->grace_deadline == absl::InfiniteFuture() || (!all && now < peer->grace_deadline)) {
      continue;
    }
    peer->grace_deadline = absl::InfiniteFuture();
    --grace_peers_;
    for (Op* op : peer->ops) {
      // UCX still holds the request; keep op alive until it lets go (or the worker dies).
      op->peer = nullptr;
      orphans_.insert(op);
      --active_ops_;
      active_bytes_ -= op->size;
      late.emplace_back(std::move(op->done), peer->failure);
    }
    peer->ops.clear();
    sweep_.push_back(id);
  }
  // Outside the loop: a callback may post work, never touch peers_ directly, but stay safe.
  for (auto& [done, status] : late) done(status, 0);
}

void UcxRail::Sweep() {
  for (uint64_t id : sweep_) {
    Peer* peer = FindPeer(id);
    if (peer != nullptr && peer->released && peer->ep == nullptr && !peer->closing &&
        peer->ops.empty() && peer->grace_deadline == absl::InfiniteFuture()) {
      peers_.erase(id);
    }
  }
  sweep_.clear();
}

void UcxRail::DrainForStop() {
  const absl::Status cancelled =
      absl::CancelledError(absl::StrCat("UCX transport shut down (rail ", config_.index, ")"));
  for (auto& [id, peer] : peers_) {
    if (peer->failure.ok() && peer->ops.empty()) {
      peer->failure = cancelled;
      CloseEndpoint(peer.get(), /*force=*/false);
    } else {
      FailPeer(peer.get(), cancelled);
    }
  }
  const absl::Time deadline = absl::Now() + config_.shutdown_timeout;
  auto busy = [this] {
    if (active_ops_ > 0) return true;
    for (const auto& [id, peer] : peers_) {
      if (peer->closing) return true;
    }
    return false;
  };
  while (busy() && absl::Now() < deadline) {
    while (ucp_worker_progress(worker_) != 0) {
    }
    HandleFailedPeers();
    if (!busy()) break;
    Sleep(std::min(10, MillisUntil(deadline)));
  }
  ExpireGracePeriods(/*all=*/true);
}

}  // namespace railyard::transport
