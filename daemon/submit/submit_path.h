// The one way a rank's request reaches its communicator: the gRPC Local.Submit and the session's
// rings (SessionRings, a batch at a time) both call a Submitter, and the daemon's is SubmitPath.
//
//   request ──> membership (the session's comm handle) ──> quota: the client reads its
//   completions ──> decode against the session's buffers (request_decode.h) ──> held on its
//   stream's gate while its stream has not reached it, or behind what is held before it
//   (stream_gates.h) ──> device memory across nodes staged through host memory (device_staging.h,
//   copies on the device's thread) ──> its completion routed (the sink, else the session; the
//   stream's done word) ──> Communicator::Submit / SubmitBatch.
//
// Bad input is refused at once, before anything is held, with the status saying what and why; a
// refused request whose stream waits for it lets the stream go (its done word is stored).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/comm/communicator.h"
#include "daemon/comm/pending_request.h"
#include "daemon/device/device_runtime.h"
#include "daemon/device/staging_pool.h"
#include "daemon/scheduler/executor.h"
#include "daemon/session/completion_sink.h"
#include "daemon/session/session.h"
#include "daemon/submit/stream_gates.h"
#include "railyard/v1/local.pb.h"

namespace railyard {

class HostStaging;

// What the services and the rings submit through (a fake in their tests).
class Submitter {
 public:
  virtual ~Submitter() = default;
  // One request of the session's; sink: where its completion goes (null: the session's Connect
  // stream). The operation's seq, or 0 when it was held for its stream (its seq then comes with
  // its completion); an error when it was refused (no completion follows).
  virtual absl::StatusOr<uint64_t> Submit(const std::shared_ptr<Session>& session,
                                          const v1::SubmitRequest& req,
                                          std::shared_ptr<CompletionSink> sink) = 0;
  // The session's consecutive requests (a group off its rings), each as Submit, the runs on one
  // communicator under one lock of it (Communicator::SubmitBatch): results in order.
  virtual std::vector<absl::StatusOr<uint64_t>> SubmitBatch(
      const std::shared_ptr<Session>& session, const std::vector<const v1::SubmitRequest*>& reqs,
      std::shared_ptr<CompletionSink> sink) = 0;
};

class SubmitPath final : public Submitter {
 public:
  struct Options {
    // A held request's deadline when it has no timeout of its own (--op_timeout).
    absl::Duration op_timeout = absl::Seconds(300);
    // Device staging across nodes (--staging_chunk_bytes, --staging_inline_bytes,
    // --staging_pipeline; daemon/config.h).
    uint64_t staging_chunk_bytes = uint64_t{4} << 20;
    uint64_t staging_inline_bytes = uint64_t{1} << 20;
    bool staging_pipeline = true;
    // The stream gates' poller: how long it spins after letting an item go, and its longest
    // sleep between polls (--spin, --stream_poll).
    absl::Duration gate_spin = absl::ZeroDuration();
    absl::Duration gate_poll = absl::Microseconds(100);
    // Operations held at once (--max_held_ops_per_session, --max_held_ops_per_job).
    StreamGates::Limits held;
  };

  // executor: runs staging work (leasing host memory, copies on the device's thread); it must
  // outlive this SubmitPath's Stop().
  SubmitPath(Options options, scheduler::Executor* executor);
  // Stop()s.
  ~SubmitPath() override;
  SubmitPath(const SubmitPath&) = delete;
  SubmitPath& operator=(const SubmitPath&) = delete;

  // The device runtime and its staging pool, before serving (null: no devices; device memory is
  // refused before it gets here). Both must outlive Stop().
  void SetDevices(device::DeviceRuntime* devices, device::StagingPool* staging_pool);

  absl::StatusOr<uint64_t> Submit(const std::shared_ptr<Session>& session,
                                  const v1::SubmitRequest& req,
                                  std::shared_ptr<CompletionSink> sink) override;
  std::vector<absl::StatusOr<uint64_t>> SubmitBatch(
      const std::shared_ptr<Session>& session, const std::vector<const v1::SubmitRequest*>& reqs,
      std::shared_ptr<CompletionSink> sink) override;

  // What the session holds for its streams fails with `why` (its end), or only what it holds on
  // communicator `handle` (the rank destroyed it).
  void DropHeld(const Session& session, const absl::Status& why);
  void DropHeld(const Session& session, uint64_t handle, const absl::Status& why);
  // Requests held for their streams now (Status, metrics).
  size_t held() const { return gates_.held(); }
  // Stops the gates' thread (held requests fail with UNAVAILABLE) after the releases running
  // elsewhere have called back. Nothing submits through this SubmitPath afterwards. Idempotent.
  void Stop();

 private:
  absl::Status Refuse(const Session& session, const v1::SubmitRequest& req, absl::Status why);
  absl::StatusOr<std::unique_ptr<PendingRequest>> Decode(const std::shared_ptr<Session>& session,
                                                         const v1::SubmitRequest& req,
                                                         const Membership& m);
  void RouteCompletion(const std::shared_ptr<Session>& session,
                       const std::shared_ptr<CompletionSink>& sink, PendingRequest* pending);
  absl::Status Finish(const std::shared_ptr<Session>& session, const Membership& m,
                      const std::shared_ptr<CompletionSink>& sink, PendingRequest* pending);
  bool MustHold(const Session& session, const Membership& m, uint64_t handle,
                const PendingRequest& pending) const;
  absl::Status Hold(const std::shared_ptr<Session>& session, const Membership& m, uint64_t handle,
                    const std::shared_ptr<CompletionSink>& sink,
                    std::unique_ptr<PendingRequest> pending);
  void StageOnDevice(std::weak_ptr<Session> weak_session, const Membership& m,
                     std::shared_ptr<CompletionSink> sink,
                     std::shared_ptr<std::unique_ptr<PendingRequest>> held,
                     std::function<void(const absl::Status&)> fail, std::function<void()> done);
  void CopyInOnDevice(int device, std::shared_ptr<HostStaging> staging,
                      std::function<void(absl::Status)> then);

  const Options options_;
  scheduler::Executor* const executor_;
  device::DeviceRuntime* devices_ = nullptr;
  device::StagingPool* staging_pool_ = nullptr;
  // Its thread submits into communicators: stopped (Stop) before what it uses goes.
  StreamGates gates_;
};

}  // namespace railyard
