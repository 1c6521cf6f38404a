// The state a Client shares with its Buffers, Comms and Works: the gRPC stub, the session (the
// Connect stream and the thread that reads it) and the table of requests in flight.
#pragma once

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client_rings.h"
#include "fd_channel_client.h"
#include "railyard/client.h"
#include "railyard/v1/local.grpc.pb.h"
#include "stream_words.h"

namespace railyard {

namespace internal {

// One submitted request, completed exactly once: by its Completion event, by a failed Submit, or
// by the end of the session. A daemon restart or handover does not complete it: the client core
// submits it again to the daemon it reconnects to (docs/restarts.md), then it completes there.
class PendingRequest {
 public:
  // Not yet published on a ring (sq_first()).
  static constexpr uint64_t kUnpublished = ~uint64_t{0};

  // Records the outcome and wakes the waiters; later calls are ignored.
  void Complete(absl::Status status, uint64_t seq);
  // Sets the sequence number from the Submit reply (unless the completion already set it).
  void SetSeq(uint64_t seq);
  // Waits until completed or timeout; DEADLINE_EXCEEDED on timeout. A request submitted on the
  // rings is waited for by reading the completion ring on this thread (the rings it is on now:
  // after a reconnect, the new session's).
  absl::Status Wait(std::chrono::milliseconds timeout);
  // The rings its completion arrives on; null: the Connect stream (or not submitted yet).
  void SetRings(std::shared_ptr<ClientRings> rings);
  // The done word of the stream it is ordered on (StreamWords, owned by the core): an error lets
  // the stream go on (StoreAtLeast) even where the daemon never saw the request.
  void SetStreamDone(uint32_t* word, uint32_t value) {
    stream_done_ = word;
    stream_value_ = value;
  }
  bool done() const;
  // done(), after reading the completions the rings hold (nothing else may be reading them).
  bool Test();
  uint64_t seq() const;

  // Re-running it after a daemon crash is safe: its inputs cannot have been overwritten by it
  // (its output buffer is another than its inputs'). Set by Comm before it is submitted.
  bool rerun_safe = false;
  // The submission ring slot of its entry (kUnpublished: not on a ring), set as it is published.
  std::atomic<uint64_t> sq_first{kUnpublished};

 private:
  std::shared_ptr<ClientRings> rings_;  // guarded by mu_
  uint32_t* stream_done_ = nullptr;
  uint32_t stream_value_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
  uint64_t seq_ = 0;
};

// A descriptor this client owns: closed with it. Move-only.
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  OwnedFd(OwnedFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  OwnedFd& operator=(OwnedFd&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// Converts a gRPC status, keeping the code and the daemon's message.
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace internal

class ClientCore {
 public:
  // Connects and waits (up to options.connect_timeout) for the Connected event.
  // Errors: UNAVAILABLE naming the socket when the daemon cannot be reached or does not answer;
  // PERMISSION_DENIED / INVALID_ARGUMENT from the daemon for a bad token or job id.
  static absl::StatusOr<std::shared_ptr<ClientCore>> Connect(const ClientOptions& options);
  ~ClientCore();
  ClientCore(const ClientCore&) = delete;
  ClientCore& operator=(const ClientCore&) = delete;

  // Ends the session: Disconnect, cancel the stream, join the reader, fail outstanding requests
  // with CANCELLED. Idempotent.
  void Shutdown();
  // True while the session is open or being rebuilt (not shut down, not ended for good).
  bool alive() const;

  const std::string& session_id() const { return session_id_; }
  const std::string& node_name() const { return node_name_; }
  const std::string& socket() const { return socket_; }
  const std::string& job() const { return job_; }
  const std::string& default_algo() const { return default_algo_; }
  const std::string& default_compression() const { return default_compression_; }

  // Sends the memfd over the side channel and registers `size` bytes of it.
  // device -1: a host memfd; else a CUDA allocation's exported descriptor on that device.
  // The core keeps a duplicate of the descriptor to register it again after a reconnect.
  absl::StatusOr<uint64_t> RegisterBuffer(int memfd, uint64_t size, int device = -1);
  // Device memory named by a legacy CUDA IPC handle, `offset` bytes into its allocation.
  absl::StatusOr<uint64_t> RegisterCudaIpc(std::string_view handle, uint64_t offset, uint64_t size,
                                           int device);
  absl::Status ReleaseBuffer(uint64_t buffer_id);
  // Registers [offset, offset + size) of buffer parent as a buffer of its own (a pooled chunk).
  absl::StatusOr<uint64_t> RegisterPart(uint64_t parent, uint64_t offset, uint64_t size);
  // OK while this process may use the session: not a fork of the one that connected, not shut
  // down, the session not ended (what every call checks first).
  absl::Status Usable() const { return SessionError(); }
  absl::StatusOr<std::string> CreateCommId();
  absl::StatusOr<v1::InitCommResponse> InitComm(const std::string& comm_id, int rank, int nranks,
                                                std::chrono::milliseconds timeout);
  absl::Status DestroyComm(uint64_t comm_handle);
  // The comm id of a communicator of this client (by the handle callers hold).
  absl::StatusOr<std::string> CommIdOf(uint64_t comm_handle) const;
  // Local.CommCensus of a communicator this client joined: which of its ranks are gone (or,
  // with `exclude`, the coordinator of a shrink without those ranks).
  absl::StatusOr<v1::CommCensusResponse> CommCensus(uint64_t comm_handle, uint32_t timeout_ms,
                                                    const std::vector<int>& exclude = {});

  // Fills in session_id and request_id, registers `pending` and submits. A Submit error, or a
  // session already closed, completes `pending` with that status.
  void Submit(v1::SubmitRequest request, const std::shared_ptr<internal::PendingRequest>& pending);
  // Submits several requests as one group (GroupStart/GroupEnd): on the rings, published at once
  // and marked as a group the daemon may fuse; on gRPC, one after the other.
  void SubmitGroup(
      std::vector<std::pair<v1::SubmitRequest, std::shared_ptr<internal::PendingRequest>>>
          requests);
  // True when submissions go over the session rings (RAILYARD_FASTPATH, Local.OpenRings).
  bool fastpath() const;
  // The ready/done words of the streams operations are ordered on (CollectiveOptions::stream),
  // made when first asked for with the options' StreamOps (else CUDA's).
  absl::StatusOr<internal::StreamWords*> StreamWords();
  // How many times the session was rebuilt on a new daemon (a handover or a restart).
  uint64_t reconnects() const;

 private:
  // One session with one daemon: its side channel, gRPC channel, Connect stream and rings.
  struct Link;
  // What the core registered, to register again after a reconnect (by the id callers hold).
  struct BufferRecord {
    internal::OwnedFd fd;  // a duplicate of the descriptor sent (none for IPC handles and parts)
    std::string ipc_handle;
    uint64_t ipc_offset = 0;
    uint64_t size = 0;
    int device = -1;
    uint64_t parent = 0;  // a part of this buffer (its id as callers hold it)
    uint64_t parent_offset = 0;
    uint64_t id = 0;  // the daemon's id in the current session
  };
  struct CommRecord {
    std::string comm_id;
    int rank = 0;
    int nranks = 0;
    int nnodes = 1;
    uint64_t handle = 0;  // the daemon's handle in the current session
    // The sequence number this rank's next collective gets: one past the highest of a collective
    // that completed OK, plus those a restart failed after the daemon had taken them.
    uint64_t next_seq = 0;
    absl::Status broken;  // it could not be joined again after a reconnect
    // Collectives of this rank that another rank's failed copy took with it in a restart and
    // that were not submitted yet: the next ones submitted fail (InitCommResponse.first_seq).
    uint64_t lost = 0;
  };
  // An operation submitted and not completed.
  struct Outstanding {
    std::shared_ptr<internal::PendingRequest> pending;
    v1::SubmitRequest request;  // as submitted (ids as callers hold them)
    uint64_t generation = 0;    // of the link it was (last) sent on
    bool unsent = false;        // to send (again) once the session is rebuilt
    bool moved = false;         // the daemon handed it back untaken (a handover)
    bool via_rings = false;     // on the rings (else gRPC Submit) of its link
  };
  enum class State { kLive, kRebuilding };

  ClientCore() = default;
  // Opens a session with the daemon (side channel, Connect, rings), waiting up to timeout.
  absl::StatusOr<std::shared_ptr<Link>> OpenLink(std::chrono::milliseconds timeout);
  absl::Status OpenRings(Link& link);
  // Runs on a link's reader thread: reads its Connect stream until it ends.
  void ReadEvents(const std::shared_ptr<Link>& link);
  // A completion (from the stream or the rings).
  void OnCompletion(uint64_t request_id, absl::Status status, uint64_t seq, uint32_t flags);
  // The link's stream ended (its reader thread).
  void OnLinkEnded(const std::shared_ptr<Link>& link, absl::Status end);
  // Runs on rebuild_thread_: sessions again until one holds or the window closes.
  void RebuildLoop(std::chrono::steady_clock::time_point deadline);
  // One rebuild of the session on the daemon now at the socket: done (the new session serves),
  // again (the new daemon went away meanwhile: another attempt within the window), or given
  // up (Die called).
  enum class Rebuilt { kDone, kAgain, kGaveUp };
  Rebuilt RebuildOnce(const std::shared_ptr<Link>& old,
                      std::chrono::steady_clock::time_point deadline);
  // Why an operation the dead daemon had taken fails (why: why it does not run again).
  absl::Status RestartedStatus(const v1::SubmitRequest& request, const char* why) const;
  // Why a collective fails that another rank's copy, failed in a restart, took with it.
  static absl::Status LostStatus(const v1::SubmitRequest& request, const std::string& comm_id);
  // True when a call on link failed because its daemon went away while the session was being
  // rebuilt, and the window allows another attempt.
  bool GoneAgain(Link& link, const absl::Status& status,
                 std::chrono::steady_clock::time_point deadline);
  // Sends what is marked unsent on the current link, until nothing is.
  void SendUnsent();
  // Ends the session for good: every outstanding request fails with status.
  void Die(absl::Status status);
  // The live link, waiting out a rebuild (bounded); the error when the session is over.
  absl::StatusOr<std::shared_ptr<Link>> AcquireLink();
  // Tells the daemon of a release (ReleaseBuffer, DestroyComm: `call` on the live link, once)
  // and forgets it here (`forget`, under mu_) in every case; between sessions, or when the daemon
  // goes away during the call, only forgets: a destructor never waits for the next daemon.
  absl::Status Release(const char* rpc, const std::function<grpc::Status(Link&)>& call,
                       const std::function<void()>& forget);
  // Runs fn on the live link; again on the next one when the daemon went away meanwhile.
  template <typename T>
  absl::StatusOr<T> WithLink(const std::function<absl::StatusOr<T>(Link&)>& fn);
  // A request with the ids of the current session (callers hold the first session's).
  v1::SubmitRequest TranslatedLocked(const v1::SubmitRequest& request) const;
  uint64_t BufferIdLocked(uint64_t id) const;
  // Encodes and publishes (rings) or sends (gRPC) the requests of ids, marked with generation.
  void SendOn(const std::shared_ptr<Link>& link, const std::vector<uint64_t>& ids, bool group);
  // Registration RPCs on a link.
  absl::StatusOr<uint64_t> RegisterOn(Link& link, v1::RegisterBufferRequest request);
  absl::StatusOr<v1::InitCommResponse> InitCommOn(Link& link, const std::string& comm_id, int rank,
                                                  int nranks, std::chrono::milliseconds timeout,
                                                  uint64_t resume_seq);
  // Sets a deadline of `timeout` from now on ctx.
  static void SetDeadline(grpc::ClientContext* ctx, std::chrono::milliseconds timeout);
  // OK while the session is usable; else why it is not (client shut down, or the session over).
  absl::Status SessionError() const;
  // Adds which daemon to UNAVAILABLE errors of unary calls.
  absl::Status RpcError(const char* rpc, const grpc::Status& status) const;
  // The id callers will hold for a buffer or communicator the daemon named daemon_id; next: the
  // counter of its kind.
  uint64_t NewIdLocked(uint64_t daemon_id, uint64_t* next);

  // The process that connected, and its fork generation: in a child forked after Connect every
  // call fails with FAILED_PRECONDITION before it touches the session (SessionError), and the
  // core is never destroyed there (its threads and gRPC channel are the parent's; see Connect).
  const pid_t pid_ = getpid();
  const uint64_t fork_generation_ = internal::ForkGeneration();
  bool forked() const { return internal::ForkGeneration() != fork_generation_; }

  std::string socket_;
  long keepalive_ms_ = 0;  // HTTP/2 keepalive of the session channel ($RAILYARD_KEEPALIVE_MS)
  std::string job_;
  std::string token_;
  std::string default_algo_;
  std::string default_compression_;  // RAILYARD_COMPRESSION
  std::string integrity_;            // InitCommRequest.integrity of every InitComm
  std::string fastpath_env_;         // RAILYARD_FASTPATH
  std::chrono::microseconds spin_{10};
  // How long a client waits for a daemon to come back after its session ended without a
  // handover ($RAILYARD_RECONNECT_S; 0: it does not, the session is over).
  std::chrono::seconds reconnect_window_{60};
  std::string session_id_;
  std::string node_name_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // link_/state_ changes, a link's Connected or end
  std::shared_ptr<Link> link_;
  uint64_t generation_ = 0;  // of link_: 0 for the first session
  State state_ = State::kLive;
  bool dead_ = false;           // the session is over for good (end_status_ says why)
  bool shutting_down_ = false;  // Shutdown() started
  absl::Status end_status_;
  std::map<uint64_t, Outstanding> pending_;  // by request id: the order they were submitted in
  // By the ids callers hold (the daemon's of the first session; fresh ones after a reconnect).
  std::map<uint64_t, BufferRecord> buffers_;
  std::map<uint64_t, CommRecord> comms_;
  uint64_t next_buffer_id_ = 1;           // above every buffer id handed out
  uint64_t next_comm_id_ = 1;             // above every communicator handle handed out
  std::atomic<bool> translating_{false};  // ids differ from the daemon's (after a reconnect)
  std::thread rebuild_thread_;
  std::set<grpc::ClientContext*> joining_;  // InitComm calls in flight (Shutdown cancels them)

  std::atomic<uint64_t> next_request_id_{1};
  std::once_flag shutdown_once_;

  std::shared_ptr<StreamOps> stream_ops_;  // ClientOptions::stream_ops
  std::mutex streams_mu_;
  std::unique_ptr<internal::StreamWords> stream_words_;  // made by StreamWords()
};

}  // namespace railyard
