// A communicator of one job on this node: its ranks, the merge of their submissions into
// node-level operations, in-order execution, deadlines and failure.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/comm/collective_queue.h"
#include "daemon/comm/comm_outcomes.h"
#include "daemon/comm/digest_exchange.h"
#include "daemon/comm/op_digest.h"
#include "daemon/comm/op_planner.h"
#include "daemon/comm/pending_request.h"
#include "daemon/comm/point_to_point.h"
#include "daemon/comm/residual_store.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/scheduler/cost/tuner.h"
#include "daemon/scheduler/executor.h"
#include "daemon/scheduler/merge.h"
#include "daemon/scheduler/node_executor.h"
#include "daemon/scheduler/op.h"
#include "daemon/scheduler/rail_stall.h"
#include "daemon/scheduler/schedule.h"
#include "daemon/scheduler/tags.h"
#include "daemon/session/completion_sink.h"
#include "daemon/session/shm_segment.h"
#include "daemon/util/deadline_timer.h"
#include "railyard/v1/diagnose.pb.h"

namespace railyard {

// What a communicator needs from the daemon.
struct CommEnv {
  scheduler::Executor* executor = nullptr;
  DeadlineTimer* timer = nullptr;
  size_t chunk_bytes = 256 * 1024;
  absl::Duration op_timeout = absl::Seconds(300);
  absl::Duration init_timeout = absl::Seconds(120);
  // Algorithm for requests that force none (--algo); empty: the tuner's choice.
  std::string default_algo;
  // One-node operations moving at most this many bytes run on the thread that completed them
  // (Executor::RunInlineOrQueue); 0: always on the workers.
  size_t inline_max_bytes = 0;
  // Where finished collectives and failures are counted; null: not measured (unit tests).
  metrics::DaemonMetrics* metrics = nullptr;
};

// What a communicator spanning several daemons needs beyond CommEnv.
struct MultiNodeEnv {
  scheduler::CommLayout layout;
  int my_node = 0;
  std::vector<std::string> node_names;      // by node index, for messages
  std::vector<std::string> node_addresses;  // by node index: Peer service host:port
  // endpoints[node][rail] to the other daemons (null for this node).
  scheduler::EndpointTable endpoints;
  // Tells the other daemons that this communicator failed here (Peer.AbortComm).
  // unrun_seq: the collective this node will not run, nor any later one (AbortCommRequest).
  std::function<void(const absl::Status&, std::optional<uint64_t> unrun_seq)> notify_peers;
  // Tells them that these local ranks left it cleanly (AbortCommRequest.departed_ranks).
  std::function<void(const std::vector<int>&, const absl::Status&)> notify_departed;
  // Picks algorithm and chunk size per operation shape (the coordinator's calibration).
  std::shared_ptr<scheduler::cost::Tuner> tuner;
  // This daemon's slot in its tag namespace for the communicator (held as long as it lives), and
  // every node's, by node index, from the layout (daemon/scheduler/tags.h).
  std::shared_ptr<const scheduler::tags::Slot> tag_slot;
  std::vector<uint16_t> node_slots;
  // links[node][rail]: the metrics of the link to that node on that rail (null for this node, and
  // in tests): where compressed operations count their bytes before and after compression.
  std::vector<std::vector<const metrics::LinkCounters*>> links;
  // Schedules are chunked to at most this (0: as the tuner picks): the smallest
  // NodeInfo.paced_chunk_bytes of the layout's nodes, so that jobs interleave on paced rails.
  size_t max_chunk_bytes = 0;
};

struct CommStats {
  std::string comm_id;
  std::string job;
  int nranks = 0;
  int nnodes = 1;
  int joined = 0;
  std::string state;
  std::string error;
  uint64_t ops_completed = 0;
  uint64_t ops_failed = 0;
  uint64_t bytes_moved = 0;
  uint64_t ops_fused = 0;      // ran fused into an earlier collective of their group
  uint64_t queued_ops = 0;     // collectives and sends/receives accepted, not started
  uint64_t in_flight_ops = 0;  // executing now
  // Collectives some local rank submitted that have not completed, and the oldest one's age
  // (the stall metrics).
  uint64_t pending_collectives = 0;
  absl::Duration oldest_pending = absl::ZeroDuration();
};

// Point-to-point (point_to_point.h) and the digest exchange beside multi-node runs
// (digest_exchange.h) are its parts; it holds the lock, the joins, the collective flow (merge,
// fusing, planning, residuals, the run) and failure.
class Communicator : public std::enable_shared_from_this<Communicator>, private PointToPoint::Host {
 public:
  // How long past its timeout a running multi-node collective waits before it fails here (see
  // NextCollectiveLocked).
  static constexpr absl::Duration kRunDeadlineGrace = absl::Seconds(1);
  using JoinDone = CommJoinDone;

  // A communicator whose ranks all live on this daemon; tuner: its one-node cost model (null:
  // the local plan unless an algorithm is forced).
  Communicator(std::string comm_id, std::string job, int nranks, CommEnv env,
               std::shared_ptr<scheduler::cost::Tuner> tuner = nullptr);
  // A communicator spanning several daemons; this daemon holds the ranks of node net.my_node.
  Communicator(std::string comm_id, std::string job, CommEnv env, MultiNodeEnv net);
  ~Communicator();

  const std::string& comm_id() const { return comm_id_; }
  const std::string& job() const { return job_; }
  int nranks() const { return nranks_; }

  // Adds rank; done(OK) runs for every rank once all have joined, or done(DEADLINE_EXCEEDED)
  // naming the missing ranks when timeout passes first. Immediate errors are returned (and done
  // is not called): INVALID_ARGUMENT for a rank out of range, ALREADY_EXISTS when the rank has
  // joined already, FAILED_PRECONDITION when the communicator failed. resume_seq: the sequence
  // number the rank's next collective had before its daemon restarted (0 for a new member); the
  // communicator's collectives go on from the highest of its local ranks' (first_seq()).
  absl::Status Join(int rank, absl::Duration timeout, JoinDone done, uint64_t resume_seq = 0);
  // The sequence number of the first collective once every rank joined (see Join).
  uint64_t first_seq() const;

  // Accepts a rank's operation and returns its sequence number; the completion is posted to the
  // request's session. Errors are returned immediately and consume nothing: ABORTED when the
  // communicator has failed, FAILED_PRECONDITION before every rank joined, INVALID_ARGUMENT when
  // the request disagrees with other ranks' (which also aborts the communicator) or is an
  // AllToAllv across nodes past OpPlanner::CheckAllToAllvFits, RESOURCE_EXHAUSTED naming the
  // limit and its flag when the request's session or job already has as many collectives queued
  // (not started: Resource::kQueuedOps) or sends/receives waiting for their peer (kQueuedP2p) as
  // its quota allows; the rank's sequence does not advance and the communicator goes on.
  absl::StatusOr<uint64_t> Submit(std::unique_ptr<PendingRequest> request);

  // Submits one session's consecutive requests (a group) under one lock, as Submit each, and
  // only then starts what became runnable: the results, in order.
  std::vector<absl::StatusOr<uint64_t>> SubmitBatch(
      std::vector<std::unique_ptr<PendingRequest>> requests);

  // The rank's process left (destroyed the communicator, disconnected or died). Aborts the
  // communicator for the other ranks with `why` when they are still members, unless the leave is
  // clean: `graceful` (DestroyComm) with nothing of the rank's pending. Then, as NCCL's
  // ncclCommDestroy, what does not need the rank goes on (the other ranks' sends and receives
  // among themselves); a collective waiting, or submitted later, fails with `why` (it needs
  // every rank), and so does a send to it, or a receive from it when it lived on this daemon (one
  // on another daemon may have sent before it left). The other daemons are told.
  void Leave(int rank, const absl::Status& why, bool graceful = false);
  // Another daemon's ranks left cleanly (Peer.AbortComm with departed_ranks), as Leave(graceful).
  // The caller checked that they are that daemon's.
  void RanksDeparted(const std::vector<int>& ranks, const absl::Status& why);

  // Fails every pending operation with status and every later one with ABORTED. Idempotent:
  // the first reason sticks. notify: also tell the other daemons (false when they told us).
  // transfers_now: also fail the running operation's transfers at once (a peer is dead); else
  // the running operation gets a grace period to finish before they are failed.
  // unrun_seq (a peer's notice): the peer will not run that collective nor a later one, so a
  // run of one of them here fails its transfers at once, as transfers_now; and when this node
  // will not run an earlier one (its ranks had not started it), it tells the other daemons so.
  void Abort(const absl::Status& status, bool notify = true, bool transfers_now = true,
             std::optional<uint64_t> unrun_seq = std::nullopt);

  // A rail of the running operation that may have stopped delivering: a transfer on it has
  // waited `timeout` with nothing from its peer on it since (scheduler::FindStalledRail), with
  // the seq running. A link that goes down leaves its TCP connections open and silent, so without
  // this the operation would wait for its deadline (--op_timeout). nullopt: none, nothing runs,
  // failed, one node, or timeout <= 0. A late peer looks the same here: PeerPlane asks the peer's
  // view (diagnose::PeerConfirmsRailStall) before it calls FailStalledRail.
  struct RailSuspect {
    scheduler::RailStall stall;
    uint64_t seq = 0;
  };
  std::optional<RailSuspect> SuspectRail(absl::Duration timeout);
  // Fails the running operation, and so the communicator, with UNAVAILABLE naming the rail, both
  // nodes and the peer's evidence (a phrase after its name), when it still runs suspect.seq and
  // that rail is still silent (checked again now); tells the other daemons, counts it in the
  // link's stalls and sets the link's up gauge to 0. Returns whether it did.
  bool FailStalledRail(const RailSuspect& suspect, absl::Duration timeout,
                       const std::string& evidence);

  bool failed() const;
  // Why it failed (OK while it has not).
  absl::Status error() const;
  // The daemon hands its node over (railyardd --takeover, docs/restarts.md): the collectives
  // every local rank submitted still run, in order; the rest, the sends and receives waiting for
  // their partner, and every later submission go back to their clients untaken (MovedStatus).
  void BeginHandover(const std::string& why);
  // Nothing runs and nothing waits: its ranks' sessions may end.
  bool idle() const;
  bool all_left() const;
  bool multi_node() const { return multi_node_; }
  // The tuner and layout operations are chosen with (the tuner is null for a one-node
  // communicator made without one), and the algorithm --algo forces (empty: none), for railctl
  // explain.
  const std::shared_ptr<scheduler::cost::Tuner>& tuner() const { return net_.tuner; }
  const scheduler::CommLayout& layout() const { return net_.layout; }
  const std::string& forced_algorithm() const { return env_.default_algo; }
  // By node index (empty for a single-node communicator), and this daemon's index.
  const std::vector<std::string>& node_names() const { return net_.node_names; }
  const std::vector<std::string>& node_addresses() const { return net_.node_addresses; }
  int my_node() const { return net_.my_node; }
  // Peer service addresses of the other daemons (empty for a single-node communicator).
  std::vector<std::string> PeerAddresses() const;
  // Those of the other daemons that still have a rank in it (not all departed): whom to
  // heartbeat.
  std::vector<std::string> LivePeerAddresses() const;
  // The node index of rank (multi-node), or -1.
  int NodeOfRank(int rank) const;
  // True when node_name names another node of this (multi-node) communicator, not this daemon's.
  bool HasPeerNode(absl::string_view node_name) const;
  // Name of the node whose Peer service is at address (for messages).
  std::string NodeNameOf(const std::string& address) const;
  // True when rank lives on this daemon and has joined.
  bool HasJoined(int rank) const;
  CommStats Stats() const;
  // Its progress as this daemon sees it (railctl diagnose): ranks' submissions, the front
  // collective, its transfers in flight. Node name and pids are the caller's to fill in.
  v1::CommState ProgressState() const;

 private:
  enum class State { kJoining, kReady, kFailed };

  struct Member {
    bool joined = false;
    bool left = false;
    // Refused the collective a peer's notice was about (noticed_seq_) with the notice's code.
    bool told_failure = false;
    JoinDone join_done;
  };

  using Outcomes = CommOutcomes;

  // PointToPoint::Host.
  void WithLock(absl::FunctionRef<void(CommOutcomes*)> fn) override;
  bool FailedLocked() const override;
  void FailLocked(const absl::Status& status, CommOutcomes* out, bool transfers_now) override;
  void CountLocked(bool ok, uint64_t bytes_moved) override;
  std::weak_ptr<PointToPoint::Host> Weak() override;

  absl::StatusOr<uint64_t> SubmitLocked(std::unique_ptr<PendingRequest> request, Outcomes* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint64_t> SubmitCollectiveLocked(std::unique_ptr<PendingRequest> request,
                                                  Outcomes* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Prepares the next collective when it is complete and none runs (into out->collective, to be
  // started outside the lock). Operations without steps complete right here.
  void NextCollectiveLocked(Outcomes* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnCollectiveDone(const absl::Status& status);
  // True when every local rank said its next submission after e's belongs to the same group.
  bool GroupContinuesLocked(const CollectiveQueue::Entry& e) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends to collective_exec_ the rest of the front entry's group that can run with it (one
  // node, complete, same dtype and red_op, small in all); returns how many entries it took.
  size_t FuseGroupLocked(size_t chunk_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnRunDeadline(uint64_t seq, absl::Duration limit);
  // Local index of a global rank of this node, or -1.
  int LocalIndex(int rank) const;
  // Points node_run_'s memory at the front slot's buffers for the planned schedule.
  void PrepareNodeRunLocked(const PlannedOp& plan, float* residual)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A compressed run's bytes before and after compression, per link (MultiNodeEnv::links).
  void CountCompressedBytesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The metrics of the link to `node` on `rail` (MultiNodeEnv::links); null when there are none
  // (this node, tests) or either index is out of range.
  const metrics::LinkCounters* LinkAt(int node, int rail) const;
  void OnOpDeadline(uint64_t seq);
  void OnJoinDeadline();
  void AbortLocked(const absl::Status& status, Outcomes* out, bool transfers_now = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rank left cleanly: recorded, and what can no longer complete fails (see Leave).
  void DepartLocked(int rank, const absl::Status& why, Outcomes* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when local rank li has a collective or a send/receive not yet completed.
  bool PendingLocked(int li) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the transfers of the running multi-node operation (if one still runs).
  void AbortTransfers(const absl::Status& status);
  // AbortTransfers once `grace` has passed: the running operation may still complete, or a
  // better reason to fail it arrive.
  void AbortTransfersAfterGrace(const absl::Status& status, absl::Duration grace);
  absl::Duration TimeoutOf(const PendingRequest& r) const;
  // Posts completions, runs join callbacks and starts prepared executions. Without the lock.
  void Deliver(Outcomes& out);

  const std::string comm_id_;
  const std::string job_;
  const int nranks_;  // global
  const CommEnv env_;
  const bool multi_node_;
  MultiNodeEnv net_;              // layout of a multi-node comm; trivial one-node layout otherwise
  std::vector<int> local_ranks_;  // global rank of each local index
  // Chooses and caches what runs each collective (tuner, forced algorithm, schedule cache).
  OpPlanner planner_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kJoining;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  // Failed by a peer's notice (Abort with notify false): the collective it is about, the front
  // of the queue then. A rank that submits it only afterwards fails with a disagreement's
  // INVALID_ARGUMENT, as the ranks that had queued it did. Never matches otherwise.
  uint64_t noticed_seq_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;
  std::vector<Member> members_ ABSL_GUARDED_BY(mu_);
  // By global rank: left cleanly (Leave graceful, RanksDeparted); the first one's why.
  std::vector<bool> departed_ ABSL_GUARDED_BY(mu_);
  absl::Status departure_ ABSL_GUARDED_BY(mu_);
  int joined_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t first_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::string handover_ ABSL_GUARDED_BY(mu_);  // BeginHandover's why; empty: not handing over  //
                                               // the highest resume_seq of a joined rank
  DeadlineTimer::Id join_timer_ ABSL_GUARDED_BY(mu_) = 0;

  // Collectives by sequence number, merged across the local ranks.
  CollectiveQueue collectives_ ABSL_GUARDED_BY(mu_);
  bool collective_running_ ABSL_GUARDED_BY(mu_) = false;
  bool batching_ ABSL_GUARDED_BY(mu_) = false;  // SubmitBatch: start nothing until all are in
  scheduler::Execution collective_exec_;        // owned by the running collective while it runs
  size_t fused_ = 1;                            // front entries the running execution completes
  std::shared_ptr<Communicator> running_self_ ABSL_GUARDED_BY(mu_);
  // Collectives run by schedule: the front slot's schedule (cached by the planner), memory and
  // run (reused).
  std::shared_ptr<const scheduler::NodeSchedule> node_schedule_;
  scheduler::RankMemory node_memory_;
  std::vector<std::byte> scratch_;  // per-rank scratch, grown when a schedule needs more
  scheduler::NodeRun node_run_;
  uint64_t node_run_seq_ = 0;
  DeadlineTimer::Id run_timer_ ABSL_GUARDED_BY(mu_) = 0;
  // Error-feedback residuals by compression_key (compressed AllReduce), released with the
  // communicator; the running compressed operation's codec and residual (null: no feedback).
  ResidualStore residuals_ ABSL_GUARDED_BY(mu_);
  kernels::Codec node_codec_;
  float* node_residual_ = nullptr;
  kernels::DataType node_dtype_ = kernels::DataType::kFloat32;
  kernels::RedOp node_red_op_ = kernels::RedOp::kSum;

  PointToPoint p2p_ ABSL_GUARDED_BY(mu_);

  // The running collective, for its metrics: when it started and by which algorithm.
  absl::Time run_started_ ABSL_GUARDED_BY(mu_);
  std::string run_algorithm_ ABSL_GUARDED_BY(mu_);
  // Records a finished collective of the front slot (before it is popped).
  void RecordCollectiveLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Requests accepted (Submit, SubmitBatch) and completions posted (Deliver): idle() only once
  // every accepted one's completion has reached its session.
  uint64_t accepted_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> posted_{0};
  uint64_t ops_completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ops_failed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_moved_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ops_fused_ ABSL_GUARDED_BY(mu_) = 0;
  // The running operation's device staging still in progress (PendingRequest::input_gate), for
  // NodeRun::Params::gates (with any, this node's sends ride in no digest), and its outputs'
  // watchers, for Params::outputs.
  std::vector<std::shared_ptr<scheduler::InputGate>> node_gates_;
  std::vector<std::shared_ptr<scheduler::OutputWatcher>> node_outputs_;
  // The digests beside a multi-node run, and the join of the run with them (after node_run_).
  DigestExchange digests_;
  // The front collective as it was when the communicator failed (railctl diagnose).
  std::unique_ptr<v1::OpProgress> failed_op_ ABSL_GUARDED_BY(mu_);
  // net_.node_names[node], or "node N" when the layout has no name for it.
  std::string NodeName(int node) const;
  // The front collective's progress now.
  v1::OpProgress FrontProgressLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace railyard
