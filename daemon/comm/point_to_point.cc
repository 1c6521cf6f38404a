#include "daemon/comm/point_to_point.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/scheduler/local_plan.h"
#include "daemon/scheduler/tags.h"

namespace railyard {

using scheduler::OpKind;

PointToPoint::PointToPoint(Env env, Host* host)
    : env_(std::move(env)), host_(host), channels_(env_.comm_id) {}

int PointToPoint::LocalIndex(int rank) const {
  const auto& mine = env_.layout->ranks_of_node[env_.my_node];
  auto it = std::find(mine.begin(), mine.end(), rank);
  return it == mine.end() ? -1 : static_cast<int>(it - mine.begin());
}

absl::Duration PointToPoint::TimeoutOf(const PendingRequest& r) const {
  return railyard::TimeoutOf(r, env_.op_timeout);
}

uint64_t PointToPoint::in_flight_locked() const {
  return channels_.busy() + static_cast<uint64_t>(remote_in_flight_);
}

absl::StatusOr<uint64_t> PointToPoint::SubmitLocked(std::unique_ptr<PendingRequest> request,
                                                    CommOutcomes* out) {
  const bool is_send = request->req.op == OpKind::kSend;
  const int rank = request->rank;
  const int peer = request->req.root;
  if (LocalIndex(peer) < 0) {
    // Waits for a peer on another daemon, as far as this one knows.
    if (absl::Status s =
            TakeWaiting(*request, Resource::kQueuedP2p, Enforce::kSessionAndJob, env_.comm_id);
        !s.ok()) {
      return s;
    }
    return SubmitRemoteLocked(std::move(request), out);
  }
  const P2PChannels::Key key = is_send ? std::make_pair(rank, peer) : std::make_pair(peer, rank);
  if (channels_.HasPartner(key, is_send)) {
    // Its partner waits for it: never refused (the partner's charge bounds it), counted until
    // it is matched.
    request->waiting = QuotaCharge::TakePastLimit(request->quota, Resource::kQueuedP2p, /*n=*/1);
  } else if (absl::Status s =
                 TakeWaiting(*request, Resource::kQueuedP2p, Enforce::kSessionAndJob, env_.comm_id);
             !s.ok()) {
    return s;
  }
  std::weak_ptr<Host> weak = host_->Weak();
  const DeadlineTimer::Id timer =
      env_.timer->Schedule(request->deadline, [this, weak, key, is_send] {
        if (auto host = weak.lock()) {
          host->WithLock([&](CommOutcomes* o) { OnDeadlineLocked(key, is_send, o); });
        }
      });
  const uint64_t seq = channels_.Queue(key, is_send, std::move(request), timer);
  NextLocked(key, out);
  return seq;
}

void PointToPoint::NextLocked(P2PChannels::Key key, CommOutcomes* out) {
  while (!host_->FailedLocked()) {
    absl::StatusOr<std::optional<P2PChannels::Match>> next = channels_.Next(key);
    if (!next.ok()) {
      if (env_.metrics != nullptr) env_.metrics->CountDesync();
      host_->FailLocked(next.status(), out, /*transfers_now=*/false);
      return;
    }
    if (!next->has_value()) return;
    P2PChannels::Match& m = **next;
    CopyRun* run;
    if (idle_runs_.empty()) {
      runs_.push_back(std::make_unique<CopyRun>());
      run = runs_.back().get();
      run->exec.on_done = [this, run] { OnCopyDone(run); };
    } else {
      run = idle_runs_.back();
      idle_runs_.pop_back();
    }
    env_.timer->Cancel(m.send_timer);
    env_.timer->Cancel(m.recv_timer);
    run->send = std::move(m.send);
    run->recv = std::move(m.recv);
    run->send->waiting.Reset();  // matched: neither waits for its peer any more
    run->recv->waiting.Reset();
    run->channel = key;
    run->seq = m.seq;
    const uint64_t bytes = run->send->req.count * kernels::ElementSize(run->send->req.dtype);
    absl::Status done_now;  // OK: nothing to copy; else why it cannot be
    bool copy = false;
    if ((run->send->req.device >= 0) != (run->recv->req.device >= 0) && bytes > 0) {
      done_now = absl::InvalidArgumentError(
          absl::StrCat("send/recv on communicator ", env_.comm_id, ": rank ", key.first,
                       " sends from ", scheduler::MemoryName(run->send->req.device), ", rank ",
                       key.second, " receives into ", scheduler::MemoryName(run->recv->req.device),
                       " (both ends on one node must be host memory, or both device memory)"));
    } else {
      scheduler::BuildCopyPlan(run->send->req.send, run->recv->req.recv, bytes, env_.chunk_bytes,
                               &run->exec.plan, run->recv->req.device);
      copy = !run->exec.plan.steps.empty();
    }
    if (copy) {
      run->keep = host_->Weak().lock();
      out->copies.push_back(&run->exec);
      return;
    }
    out->completions.push_back({std::move(run->send), done_now, run->seq});
    out->completions.push_back({std::move(run->recv), done_now, run->seq});
    host_->CountLocked(done_now.ok(), 0);
    idle_runs_.push_back(run);
    channels_.Done(key);
  }
}

void PointToPoint::OnCopyDone(CopyRun* run) {
  std::shared_ptr<Host> keep = std::move(run->keep);
  keep->WithLock([&](CommOutcomes* out) {
    const absl::Status status = run->exec.status;  // a device copy can fail
    out->completions.push_back({std::move(run->send), status, run->seq});
    out->completions.push_back({std::move(run->recv), status, run->seq});
    host_->CountLocked(status.ok(), status.ok() ? run->exec.plan.bytes_moved : 0);
    channels_.Done(run->channel);
    idle_runs_.push_back(run);
    NextLocked(run->channel, out);
  });
}

void PointToPoint::OnDeadlineLocked(P2PChannels::Key key, bool send_side, CommOutcomes* out) {
  if (host_->FailedLocked()) return;
  const PendingRequest* front = channels_.Front(key, send_side);
  if (front == nullptr || front->deadline > env_.timer->Now()) return;
  const int waiting = send_side ? key.first : key.second;
  const int missing = send_side ? key.second : key.first;
  host_->FailLocked(
      absl::DeadlineExceededError(absl::StrCat(
          send_side ? "send" : "recv", " of rank ", waiting, " on communicator ", env_.comm_id,
          ": rank ", missing, " did not post the matching ", send_side ? "recv" : "send",
          " within ", absl::FormatDuration(TimeoutOf(*front)))),
      out, /*transfers_now=*/false);
}

absl::StatusOr<uint64_t> PointToPoint::SubmitRemoteLocked(std::unique_ptr<PendingRequest> request,
                                                          CommOutcomes* out) {
  const bool is_send = request->req.op == OpKind::kSend;
  const int rank = request->rank;
  const int peer = request->req.root;
  const int src = is_send ? rank : peer;
  const int dst = is_send ? peer : rank;
  const scheduler::CommLayout& layout = *env_.layout;
  const int peer_node = layout.node_of_rank[peer];
  // Rail alignment: both sides use the sender's rail.
  const int rail = layout.rail_of_rank(src);
  std::shared_ptr<transport::Endpoint> ep;
  if (env_.endpoints != nullptr && static_cast<size_t>(peer_node) < env_.endpoints->size() &&
      static_cast<size_t>(rail) < (*env_.endpoints)[peer_node].size()) {
    ep = (*env_.endpoints)[peer_node][rail];
  }
  if (ep == nullptr) {
    return absl::InternalError(absl::StrCat("no endpoint to node ", peer_node, " rail ", rail));
  }
  const size_t dst_node = static_cast<size_t>(layout.node_of_rank[dst]);
  if (env_.node_slots == nullptr || dst_node >= env_.node_slots->size()) {
    return absl::InternalError(absl::StrCat("no tag slot for node ", dst_node));
  }
  absl::StatusOr<uint64_t> post =
      channels_.PostRemote({src, dst}, scheduler::tags::kMaxP2pInFlight);
  if (!post.ok()) {
    return absl::Status(post.status().code(),
                        absl::StrCat(scheduler::OpName(request->req.op), " of rank ", rank,
                                     " with rank ", peer, ": ", post.status().message()));
  }
  auto op = std::make_shared<RemoteOp>();
  op->seq = *post;
  op->peer = peer;
  op->channel = {src, dst};
  // The receiving daemon's slot; the point-to-point layout never equals a collective tag.
  const transport::Tag tag =
      scheduler::tags::PointToPointTag((*env_.node_slots)[dst_node], src, dst, op->seq);
  const uint64_t bytes = request->req.count * kernels::ElementSize(request->req.dtype);
  std::byte* data = is_send ? request->req.send : request->req.recv;
  std::weak_ptr<Host> weak = host_->Weak();
  op->timer = env_.timer->Schedule(request->deadline, [this, weak, op] {
    if (auto host = weak.lock()) {
      host->WithLock([&](CommOutcomes* o) { OnRemoteDeadlineLocked(*op, o); });
    }
  });
  op->request = std::move(request);
  ++remote_in_flight_;
  auto done = [this, weak, op](absl::Status st, size_t length) {
    if (auto host = weak.lock()) {
      host->WithLock([&](CommOutcomes* o) { OnRemoteDoneLocked(*op, std::move(st), length, o); });
    }
  };
  out->transport_posts.push_back([ep, is_send, tag, data, bytes, done] {
    if (is_send) {
      ep->Send(tag, data, bytes, [done](absl::Status s) { done(std::move(s), 0); });
    } else {
      const transport::Segment segment{data, bytes};
      ep->RecvV(tag, &segment, 1, done);
    }
  });
  return op->seq;
}

absl::Status PointToPoint::RemoteRecvStatus(const RemoteOp& op, absl::Status s,
                                            size_t length) const {
  // The sending daemon's send has no size check against the receive (only this side knows both
  // sizes), so a message of another length is the clients' disagreement, reported as on one
  // node (P2PChannels::Next), with the size that arrived.
  const scheduler::RankRequest& req = op.request->req;
  const uint64_t bytes = req.count * kernels::ElementSize(req.dtype);
  const auto wants = [&] {
    return absl::StrCat("rank ", op.request->rank, ", which receives ", req.count, " x ",
                        std::string(kernels::Name(req.dtype)), " (", bytes, " bytes)");
  };
  const auto mismatch = [&] {
    return absl::StrCat("send/recv size mismatch on communicator ", env_.comm_id, " (pair seq ",
                        op.seq, "): rank ", op.peer);
  };
  if (s.ok() && length != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(mismatch(), " sent ", length, " bytes to ", wants()));
  }
  if (absl::IsOutOfRange(s)) {
    return absl::InvalidArgumentError(
        absl::StrCat(mismatch(), " sent more than ", bytes, " bytes to ", wants()));
  }
  if (absl::IsPermissionDenied(s)) {
    // A framed link tells a member's message of another length from a foreign one only for a
    // shorter one-message frame (its trailer arrives whole); otherwise it reports the second
    // (docs/data-plane.md, "The frame"). Name the first too.
    return absl::PermissionDeniedError(
        absl::StrCat(s.message(), "; a send from rank ", op.peer, " of another size than the ",
                     bytes, " bytes expected by ", wants(), " ends it alike"));
  }
  return s;
}

void PointToPoint::OnRemoteDoneLocked(RemoteOp& op, absl::Status status, size_t length,
                                      CommOutcomes* out) {
  if (op.done) return;
  op.done = true;
  --remote_in_flight_;
  channels_.RemoteDone(op.channel);
  env_.timer->Cancel(op.timer);
  if (op.request->req.op == OpKind::kRecv) {
    status = RemoteRecvStatus(op, std::move(status), length);
  }
  absl::Status result = status;
  if (!status.ok()) {
    result = absl::Status(status.code(), absl::StrCat(scheduler::OpName(op.request->req.op),
                                                      " of rank ", op.request->rank, " with rank ",
                                                      op.peer, ": ", status.message()));
    host_->CountLocked(false, 0);
    host_->FailLocked(result, out, /*transfers_now=*/true);
  } else {
    host_->CountLocked(true, 0);
  }
  out->completions.push_back({std::move(op.request), result, op.seq});
}

void PointToPoint::OnRemoteDeadlineLocked(RemoteOp& op, CommOutcomes* out) {
  if (op.done) return;
  // Failing the transfers completes op (and every other one in flight) with this status.
  host_->FailLocked(absl::DeadlineExceededError(absl::StrCat(
                        scheduler::OpName(op.request->req.op), " of rank ", op.request->rank,
                        " with rank ", op.peer, " on communicator ", env_.comm_id,
                        " did not complete within ", absl::FormatDuration(TimeoutOf(*op.request)))),
                    out, /*transfers_now=*/true);
}

size_t PointToPoint::DrainLocked(const absl::Status& status, CommOutcomes* out) {
  P2PChannels::Drained drained = channels_.DrainAll();
  for (DeadlineTimer::Id id : drained.timers) env_.timer->Cancel(id);
  for (auto& [seq, r] : drained.requests) out->completions.push_back({std::move(r), status, seq});
  return drained.requests.size();
}

}  // namespace railyard
