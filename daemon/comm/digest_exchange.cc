#include "daemon/comm/digest_exchange.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/scheduler/tags.h"
#include "daemon/util/log.h"

namespace railyard {

namespace {

int LargestPow2AtMost(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

}  // namespace

DigestExchange::DigestExchange(Env env) : env_(std::move(env)) {
  if (env_.layout != nullptr && env_.layout->nnodes > 1) PlanStages();
}

int DigestExchange::MessagesPerOperation(int nodes, int me) {
  int sends = 0;
  for (const Stage& st : Plan(nodes, me)) sends += st.send ? 1 : 0;
  return sends;
}

std::vector<DigestExchange::Stage> DigestExchange::Plan(int nodes, int me) {
  std::vector<Stage> stages;
  if (nodes < 2) return stages;
  const int pow2 = LargestPow2AtMost(nodes);
  if (me >= pow2) {
    // An extra: its digest to its partner now, the final summary from it at the end.
    stages.push_back({me - pow2, true, false, Stage::Merge::kNone, -1});
    stages.push_back({me - pow2, false, true, Stage::Merge::kFinal, -1});
    return stages;
  }
  const int extra = me + pow2 < nodes ? me + pow2 : -1;
  if (extra >= 0) stages.push_back({extra, false, true, Stage::Merge::kFold, -1});
  for (int r = 0; (1 << r) < pow2; ++r) {
    const bool lower = (me & (1 << r)) == 0;
    stages.push_back(
        {me ^ (1 << r), true, true, lower ? Stage::Merge::kLower : Stage::Merge::kUpper, r});
  }
  if (extra >= 0) stages.push_back({extra, true, false, Stage::Merge::kNone, -1});
  return stages;
}

void DigestExchange::PlanStages() {
  const int nodes = env_.layout->nnodes;
  pow2_ = LargestPow2AtMost(nodes);
  stages_ = Plan(nodes, env_.my_node);
  recv_stage_.assign(static_cast<size_t>(nodes), -1);
  sends_ = recvs_ = 0;
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (stages_[i].recv) recv_stage_[stages_[i].partner] = static_cast<int>(i);
    sends_ += stages_[i].send ? 1 : 0;
    recvs_ += stages_[i].recv ? 1 : 0;
  }
  out_.resize(stages_.size());
  out_length_.assign(stages_.size(), 0);
  in_.resize(static_cast<size_t>(nodes));
}

bool DigestExchange::LeavesAtStart(int src, int dst) const {
  const int nodes = env_.layout->nnodes;
  if (src >= pow2_) return dst == src - pow2_;
  // A node below P with no extra sends its round 0 at once; one with an extra waits for it.
  return pow2_ >= 2 && src + pow2_ >= nodes && dst == (src ^ 1);
}

bool DigestExchange::InSendersGroup(int node, const Stage& stage) const {
  if (node < 0 || node >= env_.layout->nnodes) return false;
  switch (stage.merge) {
    case Stage::Merge::kFold:
      return node == stage.partner;
    case Stage::Merge::kLower:
    case Stage::Merge::kUpper: {
      // The sender's group in round r: the nodes below P that agree with it above bit r, and
      // their extras.
      const int core = node >= pow2_ ? node - pow2_ : node;
      return (core >> stage.round) == (stage.partner >> stage.round);
    }
    case Stage::Merge::kFinal:
      return true;
    case Stage::Merge::kNone:
      break;
  }
  return false;
}

std::string DigestExchange::NodeName(int node) const {
  return env_.node_names != nullptr && node >= 0 &&
                 static_cast<size_t>(node) < env_.node_names->size()
             ? (*env_.node_names)[node]
             : absl::StrCat("node ", node);
}

std::vector<int> DigestExchange::RanksOf(int node) const {
  const auto& ranks = env_.layout->ranks_of_node;
  return node >= 0 && static_cast<size_t>(node) < ranks.size() ? ranks[node] : std::vector<int>();
}

void DigestExchange::Prepare(const OpDigest& mine,
                             std::shared_ptr<const scheduler::NodeSchedule> schedule, bool gated) {
  mine_ = mine;
  schedule_ = std::move(schedule);
  gated_ = gated;
  // The schedule's first message to and from a peer (step tag 0: Project numbers each node
  // pair's messages from 0) rides in the exchange's message between them when that one leaves
  // as the run starts, is small and is on the digest's rail; a send only when it depends on
  // nothing. The receiver tells from the length whether it did (NodeRun::Carried).
  if (carried_for_ != schedule_) PickCarriedSteps();
  carried_gated_.clear();
  if (gated_) {
    for (uint32_t step : carried_) {
      if (schedule_->steps[step].kind != scheduler::NodeStep::Kind::kSend) {
        carried_gated_.push_back(step);
      }
    }
  }
}

const std::vector<uint32_t>* DigestExchange::carried() const {
  if (peers() == 0) return nullptr;
  return gated_ ? &carried_gated_ : &carried_;
}

void DigestExchange::PickCarriedSteps() {
  const int nodes = env_.layout->nnodes, me = env_.my_node;
  carried_for_ = schedule_;
  carried_send_.assign(static_cast<size_t>(nodes), -1);
  carried_recv_.assign(static_cast<size_t>(nodes), -1);
  carried_.clear();
  if (nodes < 2) return;
  const auto& steps = schedule_->steps;
  for (uint32_t i = 0; i < steps.size(); ++i) {
    const scheduler::NodeStep& s = steps[i];
    const bool send = s.kind == scheduler::NodeStep::Kind::kSend;
    if ((!send && s.kind != scheduler::NodeStep::Kind::kRecv) || s.tag != 0 || s.rail != 0 ||
        s.bytes == 0 || s.bytes > OpDigest::kMaxCarriedBytes || s.peer < 0 || s.peer >= nodes ||
        s.peer == me || (send && !s.deps.empty()) ||
        !(send ? LeavesAtStart(me, s.peer) : LeavesAtStart(s.peer, me))) {
      continue;
    }
    (send ? carried_send_ : carried_recv_)[s.peer] = i;
    carried_.push_back(i);
  }
}

void DigestExchange::Arm() {
  absl::MutexLock lock(&mu_);
  run_status_ = absl::OkStatus();
  verdict_ = absl::OkStatus();
  stage_ = 0;
  received_.assign(stages_.size(), DigestSummary());
  arrived_.assign(stages_.size(), false);
  out_length_.assign(stages_.size(), 0);
  summary_ = DigestSummary::Of(env_.my_node, mine_);
  digest_parts_ = sends_ + recvs_;
  parts_.store(1 + sends_ + recvs_);
}

transport::Endpoint* DigestExchange::EndpointTo(int node) const {
  if (env_.endpoints == nullptr || static_cast<size_t>(node) >= env_.endpoints->size() ||
      (*env_.endpoints)[node].empty() || env_.node_slots == nullptr ||
      static_cast<size_t>(node) >= env_.node_slots->size() ||
      static_cast<size_t>(env_.my_node) >= env_.node_slots->size()) {
    return nullptr;
  }
  return (*env_.endpoints)[node][0].get();
}

void DigestExchange::Exchange(const scheduler::RankMemory& memory) {
  memory_ = &memory;
  const int me = env_.my_node;
  const uint64_t seq = mine_.seq;
  // Every receive first (a message then never waits as unexpected), then what can be sent now.
  for (const Stage& stage : stages_) {
    if (!stage.recv) continue;
    const int n = stage.partner;
    transport::Endpoint* ep = EndpointTo(n);
    if (ep == nullptr) {
      OnPeerMessage(n, absl::InternalError(absl::StrCat("no endpoint to node ", n)), 0);
      continue;
    }
    // Room for whatever a peer may carry, whether or not this node expects it: a longer message
    // would be dropped as foreign, and a disagreement would then wait for its deadline.
    const transport::Segment in{in_[n].data(), in_[n].size()};
    ep->RecvV(scheduler::tags::CollectiveTag((*env_.node_slots)[me], n, seq,
                                             scheduler::tags::kDigestStep),
              &in, 1, [this, n](absl::Status st, size_t length) { OnPeerMessage(n, st, length); });
  }
  Drive();
}

void DigestExchange::Drive() {
  std::vector<size_t> sends;
  bool finished = false, invalid = false;
  absl::Status verdict;
  {
    absl::MutexLock lock(&mu_);
    while (stage_ < stages_.size()) {
      const Stage& st = stages_[stage_];
      if (st.send && out_length_[stage_] == 0) {
        out_length_[stage_] = summary_.Encode(&out_[stage_]);
        sends.push_back(stage_);
      }
      if (st.recv) {
        if (!arrived_[stage_]) break;
        const DigestSummary& got = received_[stage_];
        switch (st.merge) {
          case Stage::Merge::kFold:
          case Stage::Merge::kLower:
            summary_ = DigestSummary::Merge(summary_, got);
            break;
          case Stage::Merge::kUpper:
            summary_ = DigestSummary::Merge(got, summary_);
            break;
          case Stage::Merge::kFinal:
          case Stage::Merge::kNone:
            summary_ = got;
            break;
        }
      }
      if (++stage_ == stages_.size()) finished = true;
    }
    if (finished) {
      verdict = summary_.Verdict(
          mine_.seq, env_.my_node, [this](int n) { return NodeName(n); },
          [this](int n) { return RanksOf(n); });
      invalid = summary_.invalid();
      if (invalid) {
        verdict_ = verdict;
      } else if (!verdict.ok() && run_status_.ok()) {
        run_status_ = verdict;
      }
    }
  }
  if (invalid) {
    Log(LogLevel::kWarning, "comm", "operation digests disagree",
        {F("comm", env_.comm_id), F("job", env_.job), F("reason", verdict.message())});
  }
  for (size_t s : sends) Send(s);
}

void DigestExchange::Send(size_t stage) {
  const int me = env_.my_node, n = stages_[stage].partner;
  const int64_t carried = gated_ || !LeavesAtStart(me, n) ? -1 : carried_send_[n];
  transport::Endpoint* ep = EndpointTo(n);
  if (ep == nullptr) {
    const absl::Status s = absl::InternalError(absl::StrCat("no endpoint to node ", n));
    if (carried >= 0) env_.run->Carried(static_cast<uint32_t>(carried), s);
    DigestPartDone(s);
    return;
  }
  transport::Segment out[2] = {{out_[stage].data(), out_length_[stage]}, {}};
  if (carried >= 0) {
    const scheduler::NodeStep& s = schedule_->steps[carried];
    out[1] = {scheduler::Resolve(*memory_, s.src), s.bytes};
  }
  ep->SendV(scheduler::tags::CollectiveTag((*env_.node_slots)[n], me, mine_.seq,
                                           scheduler::tags::kDigestStep),
            out, carried >= 0 ? 2 : 1, [this, carried](absl::Status st) {
              if (carried >= 0) env_.run->Carried(static_cast<uint32_t>(carried), st);
              DigestPartDone(st);
            });
}

void DigestExchange::OnPeerMessage(int node, const absl::Status& status, size_t length) {
  const int me = env_.my_node;
  const int stage = recv_stage_[node];
  const int64_t recv_step = carried_recv_.empty() ? -1 : carried_recv_[node];
  DigestSummary got;
  size_t carried = 0;
  absl::Status carried_status = status;
  if (!status.ok()) {
    got = DigestSummary::Missing(me, node, status);
  } else {
    absl::StatusOr<std::pair<DigestSummary, size_t>> decoded =
        DigestSummary::Decode(in_[node].data(), length, env_.layout->nnodes);
    std::string why;
    if (!decoded.ok()) {
      why = std::string(decoded.status().message());
    } else {
      carried = length - decoded->second;
      if (!InSendersGroup(decoded->first.a, stages_[stage]) ||
          (decoded->first.b >= 0 && !InSendersGroup(decoded->first.b, stages_[stage]))) {
        why = "an operation digest naming a node it has not heard from";
      } else if (carried > 0 && recv_step < 0 &&
                 decoded->first.kind == DigestSummary::Kind::kAgree &&
                 decoded->first.da.Differs(mine_).empty()) {
        // Bytes this node does not expect from a peer that submitted the same operation. (From
        // one that did not, they are what its other size carries: the disagreement says it,
        // the same on both sides.)
        why = absl::StrCat(carried, " bytes with its operation digest, where ", NodeName(me),
                           " receives none");
      } else {
        if (recv_step < 0) carried = 0;
        got = std::move(decoded->first);
      }
    }
    if (!why.empty()) {
      got = DigestSummary::Unreadable(me, node, why);
      carried_status = absl::InvalidArgumentError(
          absl::StrCat("seq ", mine_.seq, ": ", NodeName(node), " sent ", why));
      carried = 0;
    }
  }
  if (recv_step >= 0) {
    env_.run->Carried(static_cast<uint32_t>(recv_step), carried_status,
                      in_[node].data() + (length - carried), carried);
  }
  {
    absl::MutexLock lock(&mu_);
    received_[stage] = std::move(got);
    arrived_[stage] = true;
  }
  Drive();
  DigestPartDone(status);
}

void DigestExchange::DigestPartDone(const absl::Status& status) {
  absl::Status abort;
  {
    absl::MutexLock lock(&mu_);
    // Once this node's messages of the exchange have all gone and come, a disagreement fails
    // the transfers: the schedules may wait for messages the other side never sends.
    if (--digest_parts_ == 0 && !verdict_.ok()) abort = verdict_;
  }
  if (!abort.ok()) env_.abort_transfers(abort);
  PartDone(status);
}

void DigestExchange::PartDone(const absl::Status& status) {
  absl::Status final_status;
  {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && run_status_.ok()) run_status_ = status;
    if (parts_.fetch_sub(1) != 1) return;
    final_status = !verdict_.ok() ? verdict_ : run_status_;
  }
  // The last part, on the thread that finished it, like NodeRun's own completion.
  env_.done(final_status);
}

}  // namespace railyard
