#include "daemon/comm/digest_exchange.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/scheduler/tags.h"
#include "daemon/util/log.h"

namespace railyard {

DigestExchange::DigestExchange(Env env) : env_(std::move(env)) {}

std::string DigestExchange::NodeName(int node) const {
  return env_.node_names != nullptr && node >= 0 &&
                 static_cast<size_t>(node) < env_.node_names->size()
             ? (*env_.node_names)[node]
             : absl::StrCat("node ", node);
}

void DigestExchange::Prepare(const OpDigest& mine,
                             std::shared_ptr<const scheduler::NodeSchedule> schedule, bool gated) {
  mine_ = mine;
  out_ = mine_.Encode();
  in_.resize(static_cast<size_t>(env_.layout->nnodes));
  schedule_ = std::move(schedule);
  gated_ = gated;
  // The schedule's first message to and from each peer (step tag 0: Project numbers each node
  // pair's messages from 0) rides in the digest when it is small and on the digest's rail; a
  // send only when it depends on nothing, as it leaves with the digest when the run starts. The
  // receiver tells from the length whether it did (NodeRun::Carried).
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
  const int nodes = env_.layout->nnodes;
  carried_for_ = schedule_;
  carried_send_.assign(static_cast<size_t>(nodes), -1);
  carried_recv_.assign(static_cast<size_t>(nodes), -1);
  carried_.clear();
  const auto& steps = schedule_->steps;
  for (uint32_t i = 0; i < steps.size(); ++i) {
    const scheduler::NodeStep& s = steps[i];
    const bool send = s.kind == scheduler::NodeStep::Kind::kSend;
    if ((!send && s.kind != scheduler::NodeStep::Kind::kRecv) || s.tag != 0 || s.rail != 0 ||
        s.bytes == 0 || s.bytes > OpDigest::kMaxCarriedBytes || s.peer < 0 || s.peer >= nodes ||
        s.peer == env_.my_node || (send && !s.deps.empty())) {
      continue;
    }
    (send ? carried_send_ : carried_recv_)[s.peer] = i;
    carried_.push_back(i);
  }
}

void DigestExchange::Arm() {
  {
    absl::MutexLock lock(&mu_);
    run_status_ = absl::OkStatus();
    verdict_ = absl::OkStatus();
  }
  parts_.store(1 + 2 * peers());
}

void DigestExchange::Exchange(const scheduler::RankMemory& memory) {
  const int me = env_.my_node;
  const uint64_t seq = mine_.seq;
  for (int n = 0; n < env_.layout->nnodes; ++n) {
    if (n == me) continue;
    transport::Endpoint* ep = env_.endpoints != nullptr &&
                                      static_cast<size_t>(n) < env_.endpoints->size() &&
                                      !(*env_.endpoints)[n].empty()
                                  ? (*env_.endpoints)[n][0].get()
                                  : nullptr;
    const int64_t send_step = gated_ ? -1 : carried_send_[n];
    const int64_t recv_step = carried_recv_[n];
    if (ep == nullptr || env_.node_slots == nullptr ||
        static_cast<size_t>(n) >= env_.node_slots->size()) {
      const absl::Status s = absl::InternalError(absl::StrCat("no endpoint to node ", n));
      if (send_step >= 0) env_.run->Carried(static_cast<uint32_t>(send_step), s);
      if (recv_step >= 0) env_.run->Carried(static_cast<uint32_t>(recv_step), s);
      PartDone(s);
      PartDone(s);
      continue;
    }
    const std::vector<uint16_t>& slots = *env_.node_slots;
    // Room for whatever a peer may carry, whether or not this node expects it: a longer message
    // would be dropped as foreign, and a disagreement would then wait for its deadline.
    const transport::Segment in{in_[n].data(), in_[n].size()};
    ep->RecvV(scheduler::tags::CollectiveTag(slots[me], n, seq, scheduler::tags::kDigestStep), &in,
              1, [this, n](absl::Status st, size_t length) { OnPeerDigest(n, st, length); });
    transport::Segment out[2] = {{out_.data(), OpDigest::kBytes}, {}};
    if (send_step >= 0) {
      const scheduler::NodeStep& s = schedule_->steps[send_step];
      out[1] = {scheduler::Resolve(memory, s.src), s.bytes};
    }
    ep->SendV(scheduler::tags::CollectiveTag(slots[n], me, seq, scheduler::tags::kDigestStep), out,
              send_step >= 0 ? 2 : 1, [this, send_step](absl::Status st) {
                if (send_step >= 0) env_.run->Carried(static_cast<uint32_t>(send_step), st);
                PartDone(st);
              });
  }
}

void DigestExchange::OnPeerDigest(int node, const absl::Status& status, size_t length) {
  absl::Status verdict;
  const int64_t recv_step = carried_recv_[node];
  const size_t carried = length > OpDigest::kBytes ? length - OpDigest::kBytes : 0;
  const uint64_t seq = mine_.seq;
  if (status.ok()) {
    const std::string peer = NodeName(node);
    const std::string me = NodeName(env_.my_node);
    OpDigest::Wire wire{};
    std::memcpy(wire.data(), in_[node].data(), std::min(length, OpDigest::kBytes));
    absl::StatusOr<OpDigest> theirs =
        length < OpDigest::kBytes
            ? absl::InvalidArgumentError(
                  absl::StrCat("a ", length, "-byte operation digest, not ", OpDigest::kBytes))
            : OpDigest::Decode(wire);
    if (!theirs.ok()) {
      verdict = absl::InvalidArgumentError(
          absl::StrCat("seq ", seq, ": ", peer, " sent ", theirs.status().message()));
    } else if (!mine_.Differs(*theirs).empty()) {
      const auto& ranks = env_.layout->ranks_of_node;
      const auto ranks_of = [&](int n) {
        return static_cast<size_t>(n) < ranks.size() ? ranks[n] : std::vector<int>();
      };
      verdict =
          DisagreementError(seq, me, ranks_of(env_.my_node), mine_, peer, ranks_of(node), *theirs);
    } else if (carried > 0 && recv_step < 0) {
      verdict = absl::InvalidArgumentError(absl::StrCat("seq ", seq, ": ", peer, " sent ", carried,
                                                        " bytes with its operation digest, where ",
                                                        me, " receives none"));
    }
  }
  if (!verdict.ok()) {
    {
      absl::MutexLock lock(&mu_);
      if (verdict_.ok()) verdict_ = verdict;
    }
    Log(LogLevel::kWarning, "comm", "operation digests disagree",
        {F("comm", env_.comm_id), F("job", env_.job), F("reason", verdict.message())});
    // The schedules may wait for messages the other side never sends: fail them now.
    env_.abort_transfers(verdict);
  }
  if (recv_step >= 0) {
    env_.run->Carried(static_cast<uint32_t>(recv_step), !verdict.ok() ? verdict : status,
                      in_[node].data() + OpDigest::kBytes, carried);
  }
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
