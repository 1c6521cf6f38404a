// One rank's submission as a communicator holds it: the decoded request, where its completion
// goes, the buffers it keeps mapped, its deadline, and what it holds of its session's quota while
// it waits.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/comm/stream_sync.h"
#include "daemon/scheduler/input_gate.h"
#include "daemon/scheduler/op.h"
#include "daemon/session/completion_sink.h"
#include "daemon/session/quota.h"
#include "daemon/session/shm_segment.h"

namespace railyard {

// One rank's accepted submission, alive until its completion is posted.
struct PendingRequest {
  uint64_t request_id = 0;
  int rank = 0;
  std::weak_ptr<CompletionSink> session;  // the rank's Session
  // Owns the sink `session` points to when one wraps the Session's: device staging's
  // (device_staging.h: it copies the results back to the device, then tells the next) and the
  // stream sync's (stream_sync.h: it stores done, then tells the next). Each wrapper owns the one
  // it wraps, if any.
  std::shared_ptr<CompletionSink> sink_owner;
  // SubmitRequest.stream_sync: the operation starts once its stream reached it (stream_sync.h).
  std::optional<StreamSync> sync;
  scheduler::RankRequest req;
  // Keep the mapped buffers alive while the operation may touch them.
  std::shared_ptr<MappedSegment> send_segment;
  std::shared_ptr<MappedSegment> recv_segment;
  // The request's own timeout; zero: CommEnv::op_timeout, which also caps it (TimeoutOf).
  absl::Duration timeout = absl::ZeroDuration();
  // The rank's next submission belongs to the same group (SubmitRequest.group_next).
  bool group_next = false;
  absl::Time deadline = absl::InfiniteFuture();  // set when the communicator accepts it
  // The submitting session's quota (null: not accounted). While the request waits (a collective
  // for the other ranks, a send/recv for its peer) it holds one unit of Resource::kQueuedOps or
  // kQueuedP2p in `waiting`, taken by the communicator when it accepts the request and given
  // back when the operation starts, or when the request is failed or destroyed.
  std::shared_ptr<QuotaAccount> quota;
  QuotaCharge waiting;
  // Device staging still copying this request's device memory into the host memory it now
  // points at (device_staging.h): the operation's steps wait for the bytes they touch.
  std::shared_ptr<scheduler::InputGate> input_gate;
  // With it, device staging copying the results back as the operation writes them.
  std::shared_ptr<scheduler::OutputWatcher> output_watcher;
};

// How long the request may wait and run: its own timeout, never past the daemon's op_timeout
// (--op_timeout caps what a client asks for), which is also what it gets without one.
inline absl::Duration TimeoutOf(const PendingRequest& r, absl::Duration op_timeout) {
  return r.timeout > absl::ZeroDuration() && r.timeout < op_timeout ? r.timeout : op_timeout;
}

// Takes the unit of `r` a request holds while it waits; the refusal names the operation, the rank
// and the communicator, then the limit and its flag (QuotaAccount::Charge).
inline absl::Status TakeWaiting(PendingRequest& request, Resource r, Enforce enforce,
                                const std::string& comm_id) {
  absl::Status s = QuotaCharge::Take(request.quota, r, 1, &request.waiting, enforce);
  if (s.ok()) return s;
  return absl::Status(s.code(),
                      absl::StrCat(scheduler::OpName(request.req.op), " of rank ", request.rank,
                                   " on communicator ", comm_id, " refused: ", s.message()));
}

}  // namespace railyard
