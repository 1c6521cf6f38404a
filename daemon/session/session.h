// A client process's session: its job, its mapped buffers, its communicator memberships and the
// stream its completions go out on.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/session/completion_sink.h"
#include "daemon/session/peer_cred.h"
#include "daemon/session/quota.h"
#include "daemon/session/shm_segment.h"
#include "railyard/v1/local.grpc.pb.h"

namespace railyard {

class Communicator;
class FdChannel;
class SessionRings;

// The Connect server stream of one session. Writes queued events one at a time. An event queued
// with a quota account holds its serialized size of Resource::kCompletionBytes until it is
// written or dropped: a client that stops reading is refused new work (SubmitPath::Submit), and
// never loses a completion it is owed.
class SessionStream : public grpc::ServerWriteReactor<v1::SessionEvent> {
 public:
  // on_cancel runs once if the client goes away (process exit, crash, cancelled call);
  // on_done runs last, just before the stream deletes itself.
  SessionStream(std::function<void()> on_cancel, std::function<void()> on_done)
      : on_cancel_(std::move(on_cancel)), on_done_(std::move(on_done)) {}

  // Queues an event for the client, charged to backlog (null: not accounted) even past its limit
  // until written. Dropped after Close().
  void Send(v1::SessionEvent event, std::shared_ptr<QuotaAccount> backlog = nullptr);
  // Finishes the stream with status once the queued events are written.
  void Close(const grpc::Status& status);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Queued {
    v1::SessionEvent event;
    QuotaCharge backlog;  // its bytes of Resource::kCompletionBytes, released with it
  };
  absl::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status close_status_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_cancel_;
  std::function<void()> on_done_;
};

// A communicator this session's process is a rank of.
struct Membership {
  std::shared_ptr<Communicator> comm;
  int rank = 0;
};

// The Connect-stream event that reports one request's outcome.
v1::SessionEvent CompletionEvent(uint64_t request_id, const absl::Status& status, uint64_t seq);

class Session : public CompletionSink {
 public:
  // quota: this session's counters (charged with its job's); null: not accounted (tests).
  Session(std::string id, std::string job, int64_t pid, std::string client,
          std::shared_ptr<QuotaAccount> quota = nullptr, PeerCred cred = {});

  const std::string& id() const { return id_; }
  const std::string& job() const { return job_; }
  int64_t pid() const { return pid_; }
  const std::string& client() const { return client_; }
  absl::Time connected_at() const { return connected_at_; }
  const PeerCred& cred() const { return cred_; }
  // What this session holds against its limits; null when not accounted.
  const std::shared_ptr<QuotaAccount>& quota() const { return quota_; }

  // Completions. The stream is attached by Connect and detached when it is done.
  void AttachStream(SessionStream* stream);
  void DetachStream();
  void PostCompletion(uint64_t request_id, const absl::Status& status, uint64_t seq) override;
  // Marks the session closed and finishes its stream (if any) with status.
  void Close(const grpc::Status& status);
  // Tells the client the daemon hands the node over (SessionEvent.moving): the events queued
  // before it (its completions) reach the client first.
  void SendMoving(const std::string& why, const std::string& daemon_version);
  bool closed() const;

  // Buffers.
  absl::Status AddBuffer(uint64_t id, std::shared_ptr<MappedSegment> segment);
  std::shared_ptr<MappedSegment> FindBuffer(uint64_t id) const;
  bool RemoveBuffer(uint64_t id);
  std::map<uint64_t, std::shared_ptr<MappedSegment>> TakeBuffers();
  uint32_t buffer_count() const;
  uint64_t buffer_bytes() const;

  // The side channel its buffers' descriptors come over, and the pid the client reported.
  void AttachFdChannel(std::shared_ptr<FdChannel> channel, int64_t reported_pid);
  std::shared_ptr<FdChannel> fd_channel() const;
  int64_t reported_pid() const;

  // The fast path's rings (Local.OpenRings), at most one set; null until opened.
  // ALREADY_EXISTS when it has them already, FAILED_PRECONDITION once closed.
  absl::Status AttachRings(std::shared_ptr<SessionRings> rings);
  std::shared_ptr<SessionRings> rings() const;

  // Communicator memberships, by comm handle. Each holds one of the session's communicator quota
  // (RESOURCE_EXHAUSTED naming --max_comms_per_session/_per_job beyond it).
  absl::Status AddMembership(uint64_t handle, Membership m);
  absl::StatusOr<Membership> FindMembership(uint64_t handle) const;
  bool RemoveMembership(uint64_t handle);
  std::map<uint64_t, Membership> TakeMemberships();
  // A copy of them (railctl diagnose: which process is which rank).
  std::map<uint64_t, Membership> Memberships() const;

 private:
  const std::string id_;
  const std::string job_;
  const int64_t pid_;
  const std::string client_;
  const absl::Time connected_at_;
  const std::shared_ptr<QuotaAccount> quota_;
  const PeerCred cred_;

  mutable absl::Mutex mu_;
  SessionStream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, std::shared_ptr<MappedSegment>> buffers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Membership> memberships_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<FdChannel> fd_channel_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<SessionRings> rings_ ABSL_GUARDED_BY(mu_);
  int64_t reported_pid_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace railyard
