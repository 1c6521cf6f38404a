// Point-to-point of one communicator on this daemon: sends and receives matched per (src, dst)
// channel in MPI's non-overtaking order (P2PChannels). A pair whose ranks both live here is one
// copy plan run on the executor; a send or receive with a rank on another daemon goes straight to
// the transport on the sender's rail, tagged in the receiving daemon's slot, and a receive of
// another length than it expects fails with both sizes. Every wait has its deadline: a side
// whose partner does not come, and a remote transfer that does not complete, fail the
// communicator with DEADLINE_EXCEEDED naming both ranks.
//
// It has no lock of its own: its communicator's lock guards it. Every *Locked method is called,
// and every Host *Locked method is called by it, with that lock held; what must not run under
// it (completions, copies, transport calls) goes into CommOutcomes for the host to deliver.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/comm/comm_outcomes.h"
#include "daemon/comm/p2p_channels.h"
#include "daemon/comm/pending_request.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/scheduler/executor.h"
#include "daemon/scheduler/node_executor.h"
#include "daemon/scheduler/schedule.h"
#include "daemon/util/deadline_timer.h"

namespace railyard {

class PointToPoint {
 public:
  // What it needs from its communicator.
  class Host {
   public:
    virtual ~Host() = default;
    // Runs fn with the communicator's lock held, then delivers what it gathered (without it).
    virtual void WithLock(absl::FunctionRef<void(CommOutcomes*)> fn) = 0;
    virtual bool FailedLocked() const = 0;
    // Fails the communicator (and, through it, everything queued here: DrainLocked).
    virtual void FailLocked(const absl::Status& status, CommOutcomes* out, bool transfers_now) = 0;
    // One pair, or one remote side, finished: the communicator's counters.
    virtual void CountLocked(bool ok, uint64_t bytes_moved) = 0;
    // Expires with the communicator: what timers and transport completions check first. While
    // it can be locked, the PointToPoint it owns is alive too.
    virtual std::weak_ptr<Host> Weak() = 0;
  };

  struct Env {
    std::string comm_id;
    DeadlineTimer* timer = nullptr;
    size_t chunk_bytes = 256 * 1024;
    absl::Duration op_timeout = absl::Seconds(300);  // for requests without their own
    metrics::DaemonMetrics* metrics = nullptr;       // null: not counted
    // Where the ranks live, and the links and tag slots to other daemons (empty on one node).
    const scheduler::CommLayout* layout = nullptr;
    int my_node = 0;
    const scheduler::EndpointTable* endpoints = nullptr;
    const std::vector<uint16_t>* node_slots = nullptr;
  };

  PointToPoint(Env env, Host* host);

  // Accepts a send or receive of a rank of this node (request->req.root is its peer) and returns
  // its sequence number on its channel; errors consume nothing: RESOURCE_EXHAUSTED when its
  // session or job already has as many waiting for their peer as its quota allows (kQueuedP2p),
  // or the channel as many remote posts in flight as a tag can number.
  absl::StatusOr<uint64_t> SubmitLocked(std::unique_ptr<PendingRequest> request, CommOutcomes* out);

  // Everything queued, failed with status (the communicator aborts): how many requests.
  size_t DrainLocked(const absl::Status& status, CommOutcomes* out);

  bool remote_in_flight_locked() const { return remote_in_flight_ > 0; }
  // For CommStats: pairs being copied plus remote transfers, and sides waiting for a partner.
  uint64_t in_flight_locked() const;
  uint64_t queued_locked() const { return channels_.queued(); }
  // See P2PChannels::Involves.
  bool involves_locked(int rank, bool remote) const { return channels_.Involves(rank, remote); }

 private:
  // A matched same-daemon pair being copied.
  struct CopyRun {
    scheduler::Execution exec;
    std::unique_ptr<PendingRequest> send;
    std::unique_ptr<PendingRequest> recv;
    P2PChannels::Key channel;
    uint64_t seq = 0;
    std::shared_ptr<Host> keep;  // keeps the communicator alive while it runs
  };
  // A send or receive with a rank on another daemon, in the transport.
  struct RemoteOp {
    std::unique_ptr<PendingRequest> request;
    uint64_t seq = 0;
    int peer = 0;
    P2PChannels::Key channel;
    DeadlineTimer::Id timer = 0;
    bool done = false;
  };

  int LocalIndex(int rank) const;
  absl::Duration TimeoutOf(const PendingRequest& r) const;
  absl::StatusOr<uint64_t> SubmitRemoteLocked(std::unique_ptr<PendingRequest> request,
                                              CommOutcomes* out);
  // Starts the channel's next matched pair (into out->copies); pairs with nothing to copy, or
  // whose memory kinds differ, complete right here.
  void NextLocked(P2PChannels::Key key, CommOutcomes* out);
  void OnCopyDone(CopyRun* run);
  void OnDeadlineLocked(P2PChannels::Key key, bool send_side, CommOutcomes* out);
  void OnRemoteDoneLocked(RemoteOp& op, absl::Status status, size_t length, CommOutcomes* out);
  void OnRemoteDeadlineLocked(RemoteOp& op, CommOutcomes* out);
  // A remote receive's transport outcome as the client should see it: a message of another
  // size than the receive is the pair's disagreement, named with both sizes.
  absl::Status RemoteRecvStatus(const RemoteOp& op, absl::Status s, size_t length) const;

  const Env env_;
  Host* const host_;
  P2PChannels channels_;
  std::vector<std::unique_ptr<CopyRun>> runs_;  // all ever made, reused
  std::vector<CopyRun*> idle_runs_;
  int remote_in_flight_ = 0;
};

}  // namespace railyard
