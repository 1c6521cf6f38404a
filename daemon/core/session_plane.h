// Client sessions and what they hold: a session opened on the buffer side channel its Connect
// names (the process the kernel says is at its end), its buffers (host memfds mapped, device
// memory imported, within the session's and job's quotas), its rings (mapped and served by a
// ring thread that submits through the SubmitPath), its memberships, and its end (what it held
// for its streams dropped, its rings stopped, its communicators left, its buffers unmapped once
// the last operation lets go).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/comm/comm_registry.h"
#include "daemon/config.h"
#include "daemon/device/device_runtime.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/session/fd_channel.h"
#include "daemon/session/mapping_budget.h"
#include "daemon/session/ring_poller.h"
#include "daemon/session/session.h"
#include "daemon/session/session_registry.h"
#include "daemon/submit/submit_path.h"
#include "daemon/transport/transport.h"
#include "grpcpp/support/status.h"
#include "railyard/v1/common.pb.h"
#include "railyard/v1/local.pb.h"

namespace railyard {

class SessionPlane {
 public:
  // Everything here must outlive this object (the daemon's members). metrics may be null.
  struct Deps {
    SessionRegistry* sessions = nullptr;
    CommRegistry* comms = nullptr;
    SubmitPath* submit = nullptr;
    RingPollers* ring_pollers = nullptr;
    metrics::DaemonMetrics* metrics = nullptr;
  };
  SessionPlane(const DaemonConfig& config, Deps deps);
  SessionPlane(const SessionPlane&) = delete;
  SessionPlane& operator=(const SessionPlane&) = delete;

  // Before serving: the side channel sessions' connections come from (owned by the Server), the
  // devices device memory is imported on (null with why: device memory is refused saying so),
  // and the transport ring threads may progress (null: single-node).
  void SetFdChannels(FdChannelServer* channels) { fd_channels_ = channels; }
  void SetDevices(device::DeviceRuntime* devices, absl::Status why_none);
  void SetTransport(transport::Transport* transport) { transport_ = transport; }

  // Binds the side channel named by req.fd_ticket and opens a session as the process the kernel
  // says is at its end. INVALID_ARGUMENT for a malformed job id or no fd_ticket, NOT_FOUND for an
  // unknown ticket, PERMISSION_DENIED (token, uid policy), RESOURCE_EXHAUSTED (session limits),
  // UNAVAILABLE when the side channel is not serving.
  absl::StatusOr<std::shared_ptr<Session>> Open(const v1::ConnectRequest& req);
  // NOT_FOUND for an unknown (or closed) session id.
  absl::StatusOr<std::shared_ptr<Session>> Find(const std::string& session_id);
  // Ends a session: unmaps its buffers, leaves its communicators (failing them for their other
  // ranks with `why`), finishes its stream with `stream_status`. Idempotent.
  void Close(const std::shared_ptr<Session>& session, const std::string& why,
             const grpc::Status& stream_status);

  // Maps the memfd the session's side channel holds under fd_handle (one time), within the
  // session's and job's buffer quotas. With memory MEMORY_KIND_CUDA the descriptor is a device
  // allocation to import on `device` (device::DeviceRuntime::Import says what it checks);
  // FAILED_PRECONDITION when this daemon has no devices, INVALID_ARGUMENT for an unknown kind.
  // A non-empty cuda_ipc_handle instead of a descriptor (fd_handle 0): legacy CUDA IPC, device
  // memory at cuda_ipc_offset of that allocation (DeviceRuntime::ImportIpc), only with
  // --cuda_ipc (FAILED_PRECONDITION saying why otherwise).
  absl::StatusOr<uint64_t> RegisterBuffer(Session& session, uint64_t fd_handle, uint64_t size,
                                          v1::MemoryKind memory = v1::MEMORY_KIND_HOST,
                                          int device = -1, std::string_view cuda_ipc_handle = {},
                                          uint64_t cuda_ipc_offset = 0);
  // A part of buffer parent_id of the session (host memory) under an id of its own, without a
  // mapping of its own (Local.RegisterBuffer's parent_buffer_id): NOT_FOUND for a parent the
  // session does not have, INVALID_ARGUMENT for a part past its end or of device memory,
  // RESOURCE_EXHAUSTED past the buffer-count quota.
  absl::StatusOr<uint64_t> RegisterPart(Session& session, uint64_t parent_id, uint64_t offset,
                                        uint64_t size);
  // NOT_FOUND for a buffer the session does not have.
  absl::Status ReleaseBuffer(Session& session, uint64_t buffer_id);
  // Maps the rings memfd the session's side channel holds under fd_handle and starts serving
  // them (Local.OpenRings): each entry goes through the SubmitPath.
  absl::Status OpenRings(const std::shared_ptr<Session>& session, uint64_t fd_handle,
                         uint32_t sq_entries, uint32_t cq_entries);
  // The rank leaves communicator `handle` (what it held for its streams there fails CANCELLED);
  // the communicator fails ABORTED for its other ranks. NOT_FOUND for a handle not the session's.
  absl::Status DestroyComm(Session& session, uint64_t handle);

 private:
  void RetireCommIfEmpty(const std::shared_ptr<Communicator>& comm);

  const DaemonConfig& config_;
  const Deps deps_;
  FdChannelServer* fd_channels_ = nullptr;
  device::DeviceRuntime* devices_ = nullptr;
  absl::Status no_devices_ = absl::FailedPreconditionError("no device runtime was set up");
  transport::Transport* transport_ = nullptr;
  std::atomic<uint64_t> next_buffer_id_{1};
  // Host buffers' and rings' mappings, per job (--max_mappings, --max_mappings_per_job).
  MappingBudget mappings_;

 public:
  const MappingBudget& mappings() const { return mappings_; }
};

}  // namespace railyard
