// The state a Client shares with its Buffers, Comms and Works: the gRPC stub, the session (the
// Connect stream and the thread that reads it) and the table of requests in flight.
#pragma once

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
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
// by the end of the session.
class PendingRequest {
 public:
  // Records the outcome and wakes the waiters; later calls are ignored.
  void Complete(absl::Status status, uint64_t seq);
  // Sets the sequence number from the Submit reply (unless the completion already set it).
  void SetSeq(uint64_t seq);
  // Waits until completed or timeout; DEADLINE_EXCEEDED on timeout. A request submitted on the
  // rings is waited for by reading the completion ring on this thread.
  absl::Status Wait(std::chrono::milliseconds timeout);
  // The rings its completion arrives on (before it is submitted); null: the Connect stream.
  void SetRings(std::shared_ptr<ClientRings> rings) { rings_ = std::move(rings); }
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

 private:
  std::shared_ptr<ClientRings> rings_;
  uint32_t* stream_done_ = nullptr;
  uint32_t stream_value_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
  uint64_t seq_ = 0;
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
  // True while the session is open (not shut down and the stream has not ended).
  bool alive() const;

  const std::string& session_id() const { return session_id_; }
  const std::string& node_name() const { return node_name_; }
  const std::string& socket() const { return socket_; }
  const std::string& job() const { return job_; }
  const std::string& default_algo() const { return default_algo_; }
  const std::string& default_compression() const { return default_compression_; }

  // Sends the memfd over the side channel and registers `size` bytes of it.
  // device -1: a host memfd; else a CUDA allocation's exported descriptor on that device.
  absl::StatusOr<uint64_t> RegisterBuffer(int memfd, uint64_t size, int device = -1);
  // Device memory named by a legacy CUDA IPC handle, `offset` bytes into its allocation.
  absl::StatusOr<uint64_t> RegisterCudaIpc(std::string_view handle, uint64_t offset, uint64_t size,
                                           int device);
  // Sends a filled-in RegisterBufferRequest (this session's id added); the buffer id.
  absl::StatusOr<uint64_t> SendRegisterBuffer(v1::RegisterBufferRequest* request);
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

  // Fills in session_id and request_id, registers `pending` and submits. A Submit error, or a
  // session already closed, completes `pending` with that status.
  void Submit(v1::SubmitRequest request, const std::shared_ptr<internal::PendingRequest>& pending);
  // Submits several requests as one group (GroupStart/GroupEnd): on the rings, published at once
  // and marked as a group the daemon may fuse; on gRPC, one after the other.
  void SubmitGroup(
      std::vector<std::pair<v1::SubmitRequest, std::shared_ptr<internal::PendingRequest>>>
          requests);
  // True when submissions go over the session rings (RAILYARD_FASTPATH, Local.OpenRings).
  bool fastpath() const { return rings_ != nullptr; }
  // The ready/done words of the streams operations are ordered on (CollectiveOptions::stream),
  // made when first asked for with the options' StreamOps (else CUDA's).
  absl::StatusOr<internal::StreamWords*> StreamWords();

 private:
  ClientCore() = default;
  // Opens the session rings (after Connected); errors leave the session on gRPC Submit.
  absl::Status OpenRings(std::chrono::microseconds spin);
  // Registers a request in pending_ (false, with it completed, when the session has ended).
  bool Register(uint64_t request_id, const std::shared_ptr<internal::PendingRequest>& pending);
  // A completion read off the rings.
  void OnRingCompletion(uint64_t request_id, absl::Status status, uint64_t seq);
  // Runs on reader_: reads the Connect stream until it ends.
  void ReadEvents();
  // Sets a deadline of `timeout` from now on ctx.
  static void SetDeadline(grpc::ClientContext* ctx, std::chrono::milliseconds timeout);
  // OK while the session is open; else why it is not (client shut down, or the stream's end).
  absl::Status SessionError() const;
  // Adds which daemon to UNAVAILABLE errors of unary calls.
  absl::Status RpcError(const char* rpc, const grpc::Status& status) const;

  // The process that connected, and its fork generation: in a child forked after Connect every
  // call fails with FAILED_PRECONDITION before it touches the session (SessionError), and the
  // core is never destroyed there (its threads and gRPC channel are the parent's; see Connect).
  const pid_t pid_ = getpid();
  const uint64_t fork_generation_ = internal::ForkGeneration();
  bool forked() const { return internal::ForkGeneration() != fork_generation_; }

  std::string socket_;
  long keepalive_ms_ = 0;  // HTTP/2 keepalive of the session channel ($RAILYARD_KEEPALIVE_MS)
  std::string job_;
  std::string default_algo_;
  std::string default_compression_;  // RAILYARD_COMPRESSION
  std::string integrity_;            // InitCommRequest.integrity of every InitComm
  std::string session_id_;
  std::string node_name_;
  std::unique_ptr<internal::FdChannelClient> fd_channel_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Local::Stub> stub_;
  std::shared_ptr<internal::ClientRings> rings_;  // set once, right after Connected

  grpc::ClientContext stream_ctx_;
  std::unique_ptr<grpc::ClientReader<v1::SessionEvent>> stream_;
  std::thread reader_;

  mutable std::mutex mu_;
  std::condition_variable connected_cv_;
  bool connected_ = false;      // the Connected event arrived
  bool stream_ended_ = false;   // the reader saw the end of the stream
  bool shutting_down_ = false;  // Shutdown() started
  absl::Status end_status_;     // why the session ended (valid once stream_ended_)
  std::unordered_map<uint64_t, std::shared_ptr<internal::PendingRequest>> pending_;

  std::atomic<uint64_t> next_request_id_{1};
  std::once_flag shutdown_once_;

  std::shared_ptr<StreamOps> stream_ops_;  // ClientOptions::stream_ops
  std::mutex streams_mu_;
  std::unique_ptr<internal::StreamWords> stream_words_;  // made by StreamWords()
};

}  // namespace railyard
