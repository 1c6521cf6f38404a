// One rail of UcxTransport: a UCX context and worker bound to one NIC, and the progress thread
// that owns them except while a polling thread does. See ucx_transport.h for the threading model.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "daemon/transport/tcp_congestion.h"
#include "daemon/transport/transport.h"
#include "daemon/transport/ucx/ucx_transport.h"

namespace railyard::transport {

class UcxRail {
 public:
  struct Config {
    int index = 0;
    UcxTransport::Rail rail;
    std::string label;  // "node/railN", embedded in the address
    absl::Duration shutdown_timeout;
    absl::Duration cancel_grace;
    absl::Duration connect_timeout;
    absl::Duration busy_poll;
    TcpCongestionPolicy tcp_congestion;
    std::function<void(bool warning, const std::string& message)> report;
  };

  // Starts the progress thread, which creates the UCX context and worker. Errors: UNAVAILABLE
  // when UCX cannot create them with config.rail, INVALID_ARGUMENT when UCX rejects a setting
  // (messages from UCX included).
  static absl::StatusOr<std::shared_ptr<UcxRail>> Create(Config config);
  ~UcxRail();
  UcxRail(const UcxRail&) = delete;
  UcxRail& operator=(const UcxRail&) = delete;

  int index() const { return config_.index; }
  const std::string& address() const { return address_; }

  // Creates a UCX endpoint to the worker whose printable address is peer_address. Returns the id
  // the operations below take. Errors as UcxTransport::Connect.
  absl::StatusOr<uint64_t> Connect(const std::string& peer_address);
  // One segment goes to UCX as a contiguous buffer, more as an iov datatype (ucp_dt_make_iov).
  void SendV(uint64_t peer, Tag tag, const Segment* segments, int count, CompletionFn done);
  void RecvV(uint64_t peer, Tag tag, const Segment* segments, int count, RecvCompletionFn done);
  void Abort(uint64_t peer, absl::Status status);
  // The endpoint handle is gone: cancel what is pending and close the UCX endpoint.
  void Release(uint64_t peer);

  // Asks the progress thread to cancel everything and exit; StopAndWait also waits (bounded).
  void RequestStop();
  void StopAndWait();

  // Polling by another thread (UcxTransport::BeginPolling). Poll runs the queued commands and
  // progresses the worker on the calling thread when it can own the rail at once (else false);
  // true when it did something.
  void BeginPolling();
  bool Poll();
  void EndPolling();

 private:
  struct Peer;
  struct Op;

  explicit UcxRail(Config config);

  // Runs fn on the progress thread. False (fn dropped) once stopping.
  bool Post(std::function<void()> fn);
  // Checks and copies the segments into op and submits it; done gets INVALID_ARGUMENT (and op is
  // deleted) for a count out of [1, kMaxSegments].
  void SubmitV(Op* op, const Segment* segments, int count, RecvCompletionFn done);
  void Submit(Op* op);  // posts Start(op), or fails op at once when stopping
  void Wake();
  void Run();

  // Owning the rail: owner_mu_ plus owner_tid_, which says who holds it.
  void Own();
  void Disown();
  bool OwnedHere() const { return owner_tid_.load() == std::this_thread::get_id(); }

  // Everything below runs on the rail's owner only (the progress thread, which owns the rail
  // except while it waits, or a thread inside Poll), which is why it needs no further lock.
  absl::Status InitUcx();
  void TeardownUcx();
  void Loop();
  // Runs the queued commands, setting *ran (when given) if there were any; true once a stop was
  // requested. Then, with when_stopping (the progress thread), every command queued before the
  // stop has run; without (a polling thread), none runs: the progress thread runs them as it
  // stops.
  bool RunCommands(bool when_stopping, bool* ran = nullptr);
  void WaitForEvents();
  void BusyPoll();  // polls up to config_.busy_poll, returning early on any activity
  // Waits up to timeout_ms (-1: forever) for the wake eventfd and, when `arm`, the worker's
  // events (arming it first), without owning the rail meanwhile.
  // Returns whether UCX's events (and not the wake eventfd) ended the sleep.
  bool Sleep(int timeout_ms, bool arm = true);
  // Event moderation (ucx_rail.cc): up to coalesce_ns_ asleep on the wake eventfd alone,
  // unless a command or stop is already waiting.
  void CoalesceEvents();
  void Start(Op* op);
  void Complete(Op* op, ucs_status_t status, size_t length);
  absl::Status StatusFor(const Op& op, ucs_status_t status, size_t length) const;
  void FailPeer(Peer* peer, const absl::Status& status);
  // Reports the first change config_.tcp_congestion made to UCX's sockets (its listener, or a
  // connection) and the first refusal (tcp_congestion.h).
  void ReportTcpCongestion(const TcpCongestionResult& result, const char* what);
  void CloseEndpoint(Peer* peer, bool force);
  bool HasUnreleasedSibling(const Peer* peer) const;
  // Closes every endpoint to the worker at `remote` once none of them has a handle any more.
  void CloseGroupIfReleased(const std::string& remote);
  void HandleFailedPeers();
  void ExpireGracePeriods(bool all);
  void Sweep();  // erases released peers that have nothing left in flight
  void DrainForStop();
  Peer* FindPeer(uint64_t id);

  static void SendCallback(void* request, ucs_status_t status, void* user_data);
  static void RecvCallback(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                           void* user_data);
  static void CloseCallback(void* request, ucs_status_t status, void* user_data);
  static void EndpointErrorCallback(void* arg, ucp_ep_h ep, ucs_status_t status);

  const Config config_;
  // Event moderation's window for this rail's rate; 0: off (unknown or fast link).
  const int64_t coalesce_ns_;
  std::string address_;  // written before Create returns, then read-only
  std::atomic<uint64_t> next_peer_id_{1};

  absl::Mutex mu_;
  std::vector<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  // The progress thread is (about to be) in epoll_wait; posters must write wake_fd_.
  bool sleeping_ ABSL_GUARDED_BY(mu_) = false;
  // Someone already wrote wake_fd_ for this sleep; saves redundant writes.
  bool wake_pending_ ABSL_GUARDED_BY(mu_) = false;
  // Threads between BeginPolling and EndPolling.
  int pollers_ ABSL_GUARDED_BY(mu_) = 0;
  // The progress thread sleeps without the worker armed (pollers were registered): only
  // wake_fd_ or its short timeout wakes it.
  bool sleep_unarmed_ ABSL_GUARDED_BY(mu_) = false;

  // Held by whoever makes UCX calls or touches the state below: the progress thread, or a
  // polling thread inside Poll (which only ever tries it).
  std::mutex owner_mu_;
  std::atomic<std::thread::id> owner_tid_{};

  absl::Notification started_;
  absl::Status init_status_;  // written before started_ is notified
  absl::Notification exited_;
  absl::Mutex join_mu_;
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
  std::thread::id thread_id_;  // the progress thread's; written before started_ is notified

  // eventfd that posters write to wake the progress thread; created before started_ is notified.
  int wake_fd_ = -1;

  // Owner state (see owner_mu_).
  int epoll_fd_ = -1;  // wake_fd_ + the worker's event fd
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<std::function<void()>> batch_;  // commands being run, kept for its capacity
  std::unordered_map<uint64_t, std::unique_ptr<Peer>> peers_;
  // Reported by EndpointErrorCallback inside UCX progress, handled right after it.
  std::vector<std::pair<uint64_t, ucs_status_t>> failed_peers_;
  std::vector<uint64_t> sweep_;      // peers that may have become erasable
  std::unordered_set<Op*> orphans_;  // failed already; UCX still holds their request
  size_t active_ops_ = 0;
  size_t active_bytes_ = 0;           // their sizes (event moderation: kCoalesceMinBytes)
  int grace_peers_ = 0;               // peers waiting for cancel_grace to expire
  bool congestion_reported_ = false;  // a change was reported
  bool congestion_warned_ = false;    // a refusal was reported
};

}  // namespace railyard::transport
