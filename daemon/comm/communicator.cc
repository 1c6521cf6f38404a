#include "daemon/comm/communicator.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "daemon/scheduler/local_plan.h"
#include "daemon/util/log.h"

namespace railyard {

using scheduler::OpKind;

namespace {
// How long a running multi-node operation may still finish after its communicator was aborted
// for a reason other than a dead peer.
constexpr absl::Duration kTransferGrace = absl::Seconds(2);
// The same for a run whose own step failed with UNAVAILABLE (a peer's endpoint closed or broke:
// the peer died, or aborted its side). Long enough for the peer's own reason to arrive over the
// peer plane (milliseconds), short enough that survivors of a dead node do not wait the full
// grace: with 4 nodes a node the dead one was not sending to waited 2 s for the others to give up.
constexpr absl::Duration kBrokenLinkGrace = absl::Milliseconds(250);

}  // namespace

Communicator::Communicator(std::string comm_id, std::string job, int nranks, CommEnv env,
                           std::shared_ptr<scheduler::cost::Tuner> tuner)
    : Communicator(std::move(comm_id), std::move(job), std::move(env),
                   MultiNodeEnv{scheduler::CommLayout::Uniform(1, nranks, 1),
                                0,
                                {},
                                {},
                                {},
                                {},
                                {},
                                std::move(tuner),
                                nullptr,
                                {},
                                {}}) {}

Communicator::Communicator(std::string comm_id, std::string job, CommEnv env, MultiNodeEnv net)
    : comm_id_(std::move(comm_id)),
      job_(std::move(job)),
      nranks_(net.layout.nranks),
      env_(std::move(env)),
      multi_node_(net.layout.nnodes > 1),
      net_(std::move(net)),
      local_ranks_(net_.layout.ranks_of_node[net_.my_node]),
      planner_(net_.layout, net_.my_node, net_.tuner, env_.default_algo, env_.chunk_bytes,
               net_.max_chunk_bytes),
      collectives_(&local_ranks_),
      p2p_(PointToPoint::Env{comm_id_, env_.timer, env_.chunk_bytes, env_.op_timeout, env_.metrics,
                             &net_.layout, net_.my_node, &net_.endpoints, &net_.node_slots},
           this),
      digests_(DigestExchange::Env{comm_id_, job_, &net_.layout, net_.my_node, &net_.endpoints,
                                   &net_.node_slots, &net_.node_names, &node_run_,
                                   [this](const absl::Status& s) { AbortTransfers(s); },
                                   [this](const absl::Status& s) { OnCollectiveDone(s); }}) {
  members_.resize(local_ranks_.size());
  departed_.assign(static_cast<size_t>(nranks_), false);
  collective_exec_.on_done = [this] { OnCollectiveDone(collective_exec_.status); };
}

int Communicator::LocalIndex(int rank) const {
  if (rank < 0 || rank >= nranks_ || net_.layout.node_of_rank[rank] != net_.my_node) return -1;
  return net_.layout.local_index_of_rank[rank];
}

std::vector<std::string> Communicator::PeerAddresses() const {
  std::vector<std::string> out;
  for (int n = 0; n < static_cast<int>(net_.node_addresses.size()); ++n) {
    if (n != net_.my_node) out.push_back(net_.node_addresses[n]);
  }
  return out;
}

std::vector<std::string> Communicator::LivePeerAddresses() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (int n = 0; n < static_cast<int>(net_.node_addresses.size()); ++n) {
    if (n == net_.my_node) continue;
    bool live = false;
    for (int r : net_.layout.ranks_of_node[n]) live |= !departed_[static_cast<size_t>(r)];
    if (live) out.push_back(net_.node_addresses[n]);
  }
  return out;
}

int Communicator::NodeOfRank(int rank) const {
  if (!multi_node_ || rank < 0 || rank >= nranks_) return -1;
  return net_.layout.node_of_rank[rank];
}

bool Communicator::HasPeerNode(absl::string_view node_name) const {
  for (int n = 0; n < static_cast<int>(net_.node_names.size()); ++n) {
    if (n != net_.my_node && net_.node_names[n] == node_name) return true;
  }
  return false;
}

std::string Communicator::NodeNameOf(const std::string& address) const {
  for (size_t n = 0; n < net_.node_addresses.size(); ++n) {
    if (net_.node_addresses[n] == address && n < net_.node_names.size()) return net_.node_names[n];
  }
  return address;
}

bool Communicator::HasJoined(int rank) const {
  absl::MutexLock lock(&mu_);
  const int li = LocalIndex(rank);
  return li >= 0 && members_[li].joined;
}

Communicator::~Communicator() = default;

absl::Duration Communicator::TimeoutOf(const PendingRequest& r) const {
  return railyard::TimeoutOf(r, env_.op_timeout);
}

uint64_t Communicator::first_seq() const {
  absl::MutexLock lock(&mu_);
  return first_seq_;
}

absl::Status Communicator::Join(int rank, absl::Duration timeout, JoinDone done,
                                uint64_t resume_seq) {
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    if (rank < 0 || rank >= nranks_) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " not in [0, ", nranks_, ") of communicator ", comm_id_));
    }
    if (state_ == State::kFailed) {
      return absl::FailedPreconditionError(
          absl::StrCat("communicator ", comm_id_, " has failed: ", error_.message()));
    }
    const int li = LocalIndex(rank);
    if (li < 0) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of communicator ", comm_id_,
                                                     " does not live on this daemon"));
    }
    if (members_[li].joined) {
      return absl::AlreadyExistsError(
          absl::StrCat("rank ", rank, " has already joined communicator ", comm_id_));
    }
    members_[li].joined = true;
    members_[li].join_done = std::move(done);
    first_seq_ = std::max(first_seq_, resume_seq);
    if (++joined_ == 1) {
      std::weak_ptr<Communicator> weak = weak_from_this();
      join_timer_ = env_.timer->Schedule(env_.timer->Now() + timeout, [weak] {
        if (auto self = weak.lock()) self->OnJoinDeadline();
      });
    }
    if (joined_ == static_cast<int>(local_ranks_.size())) {
      state_ = State::kReady;
      collectives_.Rebase(first_seq_);
      env_.timer->Cancel(join_timer_);
      for (auto& m : members_) out.joins.push_back(std::move(m.join_done));
      out.join_status = absl::OkStatus();
    }
  }
  Deliver(out);
  return absl::OkStatus();
}

void Communicator::OnJoinDeadline() {
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kJoining) return;
    std::vector<int> missing;
    for (size_t li = 0; li < members_.size(); ++li) {
      if (!members_[li].joined) missing.push_back(local_ranks_[li]);
    }
    AbortLocked(absl::DeadlineExceededError(absl::StrCat(
                    "communicator ", comm_id_, ": rank", missing.size() > 1 ? "s " : " ",
                    absl::StrJoin(missing, ", "), " of ", nranks_, " did not join in time")),
                &out);
  }
  Deliver(out);
}

absl::StatusOr<uint64_t> Communicator::Submit(std::unique_ptr<PendingRequest> request) {
  Outcomes out;
  absl::StatusOr<uint64_t> result;
  {
    absl::MutexLock lock(&mu_);
    result = SubmitLocked(std::move(request), &out);
    if (result.ok()) ++accepted_;
  }
  Deliver(out);
  return result;
}

std::vector<absl::StatusOr<uint64_t>> Communicator::SubmitBatch(
    std::vector<std::unique_ptr<PendingRequest>> requests) {
  Outcomes out;
  std::vector<absl::StatusOr<uint64_t>> results;
  results.reserve(requests.size());
  {
    absl::MutexLock lock(&mu_);
    // Queued first, started after: a group whose last rank submits it all at once runs fused.
    batching_ = true;
    for (auto& r : requests) {
      results.push_back(SubmitLocked(std::move(r), &out));
      if (results.back().ok()) ++accepted_;
    }
    batching_ = false;
    NextCollectiveLocked(&out);
  }
  Deliver(out);
  return results;
}

void Communicator::BeginHandover(const std::string& why) {
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    handover_ = why.empty() ? std::string("railyardd is handing over") : why;
    const absl::Status moved = MovedStatus(handover_);
    CollectiveQueue::Drained drained = collectives_.DrainFrom(collectives_.CompletePrefix());
    for (DeadlineTimer::Id id : drained.timers) env_.timer->Cancel(id);
    for (auto& [seq, r] : drained.requests) out.completions.push_back({std::move(r), moved, seq});
    p2p_.DrainLocked(moved, &out);
  }
  Deliver(out);
}

bool Communicator::idle() const {
  absl::MutexLock lock(&mu_);
  // Every accepted request's completion posted too: a collective is popped (and the queue
  // empty) before its completions leave Deliver, and a session closed in between loses them.
  return !collective_running_ && collectives_.empty() && p2p_.in_flight_locked() == 0 &&
         p2p_.queued_locked() == 0 && posted_.load() >= accepted_;
}

absl::StatusOr<uint64_t> Communicator::SubmitLocked(std::unique_ptr<PendingRequest> request,
                                                    Outcomes* out) {
  {
    if (!handover_.empty()) return MovedStatus(handover_);
    if (state_ == State::kFailed) {
      // A peer's notice can fail the communicator before this rank submits the very collective
      // it is about (another node found a disagreement first): that one fails, once, as the
      // queued ones did, so a disagreement is INVALID_ARGUMENT on every rank. Anything else
      // (a deadline this rank missed, a dead peer), and everything after, is ABORTED.
      const int li = LocalIndex(request->rank);
      const bool the_failed_one = li >= 0 && !scheduler::IsPointToPoint(request->req.op) &&
                                  error_.code() == absl::StatusCode::kInvalidArgument &&
                                  !members_[li].told_failure &&
                                  collectives_.submitted(li) == noticed_seq_;
      if (the_failed_one) members_[li].told_failure = true;
      return absl::Status(
          the_failed_one ? error_.code() : absl::StatusCode::kAborted,
          absl::StrCat("communicator ", comm_id_, " was aborted: ", error_.message()));
    }
    if (state_ == State::kJoining) {
      return absl::FailedPreconditionError(
          absl::StrCat("communicator ", comm_id_, " is still waiting for ranks to join"));
    }
    const int li = LocalIndex(request->rank);
    if (li < 0 || members_[li].left) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", request->rank, " has left communicator ", comm_id_));
    }
    if (!departure_.ok()) {
      // A rank left cleanly (see Leave): a collective needs it; a send or receive only its peer.
      if (!scheduler::IsPointToPoint(request->req.op)) {
        AbortLocked(departure_, out);
        return absl::AbortedError(
            absl::StrCat("communicator ", comm_id_, " was aborted: ", departure_.message()));
      }
      // A send to it is never received. A receive from it is refused only when it lived here:
      // its sends were matched before it left. One on another daemon may have sent before it
      // left, and the data may still be on its way.
      const int peer = request->req.root;
      const bool is_send = request->req.op == OpKind::kSend;
      if (peer >= 0 && peer < nranks_ && departed_[static_cast<size_t>(peer)] &&
          (is_send || LocalIndex(peer) >= 0)) {
        return absl::AbortedError(absl::StrCat(scheduler::OpName(request->req.op), " of rank ",
                                               request->rank, " with rank ", peer, ": rank ", peer,
                                               " has left communicator ", comm_id_));
      }
    }
    if (multi_node_ && request->req.op == OpKind::kAllToAllv) {
      // Refused here, before anything is queued, rather than failed when it would be planned.
      if (absl::Status s = OpPlanner::CheckAllToAllvFits(nranks_); !s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat("alltoallv of rank ", request->rank, " on communicator ",
                                         comm_id_, ": ", s.message()));
      }
    }
    request->deadline = env_.timer->Now() + TimeoutOf(*request);
    if (scheduler::IsPointToPoint(request->req.op)) {
      return p2p_.SubmitLocked(std::move(request), out);
    }
    return SubmitCollectiveLocked(std::move(request), out);
  }
}

absl::StatusOr<uint64_t> Communicator::SubmitCollectiveLocked(
    std::unique_ptr<PendingRequest> request, Outcomes* out) {
  const int rank = LocalIndex(request->rank);
  const OpKind op = request->req.op;
  const absl::Time deadline = request->deadline;
  // Over its quota the request is refused before it is queued: its rank's sequence number stays.
  // The last local rank to submit a sequence number is what the others wait for: only its own
  // session's backlog may hold it back, never its job's (which the ranks ahead of it fill).
  const Enforce enforce =
      collectives_.CompletesNext(rank) ? Enforce::kSessionOnly : Enforce::kSessionAndJob;
  if (absl::Status s = TakeWaiting(*request, Resource::kQueuedOps, enforce, comm_id_); !s.ok()) {
    return s;
  }
  CollectiveQueue::Added added;
  if (absl::Status s = collectives_.Add(rank, std::move(request), &added); !s.ok()) {
    if (env_.metrics != nullptr) env_.metrics->CountDesync();
    const absl::Status why(
        s.code(), absl::StrCat(scheduler::OpName(op), " seq ", added.seq, " on communicator ",
                               comm_id_, ": ", s.message()));
    AbortLocked(why, out);
    return why;
  }
  const uint64_t seq = added.seq;
  CollectiveQueue::Entry& entry = *added.entry;
  if (added.first) {
    std::weak_ptr<Communicator> weak = weak_from_this();
    entry.timer = env_.timer->Schedule(deadline, [weak, seq] {
      if (auto self = weak.lock()) self->OnOpDeadline(seq);
    });
  }
  if (added.complete) {
    env_.timer->Cancel(entry.timer);
    if (absl::Status s = entry.merge.CheckComplete(); !s.ok()) {
      if (env_.metrics != nullptr) env_.metrics->CountDesync();
      AbortLocked(absl::Status(s.code(), absl::StrCat("seq ", seq, " on communicator ", comm_id_,
                                                      ": ", s.message())),
                  out);
      return seq;
    }
    if (!batching_) NextCollectiveLocked(out);
  }
  return seq;
}

void Communicator::NextCollectiveLocked(Outcomes* out) {
  while (!collective_running_ && state_ != State::kFailed && collectives_.front_complete()) {
    CollectiveQueue::Entry& slot = collectives_.front();
    const uint64_t base_seq = collectives_.front_seq();
    // It stops waiting now (it runs, completes or fails below): its ranks' sessions may queue more.
    for (auto& r : slot.requests) r->waiting.Reset();
    const scheduler::RankRequest& r0 = slot.requests[0]->req;
    // One path for one node and many: forced algorithm or tuner, then a local plan or a schedule.
    absl::StatusOr<PlannedOp> plan = planner_.Plan(slot.merge.requests());
    // Error feedback: the key's residual, charged to the first local rank's session.
    float* residual = nullptr;
    if (plan.ok() && plan->codec.kind != kernels::CodecKind::kNone && r0.error_feedback) {
      absl::StatusOr<float*> e = residuals_.Get(
          r0.feedback_key, plan->codec, plan->schedule->residual_elems, slot.requests[0]->quota);
      if (e.ok()) {
        residual = *e;
      } else {
        plan = e.status();
      }
    }
    if (!plan.ok()) {
      // Every daemon derives the same outcome from the same inputs: failing here is consistent.
      const absl::Status why(
          plan.status().code(),
          absl::StrCat(scheduler::OpName(r0.op), " seq ", base_seq, " on communicator ", comm_id_,
                       ": ", plan.status().message()));
      for (auto& r : slot.requests) out->completions.push_back({std::move(r), why, base_seq});
      ++ops_failed_;
      collectives_.PopFront();
      continue;
    }
    run_started_ = absl::Now();
    run_algorithm_ = plan->algorithm;
    if (env_.metrics != nullptr && plan->predicted_s >= 0) {
      env_.metrics->SetModelPrediction(
          std::string(scheduler::OpName(r0.op)), plan->algorithm,
          static_cast<uint64_t>(scheduler::MessageBytes(r0.op, r0.dtype, r0.count, nranks_)), job_,
          plan->predicted_s);
    }
    if (!plan->local()) {
      collective_exec_.plan.Clear();  // bytes_moved counts local plans only
      PrepareNodeRunLocked(*plan, residual);
      collective_running_ = true;
      running_self_ = shared_from_this();
      out->start_node_run = true;
      if (multi_node_) {
        // A running operation waits on other daemons, which may never send (their ranks
        // submitted something else, or stalled): bound it like everything else.
        std::weak_ptr<Communicator> weak = weak_from_this();
        const uint64_t seq = base_seq;
        const absl::Duration limit = TimeoutOf(*slot.requests[0]);
        // A grace past the limit: when another node's ranks did not submit, that node's own
        // deadline fires first and its abort, which names them, reaches the ranks here instead
        // of this less precise one.
        run_timer_ =
            env_.timer->Schedule(env_.timer->Now() + limit + kRunDeadlineGrace, [weak, seq, limit] {
              if (auto self = weak.lock()) self->OnRunDeadline(seq, limit);
            });
      }
      return;
    }
    scheduler::BuildLocalPlan(slot.merge.requests(), plan->chunk_bytes, &collective_exec_.plan);
    fused_ = 1 + FuseGroupLocked(plan->chunk_bytes);
    collective_exec_.sequential = fused_ > 1;
    if (!collective_exec_.plan.steps.empty() || fused_ > 1) {
      collective_running_ = true;
      running_self_ = shared_from_this();
      out->collective = &collective_exec_;
      return;
    }
    // Nothing to move (barrier, count 0): complete now.
    RecordCollectiveLocked(absl::OkStatus());
    for (auto& r : slot.requests)
      out->completions.push_back({std::move(r), absl::OkStatus(), base_seq});
    ++ops_completed_;
    collectives_.PopFront();
  }
}

bool Communicator::GroupContinuesLocked(const CollectiveQueue::Entry& e) const {
  for (const auto& r : e.requests) {
    if (r == nullptr || !r->group_next) return false;
  }
  return !e.requests.empty();
}

size_t Communicator::FuseGroupLocked(size_t chunk_bytes) {
  if (multi_node_ || env_.inline_max_bytes == 0) return 0;
  const CollectiveQueue::Entry& front = collectives_.front();
  const scheduler::RankRequest& r0 = front.requests[0]->req;
  size_t fused = 0;
  const CollectiveQueue::Entry* prev = &front;
  // The rest of the front's group, while complete, alike (dtype, red_op) and small: they run in
  // the same execution, in order, on one thread.
  while (GroupContinuesLocked(*prev)) {
    CollectiveQueue::Entry* next = collectives_.Find(collectives_.front_seq() + fused + 1);
    if (next == nullptr || !next->merge.complete() ||
        next->merge.CheckComplete() != absl::OkStatus()) {
      break;
    }
    const scheduler::RankRequest& rn = next->requests[0]->req;
    if (rn.dtype != r0.dtype || rn.red_op != r0.red_op || (rn.device >= 0) != (r0.device >= 0) ||
        scheduler::IsPointToPoint(rn.op)) {
      break;
    }
    absl::StatusOr<PlannedOp> plan = planner_.Plan(next->merge.requests());
    if (!plan.ok() || !plan->local()) break;
    scheduler::LocalPlan& lp = collective_exec_.plan;
    const uint64_t bytes_before = lp.bytes_moved;
    const size_t steps_before = lp.steps.size();
    const size_t ptrs_before = lp.ptrs.size();
    scheduler::AppendLocalPlan(next->merge.requests(), chunk_bytes, &lp);
    if (lp.bytes_moved > env_.inline_max_bytes) {
      // Too big to run in order on one thread with the others: it runs on its own, after.
      lp.steps.resize(steps_before);
      lp.ptrs.resize(ptrs_before);
      lp.bytes_moved = bytes_before;
      break;
    }
    env_.timer->Cancel(next->timer);
    for (auto& r : next->requests) r->waiting.Reset();
    ++fused;
    ++ops_fused_;
    prev = next;
  }
  return fused;
}

void Communicator::OnRunDeadline(uint64_t seq, absl::Duration limit) {
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    if (!collective_running_ || collectives_.front_seq() != seq) return;
    // What this node still waits for: its oldest transfer in flight.
    std::string waits;
    const scheduler::RunProgress progress = node_run_.Progress();
    const scheduler::RunProgress::Transfer* oldest = nullptr;
    for (const auto& t : progress.transfers) {
      if (oldest == nullptr || t.issued < oldest->issued) oldest = &t;
    }
    if (oldest != nullptr) {
      waits = absl::StrCat("; node ", NodeName(net_.my_node), " still waits for ",
                           oldest->send ? "its send to " : "a chunk from ", NodeName(oldest->peer),
                           " on rail", oldest->rail, " (step ", oldest->step, ", ",
                           progress.steps_done, " of ", progress.steps_total, " steps done)");
    }
    AbortLocked(absl::DeadlineExceededError(absl::StrCat(
                    "seq ", seq, " on communicator ", comm_id_, " did not complete across its ",
                    net_.layout.nnodes, " nodes within ", absl::FormatDuration(limit),
                    ": a peer daemon's ranks stalled or submitted a different operation", waits,
                    " (railctl diagnose tells more)")),
                &out, /*transfers_now=*/true);
  }
  Deliver(out);
}

std::optional<Communicator::RailSuspect> Communicator::SuspectRail(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration() || !multi_node_) return std::nullopt;
  absl::MutexLock lock(&mu_);
  if (!collective_running_ || state_ == State::kFailed) return std::nullopt;
  const auto stall = scheduler::FindStalledRail(
      node_run_.Progress(), std::chrono::steady_clock::now(), absl::ToChronoNanoseconds(timeout));
  if (!stall) return std::nullopt;
  return RailSuspect{*stall, collectives_.front_seq()};
}

bool Communicator::FailStalledRail(const RailSuspect& suspect, absl::Duration timeout,
                                   const std::string& evidence) {
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    if (!collective_running_ || state_ == State::kFailed ||
        collectives_.front_seq() != suspect.seq) {
      return false;
    }
    const auto stall = scheduler::FindStalledRail(
        node_run_.Progress(), std::chrono::steady_clock::now(), absl::ToChronoNanoseconds(timeout));
    if (!stall || stall->peer != suspect.stall.peer || stall->rail != suspect.stall.rail) {
      return false;
    }
    auto ago = [](std::chrono::steady_clock::duration d) {
      return absl::FormatDuration(absl::Trunc(absl::FromChrono(d), absl::Milliseconds(100)));
    };
    const std::string peer = NodeName(stall->peer);
    AbortLocked(
        absl::UnavailableError(absl::StrCat(
            "rail", stall->rail, " between node ", NodeName(net_.my_node), " and node ", peer,
            " stopped delivering: seq ", suspect.seq, " on communicator ", comm_id_, " waited ",
            ago(stall->waited), " for its ", stall->send ? "send to " : "chunk from ", peer,
            " on rail", stall->rail, " (step ", stall->step, ") and ", peer, " ", evidence,
            stall->other_rail >= 0 ? absl::StrCat("; rail", stall->other_rail, " delivered from ",
                                                  peer, " ", ago(stall->other_ago), " ago")
                                   : std::string(),
            " (a link down? --rail_stall_timeout=", absl::FormatDuration(timeout), ")")),
        &out, /*transfers_now=*/true);
    if (const metrics::LinkCounters* link = LinkAt(stall->peer, stall->rail)) {
      if (link->stalls != nullptr) link->stalls->Increment();
      if (link->up != nullptr) link->up->Set(0);
    }
  }
  Deliver(out);
  return true;
}

void Communicator::OnCollectiveDone(const absl::Status& run_status) {
  std::shared_ptr<Communicator> keep;
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    // When the communicator failed while this ran (a peer told us why, a rank left), the run's
    // own error is a consequence (its transfers were aborted, or met a peer's schedule that was
    // not theirs): its ranks are told the cause, the communicator's first reason.
    const absl::Status status =
        !run_status.ok() && state_ == State::kFailed && !error_.ok() ? error_ : run_status;
    keep = std::move(running_self_);
    env_.timer->Cancel(run_timer_);
    // What failed, as it was, before it is popped (railctl diagnose).
    if (!status.ok() && failed_op_ == nullptr && !collectives_.empty()) {
      failed_op_ = std::make_unique<v1::OpProgress>(FrontProgressLocked(absl::Now()));
    }
    // A fused group completes each of its operations.
    const size_t ran = std::max<size_t>(fused_, 1);
    fused_ = 1;
    const uint64_t first_ran = collectives_.front_seq();
    for (size_t i = 0; i < ran && !collectives_.empty(); ++i) {
      CollectiveQueue::Entry& slot = collectives_.front();
      const uint64_t seq = collectives_.front_seq();
      RecordCollectiveLocked(status);
      for (auto& r : slot.requests) out.completions.push_back({std::move(r), status, seq});
      if (status.ok()) {
        ++ops_completed_;
      } else {
        ++ops_failed_;
      }
      collectives_.PopFront();
    }
    if (status.ok()) bytes_moved_ += collective_exec_.plan.bytes_moved;
    if (status.ok() && node_codec_.kind != kernels::CodecKind::kNone) CountCompressedBytesLocked();
    node_codec_ = {};
    node_residual_ = nullptr;
    // The run is done with them; the watchers hold their staging's host memory and quota.
    node_gates_.clear();
    node_outputs_.clear();
    collective_running_ = false;
    // A failed transfer leaves the daemons out of step: the communicator cannot go on.
    if (!status.ok()) {
      AbortLocked(status, &out, /*transfers_now=*/true);
      if (out.notify_peers) out.unrun_seq = first_ran;  // this node did not finish it
    }
    NextCollectiveLocked(&out);
  }
  Deliver(out);
}

const metrics::LinkCounters* Communicator::LinkAt(int node, int rail) const {
  if (node < 0 || static_cast<size_t>(node) >= net_.links.size() || rail < 0 ||
      static_cast<size_t>(rail) >= net_.links[node].size()) {
    return nullptr;
  }
  return net_.links[node][rail];
}

void Communicator::CountCompressedBytesLocked() {
  if (node_schedule_ == nullptr) return;
  for (const scheduler::NodeStep& s : node_schedule_->steps) {
    if (s.aux == 0) continue;
    const bool send = s.kind == scheduler::NodeStep::Kind::kSend;
    if (!send && s.kind != scheduler::NodeStep::Kind::kRecv) continue;
    const metrics::LinkCounters* link = LinkAt(s.peer, s.rail);
    if (link == nullptr || link->tx_uncompressed_bytes == nullptr) continue;
    (send ? link->tx_uncompressed_bytes : link->rx_uncompressed_bytes)
        ->Increment(static_cast<double>(s.aux));
    (send ? link->tx_compressed_bytes : link->rx_compressed_bytes)
        ->Increment(static_cast<double>(s.bytes));
  }
}

void Communicator::RecordCollectiveLocked(const absl::Status& status) {
  if (env_.metrics == nullptr || !status.ok() || collectives_.empty()) return;
  const CollectiveQueue::Entry& slot = collectives_.front();
  if (slot.requests.empty() || slot.requests[0] == nullptr) return;
  const scheduler::RankRequest& r = slot.requests[0]->req;
  // nccl-tests' size (what algbw divides by), op.h.
  const auto bytes =
      static_cast<uint64_t>(scheduler::MessageBytes(r.op, r.dtype, r.count, nranks_));
  const std::string op(scheduler::OpName(r.op));
  env_.metrics->RecordCollective(
      {op, run_algorithm_, job_, bytes, nranks_, absl::Now() - run_started_});
}

void Communicator::PrepareNodeRunLocked(const PlannedOp& plan, float* residual) {
  const CollectiveQueue::Entry& slot = collectives_.front();
  node_schedule_ = plan.schedule;
  node_codec_ = plan.codec;
  node_residual_ = residual;
  const uint64_t per_rank = node_schedule_->scratch_bytes_per_rank;
  const bool first_only = node_schedule_->scratch_first_rank_only;
  const size_t need = per_rank * (first_only ? 1 : local_ranks_.size());
  if (scratch_.size() < need) scratch_.resize(need);  // grows once per larger shape, then reused
  node_memory_.send.assign(nranks_, nullptr);
  node_memory_.recv.assign(nranks_, nullptr);
  node_memory_.scratch.assign(nranks_, nullptr);
  node_gates_.clear();
  node_outputs_.clear();
  for (size_t li = 0; li < local_ranks_.size(); ++li) {
    const int g = local_ranks_[li];
    if (slot.requests[li]->input_gate != nullptr) {
      node_gates_.push_back(slot.requests[li]->input_gate);
    }
    if (slot.requests[li]->output_watcher != nullptr) {
      slot.requests[li]->output_watcher->Watched();
      node_outputs_.push_back(slot.requests[li]->output_watcher);
    }
    node_memory_.send[g] = slot.requests[li]->req.send;
    node_memory_.recv[g] = slot.requests[li]->req.recv;
    node_memory_.scratch[g] = first_only && li > 0 ? nullptr : scratch_.data() + li * per_rank;
  }
  node_dtype_ = slot.requests[0]->req.dtype;
  node_red_op_ = slot.requests[0]->req.red_op;
  node_run_seq_ = collectives_.front_seq();
  const scheduler::RankRequest& r0 = slot.requests[0]->req;
  if (multi_node_) {
    digests_.Prepare(OpDigest::Of(r0, node_run_seq_, plan.algorithm, plan.codec), node_schedule_,
                     /*gated=*/!node_gates_.empty());
  }
}

void Communicator::OnOpDeadline(uint64_t seq) {
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    const CollectiveQueue::Entry* entry = collectives_.Find(seq);
    if (state_ == State::kFailed || entry == nullptr) return;
    const CollectiveQueue::Entry& slot = *entry;
    if (slot.merge.complete()) return;
    const PendingRequest* first = nullptr;
    for (const auto& r : slot.requests) {
      if (r != nullptr && (first == nullptr || r->deadline < first->deadline)) first = r.get();
    }
    if (first == nullptr) return;
    const std::vector<int> missing = slot.merge.MissingRanks();
    AbortLocked(absl::DeadlineExceededError(absl::StrCat(
                    scheduler::OpName(first->req.op), " seq ", seq, " on communicator ", comm_id_,
                    ": rank", missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "), " of ",
                    nranks_, " did not submit within ", absl::FormatDuration(TimeoutOf(*first)))),
                &out);
  }
  Deliver(out);
}

void Communicator::Leave(int rank, const absl::Status& why, bool graceful) {
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    const int li = LocalIndex(rank);
    if (li < 0 || members_[li].left) return;
    members_[li].left = true;
    if (graceful && state_ == State::kReady && !PendingLocked(li)) {
      DepartLocked(rank, why, &out);
      if (multi_node_ && state_ != State::kFailed) {
        out.departed.push_back(rank);
        out.departed_why = why;
      }
    } else {
      bool others = multi_node_;  // ranks on other daemons are always still there to be told
      for (size_t r = 0; r < members_.size(); ++r) {
        others |= static_cast<int>(r) != li && members_[r].joined && !members_[r].left;
      }
      if (others || state_ == State::kJoining) AbortLocked(why, &out);
    }
  }
  Deliver(out);
}

bool Communicator::PendingLocked(int li) const {
  if (collectives_.submitted(li) > collectives_.front_seq()) return true;
  return p2p_.involves_locked(local_ranks_[static_cast<size_t>(li)], /*remote=*/true);
}

void Communicator::DepartLocked(int rank, const absl::Status& why, Outcomes* out) {
  departed_[static_cast<size_t>(rank)] = true;
  if (departure_.ok()) departure_ = why;
  if (state_ != State::kReady) return;
  // A collective waiting now needs the rank, which submits no more: it can never complete. So
  // does a same-daemon send or receive with it. (A transfer to or from it in flight completes:
  // its side was done before it left.)
  if (!collectives_.empty() || collective_running_ ||
      p2p_.involves_locked(rank, /*remote=*/false)) {
    AbortLocked(why, out);
  }
}

void Communicator::RanksDeparted(const std::vector<int>& ranks, const absl::Status& why) {
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    for (int r : ranks) {
      if (r >= 0 && r < nranks_ && LocalIndex(r) < 0) DepartLocked(r, why, &out);
    }
    out.notify_peers = false;  // the node that told us knows; the others were told alike
  }
  Deliver(out);
}

void Communicator::Abort(const absl::Status& status, bool notify, bool transfers_now,
                         std::optional<uint64_t> unrun_seq) {
  Outcomes out;
  absl::Status cut_now;  // non-OK: an earlier abort left the running collective its grace
  {
    absl::MutexLock lock(&mu_);
    const bool was_failed = state_ == State::kFailed;
    if (unrun_seq.has_value() && collective_running_ &&
        node_run_seq_ + std::max<size_t>(fused_, 1) - 1 >= *unrun_seq) {
      transfers_now = true;  // what it waits for from that peer never comes
      if (was_failed) cut_now = error_;
    }
    // A notice is about the collective at the front: what this node runs or its ranks submit
    // next (this node has not finished it, or it would have failed on its own already).
    const uint64_t front = collectives_.front_seq();
    AbortLocked(status, &out, transfers_now);
    if (!notify) {
      // They told us, and the others alike; but when this node will not run a collective the
      // teller will (its ranks had not started it here), the others' runs of it wait for this
      // node's part in vain until the grace: they are told which (once: the abort is once).
      out.notify_peers = !was_failed && unrun_seq.has_value() && out.unrun_seq.has_value() &&
                         *out.unrun_seq < *unrun_seq;
      if (!was_failed) noticed_seq_ = front;
    }
  }
  Deliver(out);
  if (!cut_now.ok()) AbortTransfers(cut_now);
}

void Communicator::AbortLocked(const absl::Status& status, Outcomes* out, bool transfers_now) {
  if (state_ == State::kFailed) return;
  const bool was_joining = state_ == State::kJoining;
  state_ = State::kFailed;
  error_ = status;
  if (multi_node_) {
    out->abort_transfers = status;
    out->abort_transfers_now = transfers_now;
    out->notify_peers = true;
    // The running collective finishes here unless its transfers fail now; nothing later runs.
    const uint64_t front = collectives_.front_seq();
    out->unrun_seq = collective_running_ && !transfers_now ? front + 1 : front;
  }
  const size_t failed_before = out->completions.size() + out->joins.size();
  if (was_joining) {
    env_.timer->Cancel(join_timer_);
    for (auto& m : members_) {
      if (m.join_done) out->joins.push_back(std::move(m.join_done));
    }
    out->join_status = status;
  }
  if (!collectives_.empty() && failed_op_ == nullptr) {
    failed_op_ = std::make_unique<v1::OpProgress>(FrontProgressLocked(absl::Now()));
  }
  // The running collective (the front slot) finishes normally; everything queued fails.
  CollectiveQueue::Drained drained = collectives_.DrainFrom(collective_running_ ? 1 : 0);
  for (DeadlineTimer::Id id : drained.timers) env_.timer->Cancel(id);
  for (auto& [seq, r] : drained.requests) out->completions.push_back({std::move(r), status, seq});
  ops_failed_ += drained.entries;
  ops_failed_ += p2p_.DrainLocked(status, out);
  // A rank leaving an idle communicator is how jobs end: only failed work is worth a warning.
  // A running collective whose transfers fail now fails too (its completion comes later).
  const size_t failed = out->completions.size() + out->joins.size() - failed_before +
                        (collective_running_ && transfers_now ? 1 : 0);
  if (env_.metrics != nullptr) {
    if (failed > 0) env_.metrics->CountCommAbort();
    if (status.code() == absl::StatusCode::kDeadlineExceeded) env_.metrics->CountOpTimeout();
  }
  Log(failed > 0 ? LogLevel::kWarning : LogLevel::kInfo, "comm",
      failed > 0 ? "communicator aborted" : "communicator closed",
      {F("comm", comm_id_), F("job", job_), F("code", absl::StatusCodeToString(status.code())),
       F("reason", status.message()), F("failed_requests", failed)});
}

void Communicator::Deliver(Outcomes& out) {
  for (auto& o : out.completions) {
    o.request->waiting.Reset();  // before the client hears of it: it may submit again at once
    if (auto session = o.request->session.lock()) {
      session->PostCompletion(o.request->request_id, o.status, o.seq);
    }
    posted_.fetch_add(1);
  }
  out.completions.clear();
  for (auto& done : out.joins) {
    if (done) done(out.join_status);
  }
  out.joins.clear();
  for (auto& post : out.transport_posts) post();
  if (!out.departed.empty() && net_.notify_departed) {
    net_.notify_departed(out.departed, out.departed_why);
  }
  if (!out.abort_transfers.ok()) {
    // The running operation's transfers fail now when a peer is dead; otherwise (a rank left, a
    // peer told us) it gets a grace period, since it usually completes (every daemon already
    // runs it), and only a stuck one is failed. Unless they told us, the daemons learn why.
    if (out.abort_transfers_now) {
      AbortTransfers(out.abort_transfers);
    } else {
      AbortTransfersAfterGrace(out.abort_transfers, kTransferGrace);
    }
    if (out.notify_peers && net_.notify_peers) {
      // A disagreement or corrupt data: the peers' grace lets their own diagnosis arrive.
      const absl::StatusCode code = out.abort_transfers.code();
      const bool diagnosed =
          code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kDataLoss;
      net_.notify_peers(out.abort_transfers, diagnosed ? std::nullopt : out.unrun_seq);
    }
  }
  if (out.start_node_run) {
    scheduler::NodeRun::Params p;
    p.schedule = node_schedule_.get();
    p.schedule_owner = node_schedule_;
    p.memory = &node_memory_;
    p.endpoints = &net_.endpoints;
    p.dtype = node_dtype_;
    p.red_op = node_red_op_;
    p.nranks = static_cast<uint32_t>(nranks_);
    p.node_slots = &net_.node_slots;
    p.seq = node_run_seq_;
    p.pool = env_.executor;
    // Completing an operation (its ranks' completions, and the start of a queued next one) costs
    // the same at any size, less than the hand-off to a worker: that woke a worker, which woke
    // the client, for every operation (512 KiB AllReduce, 2 daemons x 1 rank: 4.6 thread
    // wake-ups per operation with the hand-off, 0.7 without; docs/data-plane.md, "Completing on
    // the last step's thread"). Large local steps still go to the pool (inline_local_max_bytes).
    p.complete_inline = true;
    p.codec = node_codec_;
    p.residual = node_residual_;
    const int peers = multi_node_ ? net_.layout.nnodes - 1 : 0;
    p.carried = peers == 0 ? nullptr : digests_.carried();
    p.gates = &node_gates_;
    p.outputs = &node_outputs_;
    // The first failed step aborts this communicator's transfers after the grace (the
    // communicator fails with the run anyway, OnCollectiveDone): a peer that failed too stops
    // sending, and a receive it would have unblocked held the run, and its ranks' error, until
    // the deadline. The grace lets a better diagnosis arrive first (the operation digests'
    // verdict that the nodes submitted different counts, which a receive of the wrong length
    // precedes). The run keeps its first error (a corrupted message's DATA_LOSS, say).
    std::weak_ptr<Communicator> weak = weak_from_this();
    p.on_failing = [weak](const absl::Status& status) {
      if (auto self = weak.lock()) {
        self->AbortTransfersAfterGrace(status, status.code() == absl::StatusCode::kUnavailable
                                                   ? kBrokenLinkGrace
                                                   : kTransferGrace);
      }
    };
    digests_.Arm();
    // The run first: the digests' completions report its carried steps to it (NodeRun::Carried),
    // and it cannot finish before they have.
    node_run_.Start(p, [this](absl::Status s) { digests_.RunDone(s); });
    if (peers > 0) digests_.Exchange(node_memory_);
  }
  if (out.collective != nullptr) {
    env_.executor->RunInlineOrQueue(out.collective, env_.inline_max_bytes);
  }
  for (scheduler::Execution* copy : out.copies) {
    env_.executor->RunInlineOrQueue(copy, env_.inline_max_bytes);
  }
}

void Communicator::AbortTransfersAfterGrace(const absl::Status& status, absl::Duration grace) {
  std::weak_ptr<Communicator> weak = weak_from_this();
  env_.timer->Schedule(env_.timer->Now() + grace, [weak, status] {
    if (auto self = weak.lock()) self->AbortTransfers(status);
  });
}

void Communicator::AbortTransfers(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (!collective_running_ && !p2p_.remote_in_flight_locked()) return;
  }
  for (auto& rails : net_.endpoints) {
    for (auto& ep : rails) {
      if (ep != nullptr) ep->Abort(status);
    }
  }
}

bool Communicator::failed() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kFailed;
}

absl::Status Communicator::error() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kFailed ? error_ : absl::OkStatus();
}

bool Communicator::all_left() const {
  absl::MutexLock lock(&mu_);
  for (const auto& m : members_) {
    if (m.joined && !m.left) return false;
  }
  return true;
}

CommStats Communicator::Stats() const {
  absl::MutexLock lock(&mu_);
  CommStats s;
  s.comm_id = comm_id_;
  s.job = job_;
  s.nranks = nranks_;
  s.nnodes = net_.layout.nnodes;
  s.joined = joined_;
  s.state = state_ == State::kJoining ? "joining" : state_ == State::kReady ? "ready" : "failed";
  s.error = std::string(error_.message());
  s.ops_completed = ops_completed_;
  s.ops_failed = ops_failed_;
  s.bytes_moved = bytes_moved_;
  s.ops_fused = ops_fused_;
  s.in_flight_ops = (collective_running_ ? 1 : 0) + p2p_.in_flight_locked();
  s.queued_ops = collectives_.size() - (collective_running_ ? 1 : 0);
  s.queued_ops += p2p_.queued_locked();
  s.pending_collectives = collectives_.size();
  if (!collectives_.empty()) s.oldest_pending = absl::Now() - collectives_.front().first_at;
  return s;
}

v1::OpProgress Communicator::FrontProgressLocked(absl::Time now) const {
  v1::OpProgress op;
  if (collectives_.empty()) return op;
  const CollectiveQueue::Entry& e = collectives_.front();
  op.set_seq(collectives_.front_seq());
  op.set_age_seconds(absl::ToDoubleSeconds(now - e.first_at));
  const scheduler::RankRequest* first = nullptr;
  for (size_t li = 0; li < e.merge.requests().size(); ++li) {
    const scheduler::RankRequest* r = e.merge.requests()[li];
    if (r == nullptr) continue;
    if (first == nullptr) first = r;
    op.add_submitted_ranks(local_ranks_[li]);
  }
  for (int r : e.merge.MissingRanks()) op.add_missing_ranks(r);
  if (first != nullptr) {
    op.set_op(std::string(scheduler::OpName(first->op)));
    op.set_dtype(std::string(kernels::Name(first->dtype)));
    op.set_count(first->count);
    op.set_bytes(first->count * kernels::ElementSize(first->dtype));
    op.set_root(first->root);
    if (scheduler::IsReduction(first->op)) op.set_red_op(std::string(kernels::Name(first->red_op)));
  }
  op.set_running(collective_running_);
  if (!collective_running_) return op;
  op.set_algorithm(run_algorithm_);
  if (!multi_node_) return op;
  const scheduler::RunProgress progress = node_run_.Progress();
  op.set_steps_total(progress.steps_total);
  op.set_steps_done(progress.steps_done);
  const auto steady_now = std::chrono::steady_clock::now();
  for (const auto& t : progress.transfers) {
    v1::TransferProgress* out = op.add_transfers();
    out->set_send(t.send);
    out->set_peer_node(t.peer);
    if (t.peer >= 0 && static_cast<size_t>(t.peer) < net_.node_names.size()) {
      out->set_peer_name(net_.node_names[t.peer]);
    }
    out->set_rail(t.rail);
    out->set_bytes(t.bytes);
    out->set_step(t.step);
    out->set_age_seconds(std::chrono::duration<double>(steady_now - t.issued).count());
  }
  return op;
}

v1::CommState Communicator::ProgressState() const {
  const absl::Time now = absl::Now();
  v1::CommState st;
  absl::MutexLock lock(&mu_);
  st.set_comm_id(comm_id_);
  st.set_job_id(job_);
  st.set_nranks(nranks_);
  st.set_nnodes(net_.layout.nnodes);
  st.set_node_index(net_.my_node);
  for (const std::string& name : net_.node_names) st.add_node_names(name);
  if (static_cast<size_t>(net_.my_node) < net_.node_names.size()) {
    st.set_node_name(net_.node_names[net_.my_node]);
  }
  st.set_state(state_ == State::kJoining ? "joining"
               : state_ == State::kReady ? "ready"
                                         : "failed");
  st.set_error(std::string(error_.message()));
  st.set_ops_completed(ops_completed_);
  for (size_t li = 0; li < local_ranks_.size(); ++li) {
    v1::RankProgress* r = st.add_ranks();
    r->set_rank(local_ranks_[li]);
    r->set_submitted(collectives_.submitted(static_cast<int>(li)));
    r->set_completed(collectives_.front_seq());
    r->set_left(members_[li].left);
  }
  if (!collectives_.empty()) *st.mutable_front() = FrontProgressLocked(now);
  if (failed_op_ != nullptr) *st.mutable_failed_op() = *failed_op_;
  return st;
}

std::string Communicator::NodeName(int node) const {
  return node >= 0 && static_cast<size_t>(node) < net_.node_names.size()
             ? net_.node_names[node]
             : absl::StrCat("node ", node);
}

void Communicator::WithLock(absl::FunctionRef<void(CommOutcomes*)> fn) {
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    fn(&out);
  }
  Deliver(out);
}

bool Communicator::FailedLocked() const {
  mu_.AssertHeld();
  return state_ == State::kFailed;
}

void Communicator::FailLocked(const absl::Status& status, CommOutcomes* out, bool transfers_now) {
  mu_.AssertHeld();
  AbortLocked(status, out, transfers_now);
}

void Communicator::CountLocked(bool ok, uint64_t bytes_moved) {
  mu_.AssertHeld();
  if (ok) {
    ++ops_completed_;
    bytes_moved_ += bytes_moved;
  } else {
    ++ops_failed_;
  }
}

std::weak_ptr<PointToPoint::Host> Communicator::Weak() {
  // The host is a private base: alias it to the communicator's own control block.
  std::shared_ptr<Communicator> self = weak_from_this().lock();
  if (self == nullptr) return {};
  return std::shared_ptr<PointToPoint::Host>(self, static_cast<PointToPoint::Host*>(this));
}

}  // namespace railyard
