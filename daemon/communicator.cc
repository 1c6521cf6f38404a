#include "daemon/communicator.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "daemon/log.h"
#include "daemon/scheduler/local_plan.h"
#include "daemon/session.h"

namespace railyard {

using scheduler::OpKind;

Communicator::Communicator(std::string comm_id, std::string job, int nranks, CommEnv env)
    : comm_id_(std::move(comm_id)), job_(std::move(job)), nranks_(nranks), env_(env) {
  members_.resize(static_cast<size_t>(nranks));
  next_seq_.assign(static_cast<size_t>(nranks), 0);
  collective_exec_.on_done = [this] { OnCollectiveDone(); };
}

Communicator::~Communicator() = default;

absl::Duration Communicator::TimeoutOf(const PendingRequest& r) const {
  return r.timeout > absl::ZeroDuration() ? r.timeout : env_.op_timeout;
}

absl::Status Communicator::Join(int rank, absl::Duration timeout, JoinDone done) {
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
    if (members_[rank].joined) {
      return absl::AlreadyExistsError(
          absl::StrCat("rank ", rank, " has already joined communicator ", comm_id_));
    }
    members_[rank].joined = true;
    members_[rank].join_done = std::move(done);
    if (++joined_ == 1) {
      std::weak_ptr<Communicator> weak = weak_from_this();
      join_timer_ = env_.timer->Schedule(absl::Now() + timeout, [weak] {
        if (auto self = weak.lock()) self->OnJoinDeadline();
      });
    }
    if (joined_ == nranks_) {
      state_ = State::kReady;
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
    for (int r = 0; r < nranks_; ++r) {
      if (!members_[r].joined) missing.push_back(r);
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
    if (state_ == State::kFailed) {
      return absl::AbortedError(
          absl::StrCat("communicator ", comm_id_, " was aborted: ", error_.message()));
    }
    if (state_ == State::kJoining) {
      return absl::FailedPreconditionError(
          absl::StrCat("communicator ", comm_id_, " is still waiting for ranks to join"));
    }
    if (members_[request->rank].left) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", request->rank, " has left communicator ", comm_id_));
    }
    request->deadline = absl::Now() + TimeoutOf(*request);
    if (scheduler::IsPointToPoint(request->req.op)) {
      result = SubmitPointToPointLocked(std::move(request), &out);
    } else {
      result = SubmitCollectiveLocked(std::move(request), &out);
    }
  }
  Deliver(out);
  return result;
}

absl::StatusOr<uint64_t> Communicator::SubmitCollectiveLocked(
    std::unique_ptr<PendingRequest> request, Outcomes* out) {
  const int rank = request->rank;
  const uint64_t seq = next_seq_[rank];
  const uint64_t idx = seq - base_seq_;
  while (slots_.size() <= idx) {
    slots_.emplace_back();
    slots_.back().merge.Reset(nranks_);
    slots_.back().requests.resize(static_cast<size_t>(nranks_));
  }
  SeqSlot& slot = slots_[idx];
  if (absl::Status s = slot.merge.Add(rank, &request->req); !s.ok()) {
    const absl::Status why(s.code(),
                           absl::StrCat(scheduler::OpName(request->req.op), " seq ", seq,
                                        " on communicator ", comm_id_, ": ", s.message()));
    AbortLocked(why, out);
    return why;
  }
  ++next_seq_[rank];
  if (slot.merge.arrived() == 1) {
    std::weak_ptr<Communicator> weak = weak_from_this();
    slot.timer = env_.timer->Schedule(request->deadline, [weak, seq] {
      if (auto self = weak.lock()) self->OnOpDeadline(seq);
    });
  }
  slot.requests[rank] = std::move(request);
  if (slot.merge.complete()) {
    env_.timer->Cancel(slot.timer);
    if (absl::Status s = slot.merge.CheckComplete(); !s.ok()) {
      AbortLocked(absl::Status(s.code(), absl::StrCat("seq ", seq, " on communicator ", comm_id_,
                                                      ": ", s.message())),
                  out);
      return seq;
    }
    NextCollectiveLocked(out);
  }
  return seq;
}

void Communicator::NextCollectiveLocked(Outcomes* out) {
  while (!collective_running_ && state_ != State::kFailed && !slots_.empty() &&
         slots_.front().merge.complete()) {
    SeqSlot& slot = slots_.front();
    scheduler::BuildLocalPlan(slot.merge.requests(), env_.chunk_bytes, &collective_exec_.plan);
    if (!collective_exec_.plan.steps.empty()) {
      collective_running_ = true;
      running_self_ = shared_from_this();
      out->collective = &collective_exec_;
      return;
    }
    // Nothing to move (barrier, count 0): complete now.
    for (auto& r : slot.requests)
      out->completions.push_back({std::move(r), absl::OkStatus(), base_seq_});
    ++ops_completed_;
    slots_.pop_front();
    ++base_seq_;
  }
}

void Communicator::OnCollectiveDone() {
  std::shared_ptr<Communicator> keep;
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    keep = std::move(running_self_);
    SeqSlot& slot = slots_.front();
    for (auto& r : slot.requests)
      out.completions.push_back({std::move(r), absl::OkStatus(), base_seq_});
    ++ops_completed_;
    bytes_moved_ += collective_exec_.plan.bytes_moved;
    slots_.pop_front();
    ++base_seq_;
    collective_running_ = false;
    NextCollectiveLocked(&out);
  }
  Deliver(out);
}

void Communicator::OnOpDeadline(uint64_t seq) {
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kFailed || seq < base_seq_ || seq - base_seq_ >= slots_.size()) return;
    const SeqSlot& slot = slots_[seq - base_seq_];
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

absl::StatusOr<uint64_t> Communicator::SubmitPointToPointLocked(
    std::unique_ptr<PendingRequest> request, Outcomes* out) {
  const bool is_send = request->req.op == OpKind::kSend;
  const int rank = request->rank;
  const int peer = request->req.root;
  const std::pair<int, int> key = is_send ? std::make_pair(rank, peer) : std::make_pair(peer, rank);
  Channel& ch = channels_[key];
  auto& queue = is_send ? ch.sends : ch.recvs;
  auto& timers = is_send ? ch.send_timers : ch.recv_timers;
  const uint64_t seq = ch.matched + queue.size();
  std::weak_ptr<Communicator> weak = weak_from_this();
  timers.push_back(env_.timer->Schedule(request->deadline, [weak, key, is_send] {
    if (auto self = weak.lock()) self->OnP2PDeadline(key, is_send);
  }));
  queue.push_back(std::move(request));
  NextPointToPointLocked(key, out);
  return seq;
}

void Communicator::NextPointToPointLocked(std::pair<int, int> key, Outcomes* out) {
  Channel& ch = channels_[key];
  while (!ch.executing && state_ != State::kFailed && !ch.sends.empty() && !ch.recvs.empty()) {
    const PendingRequest& send = *ch.sends.front();
    const PendingRequest& recv = *ch.recvs.front();
    if (send.req.dtype != recv.req.dtype || send.req.count != recv.req.count) {
      AbortLocked(absl::InvalidArgumentError(
                      absl::StrCat("send/recv mismatch on communicator ", comm_id_, " (pair seq ",
                                   ch.matched, "): rank ", key.first, " sends ", send.req.count,
                                   " x ", std::string(kernels::Name(send.req.dtype)), " to rank ",
                                   key.second, ", which receives ", recv.req.count, " x ",
                                   std::string(kernels::Name(recv.req.dtype)))),
                  out);
      return;
    }
    P2PRun* run;
    if (idle_p2p_runs_.empty()) {
      p2p_runs_.push_back(std::make_unique<P2PRun>());
      run = p2p_runs_.back().get();
      run->exec.on_done = [this, run] { OnPointToPointDone(run); };
    } else {
      run = idle_p2p_runs_.back();
      idle_p2p_runs_.pop_back();
    }
    env_.timer->Cancel(ch.send_timers.front());
    env_.timer->Cancel(ch.recv_timers.front());
    ch.send_timers.pop_front();
    ch.recv_timers.pop_front();
    run->send = std::move(ch.sends.front());
    run->recv = std::move(ch.recvs.front());
    ch.sends.pop_front();
    ch.recvs.pop_front();
    run->channel = key;
    run->seq = ch.matched++;
    const uint64_t bytes = run->send->req.count * kernels::ElementSize(run->send->req.dtype);
    scheduler::BuildCopyPlan(run->send->req.send, run->recv->req.recv, bytes, env_.chunk_bytes,
                             &run->exec.plan);
    if (run->exec.plan.steps.empty()) {
      out->completions.push_back({std::move(run->send), absl::OkStatus(), run->seq});
      out->completions.push_back({std::move(run->recv), absl::OkStatus(), run->seq});
      ++ops_completed_;
      idle_p2p_runs_.push_back(run);
      continue;
    }
    ch.executing = true;
    run->self = shared_from_this();
    out->p2p.push_back(run);
    return;
  }
}

void Communicator::OnPointToPointDone(P2PRun* run) {
  std::shared_ptr<Communicator> keep;
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    keep = std::move(run->self);
    out.completions.push_back({std::move(run->send), absl::OkStatus(), run->seq});
    out.completions.push_back({std::move(run->recv), absl::OkStatus(), run->seq});
    ++ops_completed_;
    bytes_moved_ += run->exec.plan.bytes_moved;
    channels_[run->channel].executing = false;
    idle_p2p_runs_.push_back(run);
    NextPointToPointLocked(run->channel, &out);
  }
  Deliver(out);
}

void Communicator::OnP2PDeadline(std::pair<int, int> key, bool send_side) {
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kFailed) return;
    auto it = channels_.find(key);
    if (it == channels_.end()) return;
    const auto& queue = send_side ? it->second.sends : it->second.recvs;
    if (queue.empty() || queue.front()->deadline > absl::Now()) return;
    const int waiting = send_side ? key.first : key.second;
    const int missing = send_side ? key.second : key.first;
    AbortLocked(
        absl::DeadlineExceededError(absl::StrCat(
            send_side ? "send" : "recv", " of rank ", waiting, " on communicator ", comm_id_,
            ": rank ", missing, " did not post the matching ", send_side ? "recv" : "send",
            " within ", absl::FormatDuration(TimeoutOf(*queue.front())))),
        &out);
  }
  Deliver(out);
}

void Communicator::Leave(int rank, const absl::Status& why) {
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    if (rank < 0 || rank >= nranks_ || members_[rank].left) return;
    members_[rank].left = true;
    bool others = false;
    for (int r = 0; r < nranks_; ++r)
      others |= r != rank && members_[r].joined && !members_[r].left;
    if (others || state_ == State::kJoining) AbortLocked(why, &out);
  }
  Deliver(out);
}

void Communicator::Abort(const absl::Status& status) {
  Outcomes out;
  {
    absl::MutexLock lock(&mu_);
    AbortLocked(status, &out);
  }
  Deliver(out);
}

void Communicator::AbortLocked(const absl::Status& status, Outcomes* out) {
  if (state_ == State::kFailed) return;
  const bool was_joining = state_ == State::kJoining;
  state_ = State::kFailed;
  error_ = status;
  const size_t failed_before = out->completions.size() + out->joins.size();
  if (was_joining) {
    env_.timer->Cancel(join_timer_);
    for (auto& m : members_) {
      if (m.join_done) out->joins.push_back(std::move(m.join_done));
    }
    out->join_status = status;
  }
  // The running collective (the front slot) finishes normally; everything queued fails.
  const size_t keep = collective_running_ ? 1 : 0;
  for (size_t i = keep; i < slots_.size(); ++i) {
    SeqSlot& slot = slots_[i];
    env_.timer->Cancel(slot.timer);
    for (auto& r : slot.requests) {
      if (r != nullptr) out->completions.push_back({std::move(r), status, base_seq_ + i});
    }
    ++ops_failed_;
  }
  slots_.resize(std::min(slots_.size(), keep));
  for (auto& [key, ch] : channels_) {
    for (auto id : ch.send_timers) env_.timer->Cancel(id);
    for (auto id : ch.recv_timers) env_.timer->Cancel(id);
    ch.send_timers.clear();
    ch.recv_timers.clear();
    uint64_t seq = ch.matched;
    for (auto& r : ch.sends) out->completions.push_back({std::move(r), status, seq++});
    seq = ch.matched;
    for (auto& r : ch.recvs) out->completions.push_back({std::move(r), status, seq++});
    ops_failed_ += ch.sends.size() + ch.recvs.size();
    ch.sends.clear();
    ch.recvs.clear();
  }
  // A rank leaving an idle communicator is how jobs end: only failed work is worth a warning.
  const size_t failed = out->completions.size() + out->joins.size() - failed_before;
  Log(failed > 0 ? LogLevel::kWarning : LogLevel::kInfo, "comm",
      failed > 0 ? "communicator aborted" : "communicator closed",
      {F("comm", comm_id_), F("job", job_), F("code", absl::StatusCodeToString(status.code())),
       F("reason", status.message()), F("failed_requests", failed)});
}

void Communicator::Deliver(Outcomes& out) {
  for (auto& o : out.completions) {
    if (auto session = o.request->session.lock()) {
      session->PostCompletion(o.request->request_id, o.status, o.seq);
    }
  }
  out.completions.clear();
  for (auto& done : out.joins) {
    if (done) done(out.join_status);
  }
  out.joins.clear();
  if (out.collective != nullptr) env_.executor->Run(out.collective);
  for (P2PRun* run : out.p2p) env_.executor->Run(&run->exec);
}

bool Communicator::failed() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kFailed;
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
  s.joined = joined_;
  s.state = state_ == State::kJoining ? "joining" : state_ == State::kReady ? "ready" : "failed";
  s.error = std::string(error_.message());
  s.ops_completed = ops_completed_;
  s.ops_failed = ops_failed_;
  s.bytes_moved = bytes_moved_;
  return s;
}

}  // namespace railyard
